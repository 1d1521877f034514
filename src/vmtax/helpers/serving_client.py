"""The host side of the `serving` workload: vegeta, run step by step against one server.

The runner runs this as the workload's client job (`python -m vmtax.helpers.serving_client SPEC`),
pinned to host CPUs apart from the target's. In `rate` mode each endpoint gets a sweep of
constant-rate steps (vegeta's open model: arrivals do not wait for answers), stopped at
the first step that fails; in `workers` mode N workers send M requests as fast as the
server answers. Each step is one `vegeta attack`, summarised by `vegeta report`; the
generator's own CPU time is measured around it, so a step that the generator rather than
the server limited is flagged. Prints one JSON document, which the workload parses.

Latencies are exact order statistics of every request's latency, from the step's results
(`vegeta encode`), not `vegeta report`'s: in vegeta v12 both its quantiles and its
`-type=hdrplot` output come from one t-digest estimator (lib/metrics.go, compression
100), whose tail quantiles are interpolated between centroids. A percentile is the
nearest-rank one, as an HDR histogram reports it: the smallest latency at or above which
that share of requests lies; with fewer than 1,000 requests p99.9 is the slowest one.

Before a rate sweep, `cross_check` requests per endpoint are timed with curl (`-w
%{time_connect} %{time_total}`), one at a time at the lowest offered rate (at least 1/s),
on one connection as vegeta reuses its, after a first request that opens it (its extra
time is kept as the connection set-up); with the host's CPU load during them. The report
sets vegeta's p50 at the lowest rate beside curl's median and, when they differ by more
than 10%, says what was measured to differ (`explain_gap`).
"""

from __future__ import annotations

import json
import math
import os
import random
import resource
import shutil
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from vmtax.core.errors import VmtaxError
from vmtax.host import guardian, proc
from vmtax.host.journal import Journal

# A step is generator-bound when vegeta sent less than this share of the offered rate, or
# used this share of the CPUs it may run on: then the server was not what was measured.
SENT_SHARE = 0.95
CPU_SHARE = 0.9
MIN_RATED = 10
# vegeta's error when a lazy attack has sent every target (lib.ErrNoTargets).
NO_TARGETS = "no targets to attack"
# The percentiles of every step, by the name its metrics carry.
PERCENTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99, "p99.9": 0.999, "max": 1.0}
# vegeta's p50 and curl's median agree when within this share of curl's.
AGREE = 0.10
# Average requests in flight (offered rate × p50) from which a step queues requests.
IN_FLIGHT = 0.5
# curl's samples are noisy when their range exceeds this share of their median; host load
# differs when its busy share does by this many points.
SPREAD = 0.20
BUSY_POINTS = 20.0


def sweep(rates: list[float], factor: float, steps: int) -> list[float]:
    """The offered rates of a sweep: the listed ones, then the last one multiplied by
    factor until there are `steps` (factor 1: only the listed ones)."""
    out = list(rates)
    while factor > 1 and len(out) < steps:
        out.append(out[-1] * factor)
    return out


def rate_flag(rate: float) -> str:
    """vegeta's -rate: a whole number of requests per period (1.5/s is 1500/1000s)."""
    if rate == int(rate):
        return f"{int(rate)}/1s"
    return f"{round(rate * 1000)}/1000s"


def step_verdict(step: dict[str, Any], first_p50: float | None, spec: dict[str, Any]) -> str:
    """Why a step failed ("" when the server sustained it)."""
    if step["generator_bound"]:
        return "the generator, not the server, was the bottleneck"
    if step["success"] < spec["min_success"]:
        return f"success {step['success']:.1%} < {spec['min_success']:.0%}"
    if spec.get("p99_bound") is not None and step["p99"] > spec["p99_bound"]:
        return f"p99 {step['p99']:.3g} ms > {spec['p99_bound']:g} ms"
    if first_p50 is not None:
        bound = max(spec["p99_factor"] * first_p50, spec["p99_floor"])
        if step["p99"] > bound:
            return (f"p99 {step['p99']:.3g} ms > {bound:.3g} ms (the larger of "
                    f"{spec['p99_factor']:g} × the first step's p50 and "
                    f"{spec['p99_floor']:g} ms)")
    return ""


def quantile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank q-quantile of sorted values: the smallest value with at least a
    share q of them at or below it (HDR histograms report percentiles so)."""
    rank = max(math.ceil(q * len(sorted_values)), 1)
    return sorted_values[rank - 1]


def latencies(results: list[dict[str, Any]]) -> dict[str, float]:
    """p50 ... max (ms) of every request of a step, from its encoded results."""
    values = sorted(r["latency"] / 1e6 for r in results)
    if not values:
        raise VmtaxError("vegeta recorded no request")
    return {name: quantile(values, q) for name, q in PERCENTILES.items()}


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _vegeta(argv: list[str], timeout: float) -> str:
    done = proc.run(argv, timeout=timeout)
    if done.exit_code != 0:
        why = "timed out" if done.timed_out else f"exit code {done.exit_code}"
        raise VmtaxError(f"vegeta {argv[1]} {why}: {done.stderr.strip()[-300:]}")
    return done.stdout


def request_body(endpoint: dict[str, Any], scratch: Path) -> Path | None:
    """The file an endpoint's requests post, made in scratch if it is generated."""
    if endpoint.get("body_size"):
        body = scratch / f"body-{endpoint['name']}"
        if not body.exists():
            # Incompressible and the same every run.
            body.write_bytes(random.Random(0).randbytes(endpoint["body_size"]))
        return body
    return Path(endpoint["body"]) if endpoint.get("body") else None


def attack(spec: dict[str, Any], endpoint: dict[str, Any], scratch: Path, *,
           rate: float | None) -> dict[str, Any]:
    """One vegeta attack: at `rate` requests/s for the step duration, or (None) with
    spec's workers until its requests are sent; the step's summary."""
    url = spec["base"] + endpoint["path"]
    count = 1 if rate is not None else spec["requests"]
    targets = scratch / "targets"
    targets.write_text(f"{endpoint['method']} {url}\n\n" * count)
    results = scratch / "results.bin"
    argv = [spec["vegeta"], "attack", "-targets", str(targets), "-output", str(results),
            "-timeout", f"{spec['request_timeout']}s", "-max-body", "0",
            "-name", endpoint["name"]]
    body = request_body(endpoint, scratch)
    if body is not None:
        argv += ["-body", str(body)]
    if rate is not None:
        argv += ["-rate", rate_flag(rate), "-duration", f"{spec['duration']}s"]
        timeout = spec["duration"] + spec["request_timeout"] + 60
    else:
        # Lazy targets end the attack at the end of the file: exactly `count` requests.
        workers = str(spec["workers"])
        argv += ["-rate", "0", "-workers", workers, "-max-workers", workers, "-lazy"]
        timeout = spec["requests"] * spec["request_timeout"] + 60
    cpu, start, busy_at = _cpu_seconds(), time.monotonic(), host_busy()
    _vegeta(argv, timeout)
    wall = time.monotonic() - start
    cpu = _cpu_seconds() - cpu
    busy = busy_share(busy_at, host_busy())
    requests = _encoded(spec["vegeta"], results, lazy=rate is None)
    report = json.loads(_vegeta([spec["vegeta"], "report", "-type", "json", str(results)],
                                120))
    results.unlink()
    allowed = len(os.sched_getaffinity(0))
    step = {
        "endpoint": endpoint["name"], "rate": rate, **latencies(requests),
        "mean": report["latencies"]["mean"] / 1e6, "host_busy": busy,
        "requests": report["requests"], "success": report["success"],
        "sent_rate": report["rate"], "throughput": report["throughput"],
        "status_codes": report.get("status_codes") or {},
        "errors": (report.get("errors") or [])[:3],
        "generator_cpu": 100.0 * cpu / wall if wall > 0 else 0.0,
    }
    step["generator_bound"] = generator_bound(step, rate, allowed)
    return step


def generator_bound(step: dict[str, Any], rate: float | None, cpus: int) -> bool:
    """Did vegeta, not the server, limit the step: it used nearly all of its `cpus`, or
    sent requests slower than offered (it cannot wait for answers in an open model)?"""
    if step["generator_cpu"] >= 100.0 * CPU_SHARE * cpus:
        return True
    # A handful of requests gives no meaningful sending rate.
    return (rate is not None and step["requests"] >= MIN_RATED
            and step["sent_rate"] < SENT_SHARE * rate)


def _encoded(vegeta: str, results: Path, *, lazy: bool) -> list[dict[str, Any]]:
    """Every request of a step, as `vegeta encode --to json` gives them; results is
    rewritten with them (for `vegeta report`). A lazy attack's results lose the one vegeta
    records when the targets run out: an error result that is no request, but would count
    as a failed one."""
    as_json = results.with_suffix(".json")
    _vegeta([vegeta, "encode", "--to", "json", "--output", str(as_json), str(results)], 120)
    requests = []
    with open(as_json) as src, open(results, "w") as dst:
        for line in src:
            if not line.strip():
                continue
            result = json.loads(line)
            if lazy and result.get("error") == NO_TARGETS:
                continue
            requests.append(result)
            dst.write(line)
    as_json.unlink()
    return requests


# -- host load -------------------------------------------------------------------------------

def host_busy(stat: str = "/proc/stat") -> tuple[int, int]:
    """(busy, total) clock ticks of all the host's CPUs since boot."""
    with open(stat) as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    # idle and iowait are not busy; guest time is already in user and nice
    total = sum(ticks[:8])
    return total - ticks[3] - ticks[4], total


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """% of the host's CPU time that was busy between two readings."""
    total = after[1] - before[1]
    return 100.0 * (after[0] - before[0]) / total if total > 0 else 0.0


# -- the curl cross-check ------------------------------------------------------------------

def curl_rate(rate: float) -> str:
    """curl's --rate: the lowest offered rate, or 1/s if that is lower (the check stays
    short), in whole requests per hour."""
    return f"{round(max(rate, 1.0) * 3600)}/h"


def curl_argv(curl: str, endpoint: dict[str, Any], base: str, body: Path | None,
              timeout: int, count: int) -> list[str]:
    """count requests as vegeta sends them, timed by one curl on one connection (as
    vegeta reuses its), spaced at the endpoint's lowest offered rate: per request a line
    of connections opened, connect and total seconds, status."""
    argv = [curl, "-s", "--max-time", str(timeout), "--rate", curl_rate(min(endpoint["rates"])),
            "-w", "%{num_connects} %{time_connect} %{time_total} %{http_code}\\n",
            "-X", endpoint["method"],
            # vegeta sends no Expect: 100-continue, which costs curl a round trip
            "-H", "Expect:"]
    if body is not None:
        argv += ["--data-binary", f"@{body}"]
    return argv + ["-o", "/dev/null"] * count + [base + endpoint["path"]] * count


def cross_check(spec: dict[str, Any], endpoint: dict[str, Any], body: Path | None
                ) -> dict[str, Any]:
    """spec's `cross_check` requests timed by curl one at a time, after one that opens
    the connection (its extra time is the set-up, kept apart), with the host's CPU load
    meanwhile."""
    curl = shutil.which("curl")
    if curl is None:
        raise VmtaxError("the curl cross-check needs curl (apt-get install curl)")
    count = spec["cross_check"] + 1
    argv = curl_argv(curl, endpoint, spec["base"], body, spec["request_timeout"], count)
    busy_at = host_busy()
    done = proc.run(argv, timeout=count * (spec["request_timeout"] + 1) + 30)
    lines = [line.split() for line in done.stdout.splitlines()]
    if (done.exit_code != 0 or len(lines) != count
            or any(len(f) != 4 or not f[3].startswith("2") for f in lines)):
        raise VmtaxError(f"curl {endpoint['name']} failed (exit code {done.exit_code}, "
                         f"answers {' '.join(f[-1] for f in lines if f) or 'none'})")
    first, *rest = [(int(f[0]), 1000 * float(f[1]), 1000 * float(f[2])) for f in lines]
    total = [t for _, _, t in rest]
    p50 = quantile(sorted(total), 0.5)
    return {"endpoint": endpoint["name"], "samples": total, "p50": p50,
            # 0 unless the server closed connections: then curl opened them anew
            "connect": statistics.median(c for _, c, _ in rest),
            "reused": sum(n == 0 for n, _, _ in rest),
            "setup": first[2] - p50,
            "spread": 100.0 * (max(total) - min(total)) / p50 if p50 > 0 else 0.0,
            "host_busy": busy_share(busy_at, host_busy())}


def gap(vegeta_p50: float, curl_p50: float) -> float:
    """vegeta's p50 relative to curl's median, in % (+: vegeta slower)."""
    return 100.0 * (vegeta_p50 / curl_p50 - 1) if curl_p50 > 0 else 0.0


def explain_gap(*, vegeta_p50: float, rate: float, generator_bound: bool, step_busy: float,
                curl_p50: float, connect: float, spread: float, curl_busy: float) -> list[str]:
    """What was measured to tell vegeta's p50 at the lowest rate from curl's median, when
    they differ by more than AGREE ([] when they agree). spread: (max - min) / median of
    curl's samples, in %; *_busy: % of host CPU time busy during curl's and vegeta's."""
    if curl_p50 <= 0 or abs(vegeta_p50 - curl_p50) <= AGREE * curl_p50:
        return []
    causes = []
    alone = curl_p50 - connect
    if connect > 0 and abs(vegeta_p50 - alone) <= AGREE * alone:
        causes.append(f"curl's connect {connect:.3g} ms, vegeta reuses connections: "
                      f"without it {gap(vegeta_p50, alone):+.0f}%")
    elif connect >= AGREE * curl_p50:
        causes.append(f"curl's connect {connect:.3g} ms")
    if generator_bound:
        causes.append("generator-bound step")
    in_flight = rate * vegeta_p50 / 1000
    if in_flight >= IN_FLIGHT:
        causes.append(f"queueing: {in_flight:.2g} requests in flight")
    if abs(step_busy - curl_busy) >= BUSY_POINTS:
        causes.append(f"host load: {curl_busy:.0f}% busy during curl, {step_busy:.0f}% "
                      "in the step")
    if spread >= 100 * SPREAD or not causes:
        causes.append(f"noise: curl's samples spread {spread:.0f}%, host "
                      f"{max(curl_busy, step_busy):.0f}% busy")
    return causes


def run(spec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"mode": spec["mode"], "steps": [], "capacity": {}, "limited": {}}
    # vegeta's results and the request bodies: in vmtax's private runtime directory (the
    # runner passes VMTAX_RUNTIME), under a name no one can know beforehand, journaled and
    # guarded, so that a client killed (at its timeout, or with vmtax) leaves nothing.
    journal = Journal()
    with guardian.guard(journal.path):
        scratch, token = journal.make_dir(journal.dir, "vmtax-serving-")
        try:
            measure(spec, scratch, out)
        finally:
            journal.undo(token)
    out["files_left"] = files_left(spec["base"], spec["request_timeout"])
    return out


def measure(spec: dict[str, Any], scratch: Path, out: dict[str, Any]) -> None:
    """Every step of every endpoint, into out, with scratch for vegeta's files."""
    for endpoint in spec["endpoints"]:
        if spec["mode"] == "workers":
            out["steps"].append(attack(spec, endpoint, scratch, rate=None))
            continue
        if spec.get("cross_check"):
            check = cross_check(spec, endpoint, request_body(endpoint, scratch))
            out.setdefault("cross_check", []).append(check)
        sustained = 0.0
        first_p50 = None
        for rate in sweep(endpoint["rates"], spec["factor"], spec["steps"]):
            step = attack(spec, endpoint, scratch, rate=rate)
            step["failed"] = step_verdict(step, first_p50, spec)
            out["steps"].append(step)
            if step["failed"]:
                break
            sustained = rate
            first_p50 = first_p50 or step["p50"]
        out["capacity"][endpoint["name"]] = sustained
        # Without a failing step the capacity is only a lower bound.
        out["limited"][endpoint["name"]] = bool(out["steps"][-1]["failed"])


def files_left(base: str, timeout: float) -> int:
    """Files the server's uploads and transcodes left in the target (by its own count),
    once the requests vegeta gave up on have ended too (or after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(base + "/stored", timeout=timeout) as answer:
                count = int(json.load(answer)["files"])
        except (OSError, ValueError, KeyError) as exc:
            raise VmtaxError(f"asking the server what it left behind failed: {exc}") \
                from None
        if count == 0 or time.monotonic() > deadline:
            return count
        time.sleep(0.5)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m vmtax.helpers.serving_client SPEC_JSON", file=sys.stderr)
        return 2
    try:
        print(json.dumps(run(json.loads(argv[1]))))
    except VmtaxError as exc:
        print(f"vmtax serving client: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
