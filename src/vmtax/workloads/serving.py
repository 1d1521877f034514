"""serving: E4's HTTP server in the target, driven from the host by vegeta.

The server (tools/httpd, built at set-up with vegeta: vmtax.serving_tools) has three
endpoints: `download` (GET SIZE deterministic bytes), `upload` (POST a body stored on the
target's disk, in its tmpfs, or discarded) and `transcode` (POST a 640x360 H.264 clip that
ffmpeg, carried into the target, scales down). It stays up for the cell; each repetition is
one run of vmtax.serving_client on the host, pinned apart from the target's CPUs:

- `rate`: per endpoint, constant-rate steps (an open model: a slow server cannot slow the
  arrivals), each held `duration` seconds, up to the first step that fails (success below
  `min_success`, p99 above `p99_bound` ms or above both `p99_factor` times the first
  step's p50 and `p99_floor` ms, or the generator itself the bottleneck); requests/s is
  the capacity, the last rate the server sustained.
- `workers`: per endpoint, `workers` workers send `requests` requests as fast as the
  server answers; requests/s is what they achieved.

Latencies are vegeta's own, per endpoint and offered rate. After the run the server counts
the files uploads and transcodes left in the target, which must be none.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from typing import Annotated, Any, Literal

from pydantic import Field

from vmtax import plugin, serving_client, serving_tools
from vmtax.errors import ParseError, VmtaxError
from vmtax.option_types import Size
from vmtax.types import Endpoint, Job, Metric, MetricSpec
from vmtax.workloads.base import Workload

PORT = 18080
EndpointName = Literal["download", "upload", "transcode"]
Rates = Annotated[list[Annotated[float, Field(gt=0, le=1e6)]], Field(min_length=1)]
_SHIFT = {"K": 10, "M": 20, "G": 30, "T": 40}
# What the server waits for before it listens; a guest under TCG starts it slowly.
SERVER_START_TIMEOUT = 60
NOT_BUILT = ("its server and vegeta built, which `make deps` does (python -m "
             "vmtax.serving_tools)")


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

    def problems(self) -> list[tuple[str, str]]:
        if "upload" in self.endpoints and size_bytes(self.upload_size) > size_bytes(
                self.max_body):
            return [("upload_size", f"at most max_body ({self.max_body}): a larger upload "
                     "only measures 413 answers")]
        return []


_STEP = ("endpoint", "rate")


class Serving(Workload):
    name = "serving"
    description = ("HTTP server in the target (download, upload, transcode) driven by "
                   "vegeta on the host: p99 latency per offered rate up to failure, or "
                   "requests/s of a fixed number of workers")
    Options = ServingOptions
    options: ServingOptions
    binaries = ("ffmpeg", str(serving_tools.httpd_path()))
    packages = ("ffmpeg", "golang-go")
    time_option = "duration"
    server_port = PORT
    metrics = (
        MetricSpec("requests/s", "requests/s", True, "Rate mode: the capacity, the highest "
                   "offered rate the server sustained; workers mode: the rate the workers "
                   "achieved", group="network", primary=True, dimensions=("endpoint",)),
        MetricSpec("p50 latency", "ms", False, "Median latency (vegeta's)", dimensions=_STEP),
        MetricSpec("p90 latency", "ms", False, "90th percentile latency", dimensions=_STEP),
        MetricSpec("p99 latency", "ms", False, "99th percentile latency", dimensions=_STEP),
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
        MetricSpec("capacity found", "flag", True, "Rate mode: 1 when a step failed, so "
                   "requests/s is the server's limit; 0 when the sweep ran out of steps "
                   "first, so the server sustains at least that", secondary=True,
                   dimensions=("endpoint",)),
        MetricSpec("files left", "files", False, "Files uploads and transcodes left in the "
                   "target after the run (must be 0)", secondary=True),
    )

    # -- what it needs from the host -------------------------------------------------------

    def host_problems(self) -> list[tuple[str, str]]:
        problems = []
        if not serving_tools.built():
            problems.append(("endpoints", NOT_BUILT))
        if shutil.which("ffmpeg") is None:
            problems.append(("endpoints", "ffmpeg installed (apt-get install ffmpeg)"))
        return problems

    # -- cost ------------------------------------------------------------------------------

    def _rates(self, endpoint: str) -> list[float]:
        listed = getattr(self.options, f"{endpoint}_rates")
        return serving_client.sweep(listed, self.options.factor, self.options.steps)

    def run_seconds(self) -> float | None:
        if self.options.mode == "workers":
            return None
        return float(sum(len(self._rates(e)) for e in self.options.endpoints)
                     * self.options.duration)

    # -- the jobs --------------------------------------------------------------------------

    def server_job(self) -> Job:
        if not serving_tools.built():   # a run without a plan file: no host check before
            raise VmtaxError(f"workload serving needs {NOT_BUILT}")
        o = self.options
        argv = [str(serving_tools.httpd_path()), "-listen", f":{PORT}", "-disk", "uploads",
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
                "request_timeout": o.request_timeout}

    def client_job(self, endpoint: Endpoint) -> Job:
        o = self.options
        if o.mode == "rate":
            # Every step may wait a request timeout for its last answers after its duration.
            steps = sum(len(self._rates(e)) for e in o.endpoints)
            timeout = steps * (o.duration + o.request_timeout + 30) + 60
        else:
            timeout = len(o.endpoints) * (
                math.ceil(o.requests / o.workers) * o.request_timeout + 90)
        return Job([sys.executable, "-m", "vmtax.serving_client",
                    json.dumps(self.client_spec(endpoint))], timeout=timeout)

    # -- the parser ------------------------------------------------------------------------

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
                            for p in ("p50", "p90", "p99", "max")]
                metrics += [
                    self.metric("success", 100.0 * step["success"], **dims),
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
