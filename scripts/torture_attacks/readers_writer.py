"""Readers against a writer (issue #35, item 5)."""

from __future__ import annotations

import json
import subprocess
import sys

from torture_kit.env import Env, Outcome, check_output
from torture_kit.registry import Attack


WRITER = """
import sys, time
from vmtax.core.types import Metric
from vmtax.results.store import Store
store = Store(sys.argv[1])
run_id = store.new_run({"targets": [{"name": "native", "kind": "native"}],
                        "workloads": [{"name": "cpu"}]}, {}, "0")
store.set_target(run_id, "native", "native", {"kind": "native", "bare_host": True})
print(run_id, flush=True)
deadline, i = time.monotonic() + float(sys.argv[2]), 0
while time.monotonic() < deadline:
    store.add_rep(run_id, target="native", workload="cpu", params={}, phase="measure", idx=i,
                  status="ok", argv=["x"], started=float(i),
                  metrics=[Metric(f"m{k}", float(k), "u", True) for k in range(3)])
    i += 1
store.finish_run(run_id, "done")
print(i, flush=True)
"""
READER = """
import json, sys, time
from vmtax.results.store import Store
loads, half = 0, 0
store = Store(sys.argv[1], readonly=True)
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    run = store.load_run("last")
    loads += 1
    half += sum(len(rep.metrics) != 3 for rep in run.reps)
print(json.dumps({"loads": loads, "half": half}))
"""


def readers_writer_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Issue #35, item 5: `show last` and `runs` while a run writes. Readers load the run
    being written over and over, each in one moment of the database: none may crash (a
    KeyError in load_run was), nor see a repetition without all its metrics."""
    results = env.work / "readers-writer"
    seconds = 6 if quick else 20
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(results), str(seconds)],
                              env=env.env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    env.started.append(writer)
    assert writer.stdout is not None
    writer.stdout.readline()          # its run is stored: readers find it as `last`
    readers = [subprocess.Popen([sys.executable, "-c", READER, str(results), str(seconds - 1)],
                                env=env.env, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE) for _ in range(4 if quick else 8)]
    commands = [env.start(*command, "--results", str(results))
                for command in (["show", "last"], ["runs"]) * (2 if quick else 10)]
    loads = 0
    for reader in readers:
        out, err = reader.communicate(timeout=120)
        outcome.cases += 1
        if reader.returncode != 0:
            outcome.fail(f"a reader crashed: {err.strip().splitlines()[-1][:200]}")
            continue
        seen = json.loads(out)
        loads += seen["loads"]
        if seen["half"]:
            outcome.fail(f"a reader saw {seen['half']} repetitions without all their metrics")
    for proc in commands:
        _, err = proc.communicate(timeout=300)
        outcome.cases += 1
        check_output(outcome, f"vmtax {proc.args[3]} while a run writes", err)
        if proc.returncode != 0:
            outcome.fail(f"vmtax {proc.args[3]} while a run writes: exit {proc.returncode}: "
                         f"{err.strip()[-200:]}")
    out, err = writer.communicate(timeout=120)
    if writer.returncode != 0:
        outcome.fail(f"the writer failed: {err.strip()[-200:]}")
    else:
        outcome.notes[f"{loads} loads of a run while {out.split()[-1]} repetitions were "
                      "written"] = 0


ATTACK = Attack(
    "readers against a writer", "`show last`, `runs` and Store.load_run while a run writes",
    "no crash; no repetition seen without all its metrics", readers_writer_attack)
