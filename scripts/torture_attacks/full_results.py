"""A full results disk, the directory copied before anything imported what was kept
aside (issue #29, defect 2)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path

from torture_kit.env import Env, Outcome, check_output
from torture_kit.host import stored_reps
from torture_kit.stores import tiny_tmpfs
from torture_kit.registry import Attack


def _kept_aside(outcome: Outcome, message: str) -> int:
    """The repetitions a store's message says it kept aside, checked against the files it
    names: the count said of each must be the count there."""
    said = {Path(m[2]): int(m[1]) for m in re.finditer(
        r"(\d+) (?:repetitions of run \S+ are kept )?in (\S+\.jsonl)", message)}
    for path, n in said.items():
        held = sum(json.loads(line).get("kind") == "rep"
                   for line in path.read_text().splitlines()) if path.exists() else 0
        if held != n:
            outcome.fail(f"a full results disk: the message says {n} in {path}, which "
                         f"holds {held}: {message}")
    outcome.note(f"{sum(said.values())} repetitions kept in {len(said)} side file(s)")
    return sum(said.values())


def _check_copied(outcome: Outcome, results: Path, run_id: str, total: int) -> None:
    """results copied before anything imported what was kept aside; then the copy, the
    original and the copy again opened by a writer (which imports): no repetition stored
    twice, none shown `done` with fewer than total, and all of them in one of the two."""
    from vmtax.results.store import Store

    copy = results.with_name(results.name + "-copy")
    shutil.copytree(results, copy)
    counts = {}
    for where in (copy, results, copy):
        outcome.cases += 1
        store = Store(where)
        run = store.load_run(run_id)
        store.close()
        keys = [(r.target, r.workload, json.dumps(r.params), r.phase, r.idx) for r in run.reps]
        if len(keys) != len(set(keys)):
            outcome.fail(f"{where.name}: {len(keys) - len(set(keys))} repetitions stored twice")
        if run.status == "done" and len(keys) != total:
            outcome.fail(f"{where.name}: shown done with {len(keys)} of {total} repetitions")
        counts[where] = len(keys)
        outcome.note(f"{where.name}: {run.status}, {len(keys)} repetitions")
    if total not in counts.values():
        outcome.fail(f"a full results disk: {total} repetitions, found {counts} in the copy "
                     "and the original")


def full_results_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Defect 2: a results directory on a disk (a 300 KiB tmpfs) that fills mid-run, copied
    elsewhere before anything imported what was kept aside: the count said is true, no
    repetition is lost or stored twice, and no copy shows the run `done` with repetitions
    missing. Quick: through the store; else also a real run whose fileio fills the disk."""
    from vmtax.core.types import Metric
    from vmtax.results.store import Store, StoreError

    old_runtime = os.environ.get("VMTAX_RUNTIME")
    os.environ["VMTAX_RUNTIME"] = str(env.runtime)    # the store's runtime side file
    try:
        with tiny_tmpfs(env.work / "full-results-disk") as mounted:
            if not mounted:
                outcome.note("skipped: cannot mount a tmpfs")
                return
            results = env.work / "full-results-disk"
            store = Store(results)
            run_id = store.new_run({"targets": []}, {}, "0")
            store.set_target(run_id, "native", "native", {"bare_host": True})
            for idx in range(6):
                if idx == 1:   # the disk fills up
                    with contextlib.suppress(OSError), open(results / "filler", "wb") as f:
                        while True:
                            f.write(b"x" * 4096)
                            f.flush()
                if idx == 4:   # room again: the run's records must not split now
                    (results / "filler").unlink()
                store.add_rep(run_id, target="native", workload="cpu", params={},
                              phase="measure", idx=idx, status="ok", argv=["x"], started=1.0,
                              stdout="x" * 2000,
                              metrics=[Metric("events/s", 1.0, "events/s", True)])
            store.finish_run(run_id, "done")
            outcome.cases += 1
            try:
                store.set_flags(run_id, [])    # what the runner does next
                outcome.fail("a full results disk: nothing was kept aside")
                return
            except StoreError as exc:
                _kept_aside(outcome, str(exc))
            store.close()
            _check_copied(outcome, results, run_id, 6)
        if quick:
            return
        with tiny_tmpfs(env.work / "full-results-run") as mounted:
            results = env.work / "full-results-run"
            outcome.cases += 1
            done = env.run("run", "--targets", "native", "--workloads", "fileio,cpu",
                           "--runs", "3", "--warmup", "0", "--time", "1", "--results",
                           str(results))
            check_output(outcome, "a run on a full results disk", done.stderr)
            last = (done.stderr.strip().splitlines() or [""])[-1]
            found = re.search(r"repetitions of run (\S+) are kept", last)
            if done.returncode != 2 or not found:
                outcome.fail(f"a run on a full results disk: exit {done.returncode}: "
                             f"{last[-300:]}")
                return
            stored = len(stored_reps(results).get(found[1], []))
            _check_copied(outcome, results, found[1], stored + _kept_aside(outcome, last))
    finally:
        if old_runtime is None:
            os.environ.pop("VMTAX_RUNTIME", None)
        else:
            os.environ["VMTAX_RUNTIME"] = old_runtime


ATTACK = Attack(
    "full results disk, directory copied", "the store on a 300 KiB tmpfs that fills",
    "the count said is true; no repetition lost or stored twice; no copy shows the run done "
    "with repetitions missing", full_results_attack)
