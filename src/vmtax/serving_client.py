"""The host side of the `serving` workload: vegeta, run step by step against one server.

The runner runs this as the workload's client job (`python -m vmtax.serving_client SPEC`),
pinned to host CPUs apart from the target's. In `rate` mode each endpoint gets a sweep of
constant-rate steps (vegeta's open model: arrivals do not wait for answers), stopped at
the first step that fails; in `workers` mode N workers send M requests as fast as the
server answers. Each step is one `vegeta attack`, summarised by `vegeta report`; the
generator's own CPU time is measured around it, so a step that the generator rather than
the server limited is flagged. Prints one JSON document, which the workload parses.
"""

from __future__ import annotations

import json
import os
import random
import resource
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from vmtax import proc
from vmtax.errors import VmtaxError
from vmtax.journal import Journal

# A step is generator-bound when vegeta sent less than this share of the offered rate, or
# used this share of the CPUs it may run on: then the server was not what was measured.
SENT_SHARE = 0.95
CPU_SHARE = 0.9
MIN_RATED = 10
# vegeta's error when a lazy attack has sent every target (lib.ErrNoTargets).
NO_TARGETS = "no targets to attack"


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


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _vegeta(argv: list[str], timeout: float) -> str:
    done = proc.run(argv, timeout=timeout)
    if done.exit_code != 0:
        why = "timed out" if done.timed_out else f"exit code {done.exit_code}"
        raise VmtaxError(f"vegeta {argv[1]} {why}: {done.stderr.strip()[-300:]}")
    return done.stdout


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
    if endpoint.get("body_size"):
        body = scratch / f"body-{endpoint['name']}"
        if not body.exists():
            # Incompressible and the same every run.
            body.write_bytes(random.Random(0).randbytes(endpoint["body_size"]))
        argv += ["-body", str(body)]
    elif endpoint.get("body"):
        argv += ["-body", endpoint["body"]]
    if rate is not None:
        argv += ["-rate", rate_flag(rate), "-duration", f"{spec['duration']}s"]
        timeout = spec["duration"] + spec["request_timeout"] + 60
    else:
        # Lazy targets end the attack at the end of the file: exactly `count` requests.
        workers = str(spec["workers"])
        argv += ["-rate", "0", "-workers", workers, "-max-workers", workers, "-lazy"]
        timeout = spec["requests"] * spec["request_timeout"] + 60
    cpu, start = _cpu_seconds(), time.monotonic()
    _vegeta(argv, timeout)
    wall = time.monotonic() - start
    cpu = _cpu_seconds() - cpu
    if rate is None:
        results = _without_end_marker(spec["vegeta"], results)
    report = json.loads(_vegeta([spec["vegeta"], "report", "-type", "json", str(results)],
                                120))
    results.unlink()
    lat = report["latencies"]
    allowed = len(os.sched_getaffinity(0))
    step = {
        "endpoint": endpoint["name"], "rate": rate,
        "p50": lat["50th"] / 1e6, "p90": lat["90th"] / 1e6, "p99": lat["99th"] / 1e6,
        "max": lat["max"] / 1e6, "mean": lat["mean"] / 1e6,
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


def _without_end_marker(vegeta: str, results: Path) -> Path:
    """The results of a lazy attack without the one vegeta records when the targets run
    out: an error result that is no request, but would count as a failed one."""
    as_json = results.with_suffix(".json")
    _vegeta([vegeta, "encode", "--to", "json", "--output", str(as_json), str(results)], 120)
    results.unlink()
    with open(as_json) as src, open(results, "w") as dst:
        for line in src:
            if line.strip() and json.loads(line).get("error") != NO_TARGETS:
                dst.write(line)
    as_json.unlink()
    return results


def run(spec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"mode": spec["mode"], "steps": [], "capacity": {}, "limited": {}}
    # vegeta's results and the request bodies; journaled, so that a client killed at its
    # timeout leaves nothing once vmtax next starts (or `vmtax cleanup`).
    scratch = Path(tempfile.gettempdir()) / f"vmtax-serving-{os.getpid()}"
    journal = Journal()
    token = journal.add(type="rmtree", path=str(scratch))
    scratch.mkdir()
    try:
        for endpoint in spec["endpoints"]:
            if spec["mode"] == "workers":
                out["steps"].append(attack(spec, endpoint, scratch, rate=None))
                continue
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
    finally:
        journal.undo(token)
    out["files_left"] = files_left(spec["base"], spec["request_timeout"])
    return out


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
        print("usage: python -m vmtax.serving_client SPEC_JSON", file=sys.stderr)
        return 2
    try:
        print(json.dumps(run(json.loads(argv[1]))))
    except VmtaxError as exc:
        print(f"vmtax serving client: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
