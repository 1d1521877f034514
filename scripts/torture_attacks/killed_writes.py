"""kill -9 while export and publish write (issue #45, defect 11): the moment a temporary
file shows beside the output (or at a random moment, when none ever shows), then `vmtax
cleanup`. No temporary file is left, an output is what it was or whole, and a site
published again afterwards is published."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from torture_kit.env import Env, Outcome, check_output
from torture_kit.registry import Attack
from torture_kit.stores import series_store


def _big_store(results: Path) -> None:
    """One run of 200 repetitions of 500 metrics: its CSV is ~20 MB, seconds to make and
    write."""
    from vmtax.core.types import Metric
    from vmtax.results.store import Store

    store = Store(results)
    run_id = store.new_run({"targets": [{"name": "native", "kind": "native"}]}, {}, "0")
    store.set_target(run_id, "native", "native", {"bare_host": True})
    for idx in range(200):
        store.add_rep(run_id, target="native", workload="cpu", params={}, phase="measure",
                      idx=idx, status="ok", argv=["x"], started=1.0,
                      metrics=[Metric(f"m{k}", float(k), "u", True) for k in range(500)])
    store.finish_run(run_id, "done")
    store.close()


def _temporaries(where: Path) -> list[Path]:
    return [p for p in where.rglob(".*") if p.name.endswith(".tmp")]


def _kill_while_writing(env: Env, outcome: Outcome, what: str, args: list[str],
                        where: Path) -> None:
    """Start vmtax with args; kill -9 it as a temporary file shows in where, or at a
    random moment of its first 10 seconds; then `vmtax cleanup`."""
    proc = env.start(*args)
    deadline = time.monotonic() + env.rng.uniform(0.5, 10.0)
    seen = False
    while proc.poll() is None and time.monotonic() < deadline:
        if _temporaries(where):
            seen = True
            break
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    outcome.cases += 1
    outcome.note("killed as a temporary file showed" if seen else "killed at a random moment")
    cleaned = env.run("cleanup")
    check_output(outcome, f"cleanup after {what}", cleaned.stderr)
    left = _temporaries(where)
    if left:
        outcome.fail(f"{what} killed -9, then cleanup: {left[0].name} is left")


def killed_writes(env: Env, outcome: Outcome, quick: bool) -> None:
    results = env.work / "killed-writes-r"
    _big_store(results)
    out = env.work / "killed-writes-out"
    out.mkdir()
    reference = out / "reference.csv"
    env.run("export", "last", "--csv", str(reference), "--results", str(results))
    whole = reference.read_bytes()
    for n in range(2 if quick else 8):
        csv = out / "x.csv"
        if n % 2:
            csv.write_text("old\n")
        _kill_while_writing(env, outcome, "export --csv", [
            "export", "last", "--csv", str(csv), "--results", str(results)], out)
        if csv.exists() and csv.read_bytes() not in (b"old\n", whole):
            outcome.fail(f"export --csv killed -9: {csv.name} holds {csv.stat().st_size} "
                         "bytes, neither what it held nor the whole export")
        csv.unlink(missing_ok=True)
    series = env.work / "killed-writes-series"
    series_store(series, "t", runs=4)
    site = env.work / "killed-writes-site"
    for _ in range(1 if quick else 4):
        _kill_while_writing(env, outcome, "publish", [
            "publish", "t", str(site), "--results", str(series)], site)
    outcome.cases += 1
    done = env.run("publish", "t", str(site), "--results", str(series), timeout=300)
    check_output(outcome, "publish after kills", done.stderr)
    if done.returncode != 0:
        outcome.fail(f"publish after kills: exit {done.returncode}: {done.stderr.strip()[-200:]}")


ATTACK = Attack(
    "kill -9 while export and publish write (#45.11)",
    "`export --csv FILE` of a 20 MB export and `publish`, killed -9 mid-write",
    "after `cleanup` no temporary file is left; FILE is what it was or whole; the site "
    "publishes again", killed_writes)
