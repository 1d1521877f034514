"""serving: E4's HTTP server in the target, driven from the host by vegeta.

The server (tools/httpd, built on first use with vegeta: vmtax.helpers.serving_tools) has three
endpoints: `download` (GET SIZE deterministic bytes), `upload` (POST a body stored on the
target's disk, in its tmpfs, or discarded) and `transcode` (POST a 640x360 H.264 clip that
ffmpeg, carried into the target, scales down). It stays up for the cell; each repetition is
one run of vmtax.helpers.serving_client on the host, pinned apart from the target's CPUs:

- `rate`: per endpoint, constant-rate steps (an open model: a slow server cannot slow the
  arrivals), each held `duration` seconds, up to the first step that fails (success below
  `min_success`, p99 above `p99_bound` ms or above both `p99_factor` times the first
  step's p50 and `p99_floor` ms, or the generator itself the bottleneck); requests/s is
  the capacity, the last rate the server sustained.
- `workers`: per endpoint, `workers` workers send `requests` requests as fast as the
  server answers; requests/s is what they achieved.

Latencies are exact percentiles of every request vegeta timed (vmtax.helpers.serving_client says
why not vegeta's own estimates), per endpoint and offered rate. In rate mode `cross_check`
requests per endpoint are first timed with curl, one at a time; vegeta's p50 at the lowest rate
more than 10% away from curl's median raises a flag on the endpoint's capacity naming what
was measured to differ (curl's connection set-up, a generator-bound step, queueing, host
load, curl's own spread). A capacity from a sweep in which no step failed is only a lower
bound, flagged as `≥`. After the run the server counts the files uploads and transcodes
left in the target, which must be none.

Each step's "generator cpu" is the driver's own measure, for its "generator bound" flag;
the `generator` collector (plans/serving.toml enables it) records the client's CPU time
over the cell's measured repetitions.

Its figures replace the report's generic ones, which would scatter the latencies' endpoint
and rate over dozens of charts: p99 latency against the offered rate, a panel per endpoint,
each target's capacity ringed on its line; and requests/s per endpoint.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import sys
from typing import Annotated, Any, Literal

from pydantic import Field

from vmtax.core import paths, plugin
from vmtax.core.errors import ParseError
from vmtax.core.figures import Bars, Lines, Mark
from vmtax.core.option_types import Size
from vmtax.core.types import Endpoint, Job, Metric, MetricSpec
from vmtax.core.workload import LOWER_BOUND as BOUND_KIND
from vmtax.core.workload import Workload
from vmtax.helpers import go_toolchain, serving_client, serving_tools

PORT = 18080
EndpointName = Literal["download", "upload", "transcode"]
Rates = Annotated[list[Annotated[float, Field(gt=0, le=1e6)]], Field(min_length=1)]
_SHIFT = {"K": 10, "M": 20, "G": 30, "T": 40}
# What the server waits for before it listens; a guest under TCG starts it slowly.
SERVER_START_TIMEOUT = 60


# What one request costs natively, for estimates: ffmpeg's transcode per second of clip
# (measured: 0.98 s for the 2 s clip, libx264 ultrafast, at host load 9 on 2 cores), and a
# download's or upload's round trip and bytes.
TRANSCODE_SECONDS = 0.5
REQUEST_SECONDS = 0.005
MOVED_PER_SECOND = 200e6

def size_bytes(size: str) -> int:
    return int(size[:-1]) << _SHIFT[size[-1].upper()]


class ServingOptions(plugin.Options):
    mode: Literal["rate", "workers"] = plugin.option(
        "rate", "rate: a sweep of constant request rates per endpoint up to failure; "
        "workers: a fixed number of workers sending a fixed number of requests")
    endpoints: Annotated[list[EndpointName], Field(min_length=1)] = plugin.option(
        ["download", "upload", "transcode"], "The endpoints measured, one after another")
    duration: int = plugin.option(60, "Seconds each rate step is held (rate mode); the "
                                  "plan's time fills it", unit="s", ge=1, le=3600)
    download_rates: Rates = plugin.option(
        [200.0], "First offered rates of download's sweep", unit="requests/s")
    upload_rates: Rates = plugin.option(
        [50.0], "First offered rates of upload's sweep", unit="requests/s")
    transcode_rates: Rates = plugin.option(
        [1.0], "First offered rates of transcode's sweep", unit="requests/s")
    factor: float = plugin.option(
        2.0, "After the listed rates, each step offers the last rate times factor, until a "
        "step fails or there are `steps` (1: only the listed rates)", ge=1, le=100)
    steps: int = plugin.option(8, "Most rate steps per endpoint", unit="steps", ge=1,
                               le=100)
    min_success: float = plugin.option(0.99, "Smallest share of successful requests a step "
                                       "must have to count as sustained", gt=0, le=1)
    p99_factor: float = plugin.option(
        5.0, "A step fails when its p99 exceeds this many times the first step's p50 "
        "(and p99_floor)", ge=1, le=1e6)
    p99_floor: float = plugin.option(
        50.0, "p99 below this never fails a step: a fast endpoint's scheduling noise",
        unit="ms", ge=0)
    p99_bound: float | None = plugin.option(
        None, "A step fails when its p99 latency exceeds this", unit="ms", gt=0)
    workers: int = plugin.option(8, "Workers in workers mode", unit="workers", ge=1,
                                 le=4096)
    requests: int = plugin.option(200, "Requests per endpoint in workers mode",
                                  unit="requests", ge=1, le=10_000_000)
    download_size: Size = plugin.option("1M", "Bytes one download returns")
    upload_size: Size = plugin.option("1M", "Bytes one upload sends")
    upload_to: Literal["disk", "tmp", "discard"] = plugin.option(
        "disk", "Where the server puts an upload: the target's disk, its tmpfs, nowhere")
    max_body: Size = plugin.option("64M", "Largest request body the server takes (413 "
                                   "above)")
    clip_seconds: int = plugin.option(2, "Length of the 640x360 H.264 clip transcode "
                                      "posts", unit="s", ge=1, le=60)
    request_timeout: int = plugin.option(30, "Seconds vegeta waits for one answer",
                                         unit="s", ge=1, le=600)
    cross_check: int = plugin.option(
        7, "Rate mode: requests per endpoint timed with curl one at a time before its sweep "
        "(after one that opens the connection), whose median is set beside vegeta's p50 at "
        "the lowest rate (0: none)", unit="requests", ge=0, le=100)

    def problems(self) -> list[tuple[str, str]]:
        if "upload" in self.endpoints and size_bytes(self.upload_size) > size_bytes(
                self.max_body):
            return [("upload_size", f"at most max_body ({self.max_body}): a larger upload "
                     "only measures 413 answers")]
        return []


_STEP = ("endpoint", "rate")
# A capacity no failing step bounded: what the server sustained, not its limit.
# A flag is "KIND: detail": the terminal counts cells per kind, the report shows it whole.
LOWER_BOUND = BOUND_KIND + ": ≥ {:g}/s, no step failed"
CURL_GAP = "p50 differs from curl's by > 10%"


def _medians(reps: list[list[Metric]]) -> dict[str, float]:
    """Each metric's median over the repetitions that have it."""
    values: dict[str, list[float]] = {}
    for metrics in reps:
        for m in metrics:
            values.setdefault(m.key, []).append(m.value)
    return {key: statistics.median(v) for key, v in values.items()}


def _flags(endpoint: str, medians: dict[str, float]) -> list[str]:
    """The flags the medians of an endpoint's metrics raise on its capacity."""
    flags = []
    capacity = medians.get(f"requests/s[endpoint={endpoint}]")
    found = medians.get(f"capacity found[endpoint={endpoint}]")
    if found is not None and found < 0.5 and capacity is not None:
        flags.append(LOWER_BOUND.format(capacity))
    curl = medians.get(f"curl p50 latency[endpoint={endpoint}]")
    rates = [float(key.rsplit("rate=", 1)[1].rstrip("]")) for key in medians
             if key.startswith(f"p50 latency[endpoint={endpoint},rate=")]
    if curl is None or not rates:
        return flags
    step = f"endpoint={endpoint},rate={min(rates):g}"
    vegeta = medians.get(f"p50 latency[{step}]", 0.0)
    causes = serving_client.explain_gap(
        vegeta_p50=vegeta, rate=min(rates), curl_p50=curl,
        generator_bound=medians.get(f"generator bound[{step}]", 0.0) >= 0.5,
        step_busy=medians.get(f"host busy[{step}]", 0.0),
        connect=medians.get(f"curl connect[endpoint={endpoint}]", 0.0),
        spread=medians.get(f"curl spread[endpoint={endpoint}]", 0.0),
        curl_busy=medians.get(f"curl host busy[endpoint={endpoint}]", 0.0))
    if causes:
        flags.append(f"{CURL_GAP}: {serving_client.gap(vegeta, curl):+.0f}% ({vegeta:.3g} vs "
                     f"{curl:.3g} ms at {min(rates):g}/s): " + "; ".join(causes))
    return flags


HTTPD = str(serving_tools.httpd_path())   # the server, built on first use


class Serving(Workload):
    name = "serving"
    description = ("HTTP server in the target (download, upload, transcode) driven by "
                   "vegeta on the host: p99 latency per offered rate up to failure, or "
                   "requests/s of a fixed number of workers")
    Options = ServingOptions
    options: ServingOptions
    binaries = ("ffmpeg", HTTPD)
    # curl: the cross-check, on the host
    packages = ("ffmpeg", "golang-go", "curl")
    time_option = "duration"
    server_port = PORT

    @classmethod
    def built_on_first_use(cls) -> dict[str, tuple[bool, str]]:
        return {HTTPD: serving_tools.how_built()}
    metrics = (
        MetricSpec("requests/s", "requests/s", True, "Rate mode: the capacity, the highest "
                   "offered rate the server sustained; workers mode: the rate the workers "
                   "achieved", group="network", primary=True, dimensions=("endpoint",)),
        MetricSpec("p50 latency", "ms", False, "Median latency (vegeta's)", dimensions=_STEP),
        MetricSpec("p90 latency", "ms", False, "90th percentile latency", dimensions=_STEP),
        MetricSpec("p99 latency", "ms", False, "99th percentile latency", dimensions=_STEP),
        MetricSpec("p99.9 latency", "ms", False, "99.9th percentile latency (the slowest "
                   "request when a step has fewer than 1,000)", secondary=True,
                   dimensions=_STEP),
        MetricSpec("max latency", "ms", False, "Slowest request", secondary=True,
                   dimensions=_STEP),
        MetricSpec("success", "%", True, "Requests answered 2xx/3xx in time",
                   dimensions=_STEP),
        MetricSpec("achieved rate", "requests/s", True, "Successful answers per second",
                   secondary=True, dimensions=_STEP),
        MetricSpec("generator cpu", "%", False, "CPU vegeta used, % of one CPU",
                   secondary=True, dimensions=_STEP),
        MetricSpec("generator bound", "flag", False, "1: vegeta, not the server, limited the "
                   "step (it sent less than offered, or its CPUs were busy)", secondary=True,
                   dimensions=_STEP),
        MetricSpec("host busy", "%", False, "Share of the host's CPU time busy during the "
                   "step (all CPUs, whoever used them)", secondary=True, dimensions=_STEP),
        MetricSpec("curl p50 latency", "ms", False, "Rate mode: median of the cross-check's "
                   "requests, timed by curl one at a time on one connection",
                   secondary=True, dimensions=("endpoint",)),
        MetricSpec("curl set-up", "ms", False, "What the first request took more than their "
                   "median: opening the connection, and whatever else a first request costs "
                   "(may be below 0)", secondary=True, spread=True, dimensions=("endpoint",)),
        MetricSpec("curl connect", "ms", False, "Median of their time_connect: 0 while the "
                   "connection is reused, as vegeta reuses its", secondary=True,
                   dimensions=("endpoint",)),
        MetricSpec("curl spread", "%", False, "Their range (slowest - fastest), % of their "
                   "median", secondary=True, dimensions=("endpoint",)),
        MetricSpec("curl host busy", "%", False, "Share of the host's CPU time busy while "
                   "curl timed them", secondary=True, dimensions=("endpoint",)),
        MetricSpec("curl gap", "%", False, "vegeta's p50 at the lowest rate relative to "
                   "curl's median (+: vegeta slower)", secondary=True, spread=True,
                   dimensions=("endpoint",)),
        MetricSpec("capacity found", "flag", True, "Rate mode: 1 when a step failed, so "
                   "requests/s is the server's limit; 0 when the sweep ran out of steps "
                   "first, so the server sustains at least that", secondary=True,
                   dimensions=("endpoint",)),
        MetricSpec("files left", "files", False, "Files uploads and transcodes left in the "
                   "target after the run (must be 0)", secondary=True),
    )
    figures = (
        Lines("p99-vs-rate", "p99 latency vs offered rate",
              "p99 latency of each rate step (exact, of every request vegeta timed), median "
              "over the measured runs with its confidence interval; a sweep ends at its "
              "first failing step. The ringed point is the capacity, the last rate sustained "
              "before a step failed; a point marked ▷ ≥ is only a lower bound: no step "
              "failed, so the server sustained the highest offered rate and its capacity is "
              "that or more.",
              metric="p99 latency", x="rate", x_label="offered rate (requests/s)",
              panels="endpoint", log_x=True, log_y=True,
              mark=Mark("requests/s", "capacity", bound="capacity found",
                        bound_label="capacity ≥\n(no step failed)")),
        Bars("requests", "requests/s per endpoint",
             "Median requests/s over the measured runs, whiskers its confidence interval: in "
             "rate mode the capacity (the last offered rate the server sustained), in "
             "workers mode what the workers achieved. ↑ higher is better.",
             metric="requests/s", groups="endpoint"),
    )

    # -- what it needs from the host -------------------------------------------------------

    def host_problems(self) -> list[tuple[str, str]]:
        problems = []
        if not serving_tools.built() and go_toolchain.bootstrap_go() is None:
            problems.append(("endpoints", "Go to build its server and vegeta on first use "
                             f"({go_toolchain.INSTALL})"))
        if shutil.which("ffmpeg") is None:
            problems.append(("endpoints", "ffmpeg installed (apt-get install ffmpeg)"))
        if (self.options.mode == "rate" and self.options.cross_check
                and shutil.which("curl") is None):
            problems.append(("cross_check", "curl installed (apt-get install curl), or 0"))
        return problems

    def build_on_host(self) -> None:
        serving_tools.build()   # the server and vegeta, a minute or two the first time

    # -- cost ------------------------------------------------------------------------------

    def _rates(self, endpoint: str) -> list[float]:
        listed = getattr(self.options, f"{endpoint}_rates")
        return serving_client.sweep(listed, self.options.factor, self.options.steps)

    def run_seconds(self) -> float | None:
        steps = (0 if self.options.mode == "workers" else
                 sum(len(self._rates(e)) for e in self.options.endpoints))
        return steps * self.options.duration + self.work_seconds()

    def work_seconds(self) -> float:
        """What no step's time bounds: the curl requests timed one at a time before a rate
        sweep, and the workers' requests, each as long as its endpoint's work."""
        o = self.options
        if o.mode == "workers":
            return sum(math.ceil(o.requests / o.workers) * self._request_seconds(e)
                       for e in o.endpoints)
        return sum((o.cross_check + 1) * self._request_seconds(e) for e in o.endpoints)

    def _request_seconds(self, endpoint: str) -> float:
        """One request's work at native speed: a transcode is ffmpeg's, the others move
        their body."""
        if endpoint == "transcode":
            return self.options.clip_seconds * TRANSCODE_SECONDS
        size = self.options.download_size if endpoint == "download" else self.options.upload_size
        return REQUEST_SECONDS + size_bytes(size) / MOVED_PER_SECOND

    # -- the jobs --------------------------------------------------------------------------

    def server_job(self) -> Job:
        o = self.options
        # Every address of the target, unless the target names one (the bare host: loopback);
        # scratch files in the target's memory directory if it names one (the bare host:
        # one it journaled), else in one the server makes in the target's /dev/shm.
        memory = '${VMTAX_MEMORY_DIR:+-tmp "$VMTAX_MEMORY_DIR"}'
        argv = ["busybox", "sh", "-c",
                f'exec "$@" {memory} -listen "${{VMTAX_LISTEN:-}}:{PORT}"',
                "httpd", str(serving_tools.httpd_path()), "-disk", "uploads",
                "-max-body", str(size_bytes(o.max_body)),
                "-max-download", str(size_bytes(o.download_size))]
        ffmpeg = shutil.which("ffmpeg")
        if ffmpeg:   # carried into the target at the host's path
            argv += ["-ffmpeg", ffmpeg]
        # Uploads to disk go under the target's scratch directory, on a real disk.
        return Job(argv, timeout=SERVER_START_TIMEOUT, in_scratch=True)

    def _endpoint(self, name: str) -> dict[str, Any]:
        o = self.options
        spec: dict[str, Any]
        if name == "download":
            spec = {"method": "GET", "path": f"/download/{size_bytes(o.download_size)}"}
        elif name == "upload":
            spec = {"method": "POST", "path": f"/upload?to={o.upload_to}",
                    "body_size": size_bytes(o.upload_size)}
        else:
            spec = {"method": "POST", "path": "/transcode",
                    "body": str(serving_tools.clip(o.clip_seconds))}
        return {"name": name, "rates": getattr(o, f"{name}_rates"), **spec}

    def client_spec(self, endpoint: Endpoint) -> dict[str, Any]:
        o = self.options
        return {"vegeta": str(serving_tools.vegeta_path()),
                "base": f"http://{endpoint.address}:{endpoint.port}", "mode": o.mode,
                "endpoints": [self._endpoint(e) for e in o.endpoints],
                "duration": o.duration, "factor": o.factor, "steps": o.steps,
                "min_success": o.min_success, "p99_factor": o.p99_factor, "p99_floor": o.p99_floor,
                "p99_bound": o.p99_bound, "workers": o.workers, "requests": o.requests,
                "request_timeout": o.request_timeout,
                "cross_check": o.cross_check if o.mode == "rate" else 0}

    def client_job(self, endpoint: Endpoint) -> Job:
        o = self.options
        if o.mode == "rate":
            # Every step may wait a request timeout for its last answers after its duration.
            steps = sum(len(self._rates(e)) for e in o.endpoints)
            timeout = (steps * (o.duration + o.request_timeout + 30) + 60
                       + len(o.endpoints) * ((o.cross_check + 1) * (o.request_timeout + 1)
                                             + 30))
        else:
            timeout = len(o.endpoints) * (
                math.ceil(o.requests / o.workers) * o.request_timeout + 90)
        # The client journals its scratch directory: in vmtax's own runtime directory.
        return Job([sys.executable, "-m", "vmtax.helpers.serving_client",
                    json.dumps(self.client_spec(endpoint))], timeout=timeout,
                   env=paths.runtime_env())

    # -- the parser ------------------------------------------------------------------------

    def _cross_check(self, checks: list[dict[str, Any]],
                     steps: list[dict[str, Any]]) -> list[Metric]:
        metrics = []
        for check in checks:
            name = check["endpoint"]
            metrics += [self.metric("curl p50 latency", check["p50"], endpoint=name),
                        self.metric("curl set-up", check["setup"], endpoint=name),
                        self.metric("curl connect", check["connect"], endpoint=name),
                        self.metric("curl spread", check["spread"], endpoint=name),
                        self.metric("curl host busy", check["host_busy"], endpoint=name)]
            lowest = min((s for s in steps if s["endpoint"] == name),
                         key=lambda s: s["rate"], default=None)
            if lowest is not None:
                metrics.append(self.metric("curl gap", serving_client.gap(
                    lowest["p50"], check["p50"]), endpoint=name))
        return metrics

    @classmethod
    def cell_flags(cls, metric_key: str, reps: list[list[Metric]]) -> list[str]:
        """On an endpoint's capacity (analysis asks, with each successful repetition's
        metrics): `≥` when no step of the sweep failed, and why vegeta's p50 at the lowest
        rate is more than 10% from curl's median; of the medians over the repetitions, as
        the report shows them."""
        endpoint = metric_key.removeprefix("requests/s[endpoint=").removesuffix("]")
        if endpoint == metric_key or not reps:
            return []
        return _flags(endpoint, _medians(reps))

    def parse(self, stdout: str) -> list[Metric]:
        try:
            report = json.loads(stdout)
            steps = report["steps"]
            metrics = []
            for step in steps:
                dims = {"endpoint": step["endpoint"]}
                if step["rate"] is not None:
                    dims["rate"] = f"{step['rate']:g}"
                metrics += [self.metric(f"{p} latency", step[p], **dims)
                            for p in serving_client.PERCENTILES]
                metrics += [
                    self.metric("success", 100.0 * step["success"], **dims),
                    self.metric("host busy", step["host_busy"], **dims),
                    self.metric("achieved rate", step["throughput"], **dims),
                    self.metric("generator cpu", step["generator_cpu"], **dims),
                    self.metric("generator bound", float(step["generator_bound"]), **dims)]
                if step["rate"] is None:
                    metrics.append(self.metric("requests/s", step["throughput"],
                                               endpoint=step["endpoint"]))
            metrics += [self.metric("requests/s", rate, endpoint=name)
                        for name, rate in report["capacity"].items()]
            metrics += [self.metric("capacity found", float(found), endpoint=name)
                        for name, found in report["limited"].items()]
            metrics += self._cross_check(report.get("cross_check", []), steps)
            metrics.append(self.metric("files left", report["files_left"]))
        except json.JSONDecodeError as exc:
            raise ParseError(f"serving client printed no JSON ({exc.msg})") from None
        except (KeyError, TypeError) as exc:
            raise ParseError(f"serving client's report lacks {exc}") from None
        except ValueError as exc:   # a number json cannot convert (over 4,300 digits)
            raise ParseError(f"serving client's report has an unusable value: "
                             f"{str(exc)[:100]}") from None
        if not steps:
            raise ParseError("serving client measured no step")
        return metrics
