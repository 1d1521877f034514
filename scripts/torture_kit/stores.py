"""Results directories made to be attacked, and the small helpers attacks share: a run of
targets with hostile names, a plain run of two targets, a profiled run, a tiny tmpfs that
fills, and what a tree of files holds."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from torture_kit.env import Env

HOSTILE_NAMES = ['=HYPERLINK("http://evil.example/","click")', "+1+cmd|' /C calc'!A0",
                 "@SUM(1+1)*cmd|' /C calc'!A0", "-2+3", "\t=1+1", "\r=1+1"]
ESCAPES = ["\x1b]0;pwned\x07", "\x1b[2J\x1b[H", "a\x1b[8mhidden", "\x9b31m", "x\u202eyz"]


def hostile_store(env: Env, name: str) -> Path:
    """A results directory holding one run whose targets have hostile names, stored as an
    older vmtax (or another tool) could have: straight through the store."""
    from vmtax.core.types import Metric
    from vmtax.results.store import Store

    results = env.work / name
    store = Store(results)
    names = ["native", HOSTILE_NAMES[0], *ESCAPES[:2]]
    run_id = store.new_run({"targets": [{"name": n, "kind": "native", "options": {}}
                                        for n in names], "baseline": "native",
                            "name": "hostile" + ESCAPES[0]}, {}, "0")
    for n in names:
        store.set_target(run_id, n, "native", {"bare_host": n == "native"})
        for idx in range(3):
            store.add_rep(run_id, target=n, workload="cpu", params={"p": HOSTILE_NAMES[2]},
                          phase="measure", idx=idx, status="ok", argv=["x"], started=1.0,
                          error=None, metrics=[Metric("events/s", -1.5 + idx, "events/s",
                                                      True)])
    store.finish_run(run_id, "done")
    store.close()
    return results


def traversal_store(results: Path) -> None:
    """A run of two native targets, for report and export to read."""
    from vmtax.core.types import Metric
    from vmtax.results.store import Store

    store = Store(results)
    run_id = store.new_run({"targets": [{"name": n, "kind": "native", "options": {}}
                                        for n in ("native", "other")], "baseline": "native",
                            "workloads": [{"name": "cpu"}], "name": "t"}, {}, "0")
    for name in ("native", "other"):
        store.set_target(run_id, name, "native", {"bare_host": name == "native"})
        for idx in range(3):
            store.add_rep(run_id, target=name, workload="cpu", params={}, phase="measure",
                          idx=idx, status="ok", argv=["x"], started=1.0,
                          metrics=[Metric("events/s", 100.0 + idx, "events/s", True)])
    store.finish_run(run_id, "done")
    store.close()


def profiled_store(results: Path, symbol: str) -> None:
    """A run of two cells profiled as the profile collector stores them, whose hottest
    function is symbol."""
    from vmtax.core.types import Metric
    from vmtax.results.store import Store

    store = Store(results)
    run_id = store.new_run({"name": "evil"}, {}, "0")
    for target, own in (("native", 60), ("vm:tcg", 90)):
        for idx in range(3):
            store.add_rep(run_id, target=target, workload="cpu", params={}, phase="measure",
                          idx=idx, status="ok", argv=["sysbench"], started=0.0,
                          host_elapsed=2.0, metrics=[Metric("events/s", 100.0, "events/s",
                                                            True)])
        store.set_target(run_id, target, target.partition(":")[0], {})
        metrics = [Metric("class samples", 100, "samples", False, {"class": "sysbench"})]
        for leaf, n in ((symbol, own), ("x", 100 - own)):
            metrics += [Metric("stack samples", n, "samples", False,
                               {"class": "sysbench", "stack": f"sysbench;main;{leaf}"}),
                        Metric("function samples", n, "samples", False,
                               {"class": "sysbench", "function": leaf, "dso": "sysbench"})]
        metrics += [Metric("sampled cpu", 1.0, "s", False), Metric("unresolved share", 0.0,
                                                                     "%", False),
                    Metric("profile overhead", 1.5, "%", False)]
        store.add_rep(run_id, target=target, workload="cpu", params={}, phase="collect",
                      idx=0, status="ok", argv=["profile"], started=0.0, metrics=metrics)
    store.finish_run(run_id, "done")
    store.close()


def files(root: Path) -> set[str]:
    """Every file, directory and link below root, as paths relative to it."""
    found = set()
    for top, dirs, files in os.walk(root):
        found.update(os.path.relpath(os.path.join(top, n), root) for n in dirs + files)
    return found


@contextlib.contextmanager
def in_directory(path: Path):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def raw_controls(text: str) -> list[str]:
    return [c for c in text if not (c.isprintable() or c == "\n")]


@contextlib.contextmanager
def tiny_tmpfs(path: Path):
    path.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=300k", "vmtax-torture", str(path)],
            capture_output=True).returncode != 0:
        yield False
        return
    try:
        yield True
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def series_store(results: Path, name: str, runs: int = 3,
                 targets: tuple[str, ...] = ("native", "other"), reps: int = 3,
                 finish: str | None = "done") -> list[str]:
    """runs runs named name of targets (native ones), reps repetitions each, for trend,
    publish and export to read; the last one left unfinished (`running`, as a kill leaves
    it) when finish is None. Their ids."""
    from vmtax.core.types import Metric
    from vmtax.results.store import Store

    store = Store(results)
    ids = []
    for i in range(runs):
        run_id = store.new_run({"name": name, "runs": reps, "baseline": targets[0],
                                "targets": [{"name": t, "kind": "native", "options": {}}
                                            for t in targets],
                                "workloads": [{"name": "cpu", "params": {}}]},
                               {"hostname": "h", "kernel": "k"}, "0")
        for n, target in enumerate(targets):
            store.set_target(run_id, target, "native", {"bare_host": n == 0})
            for idx in range(reps):
                store.add_rep(run_id, target=target, workload="cpu", params={},
                              phase="measure", idx=idx, status="ok", argv=["x"],
                              started=float(i), metrics=[Metric(
                                  "events/s", 100.0 * (n + 1) + idx + i, "events/s", True)])
        if finish is not None or i < runs - 1:
            store.finish_run(run_id, finish or "done")
        ids.append(run_id)
    store.close()
    return ids
