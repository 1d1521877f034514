"""Concurrent runs and resumes on one store (issue #16): two runs at once, then a run
killed with -9 mid-measurement and two resumes of it at once, of which one runs and the
other is refused as in progress."""

from __future__ import annotations

import json
import time

from torture_kit.env import Env, Outcome, check_output
from torture_kit.host import descendants, duplicates, stored_reps
from torture_kit.registry import Attack


def concurrency_attack(env: Env, outcome: Outcome, rounds: int, fresh: bool) -> None:
    results = env.work / "concurrent"
    common = ["--targets", "native", "--workloads", "cpu", "--warmup", "0", "--time", "1",
              "--results", str(results)]
    for _ in range(rounds):
        runs = [env.start("run", *common, "--runs", "1") for _ in range(2 if fresh else 0)]
        for proc in runs:
            _, err = proc.communicate(timeout=300)
            outcome.cases += 1
            check_output(outcome, "concurrent run", err)
            if proc.returncode != 0:
                outcome.fail(f"concurrent run: exit {proc.returncode}: {err.strip()[-200:]}")
        # kill -9 a run mid-measurement, then two resumes at once: one runs, one is refused.
        victim = env.start("run", *common, "--runs", "3")
        while not any("sysbench" in c for c in descendants(victim.pid).values()):
            if victim.poll() is not None:
                break
            time.sleep(0.05)
        time.sleep(env.rng.uniform(0, 1.0))
        victim.kill()
        victim.communicate()
        listed = env.run("runs", "--json", "--results", str(results))
        check_output(outcome, "runs", listed.stderr)
        try:
            run_id = json.loads(listed.stdout)[-1]["id"]
        except (ValueError, IndexError, KeyError, TypeError):
            outcome.note("killed before its run was stored")
            continue
        resumes = [env.start("run", "--resume", run_id, "--results", str(results))
                   for _ in range(2)]
        codes = []
        for proc in resumes:
            _, err = proc.communicate(timeout=300)
            outcome.cases += 1
            check_output(outcome, "concurrent resume", err)
            codes.append((proc.returncode, err))
        refused = [e for c, e in codes if c != 0]
        if any("in progress" not in e for e in refused):
            outcome.fail(f"resume failed otherwise: {refused[0].strip()[-200:]}")
        outcome.note(f"{len(refused)} of 2 concurrent resumes refused as in progress")
        reps = stored_reps(results)
        for problem in duplicates(reps):
            outcome.fail(problem)
        measured = [r for r in reps.get(run_id, []) if r[3] == "measure"]
        if len(measured) != 3:
            outcome.fail(f"resumed run {run_id}: {len(measured)} measured repetitions, "
                         "expected 3")


ATTACK = Attack(
    "concurrent runs and resumes", "one results store written by several vmtax at once",
    "no traceback; of two resumes one is refused as in progress; no repetition lost or "
    "stored twice", lambda env, o, quick: concurrency_attack(env, o, 1 if quick else 3,
                                                              not quick))
