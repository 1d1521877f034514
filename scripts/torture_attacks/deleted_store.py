"""The results database deleted while a run measures (issue #16)."""

from __future__ import annotations

import time

from torture_kit.env import Env, Outcome, check_output
from torture_kit.host import duplicates, stored_reps
from torture_kit.registry import Attack


def deleted_store_attack(env: Env, outcome: Outcome) -> None:
    """The database deleted while a run measures: not one repetition may be lost."""
    results = env.work / "deleted"
    proc = env.start("run", "--targets", "native", "--workloads", "cpu", "--runs", "4",
                     "--warmup", "0", "--time", "1", "--results", str(results))
    db = results / "vmtax.sqlite"
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if db.exists() and stored_reps(results):
            break
        time.sleep(0.05)
    db.unlink(missing_ok=True)
    _, err = proc.communicate(timeout=300)
    outcome.cases += 1
    check_output(outcome, "run with its database deleted", err)
    last = (err.strip().splitlines() or [""])[-1]
    if proc.returncode != 2 or "vmtax.pending.jsonl" not in last:
        outcome.fail(f"run with its database deleted: exit {proc.returncode}: {last[-300:]}")
    listed = env.run("run", "--targets", "native", "--workloads", "cpu", "--runs", "1",
                     "--warmup", "0", "--time", "1", "--results", str(results))
    check_output(outcome, "the next run", listed.stderr)
    reps = stored_reps(results)
    first = min(reps, default=None)
    kept = len(reps.get(first, [])) if first else 0
    outcome.note(f"{kept} repetitions kept aside and imported")
    if kept < 1 or (results / "vmtax.pending.jsonl").exists():
        outcome.fail("the repetitions measured after the deletion were not imported")
    for problem in duplicates(reps):
        outcome.fail(problem)


ATTACK = Attack(
    "database deleted mid-run", "a run whose vmtax.sqlite is deleted under it",
    "exit 2 naming the side file; the next run imports every repetition, none twice",
    lambda env, o, quick: deleted_store_attack(env, o))
