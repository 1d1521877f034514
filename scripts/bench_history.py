#!/usr/bin/env python3
"""`make bench`, part 4: the commands that read a store, on a store of many runs.

A store of N runs (default 400) of the classic plan (native, container, vm × cpu, threads,
memory, fileio, mutex, 5 measured repetitions with every metric each workload declares),
synthetic repetitions written through the Store, all named `nightly`, with a 10% step in
vm's fileio at run 3N/4. Each run stores as much as a real one: a warm-up repetition of
each workload, fileio's prepare on each target, and each repetition's command line and
sysbench's output (a recorded one: tests/fixtures/sysbench), which are most of a real
store's bytes. Then the time of `vmtax runs`, `show last`, `compare` and
`trend nightly`, each run as a user runs it (a new process: Python's start-up included),
median of 5, CPU and wall time with the host's load (goal: < 0.5 s each); and of `publish
nightly` into a new directory, once (goal: < 60 s). The goals are judged on the time to the
answer, the wall time, on a quiet host: on a shared one the wall time adds the waiting for a
CPU, which the load says and the CPU time (user + system, of every thread: trend's series
are tested on every CPU) leaves out.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from vmtax.core import workload as workloads
from vmtax.core.types import Metric
from vmtax.results.store import Store, StoreError

VMTAX = [sys.executable, "-m", "vmtax"]
OUTPUTS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "sysbench" / "1.0.20"
TARGETS = {"native": 1.0, "container": 0.97, "vm": 0.6}
WORKLOADS = ("cpu", "threads", "memory", "fileio", "mutex")
REPS = 5
GOAL = 0.5
PUBLISH_GOAL = 60


def new_run(store: Store, plan: dict, host: dict) -> str:
    """A new run; again if its id was taken: ids are the second and 16 random bits, and
    this writes dozens of runs a second."""
    while True:
        try:
            return store.new_run(plan, host, "0.1.0")
        except StoreError:
            continue


def fill(results: str, runs: int, targets: dict[str, float] = TARGETS,
         workload_names: tuple[str, ...] = WORKLOADS) -> None:
    store = Store(results)
    store.db.execute("PRAGMA synchronous = OFF")   # a fixture: no need to survive a crash
    rng = np.random.default_rng(0)
    specs = {w: workloads.registered()[w].metrics for w in workload_names}
    made = {w: workloads.registered()[w].make({"time": 2}) for w in workload_names}
    outputs = {w: (OUTPUTS / f"{w}.txt").read_text() for w in workload_names}
    plan = {"name": "nightly", "runs": REPS, "warmup": 1, "time": 2, "baseline": "native",
            "targets": [{"name": t, "kind": t, "options": {}} for t in targets],
            "workloads": [{"name": w, "params": {}} for w in workload_names]}
    host = {"hostname": "bench", "kernel": "6.1.0-18-amd64", "cpu_model": "Xeon"}
    for i in range(runs):
        run_id = new_run(store, plan, host)
        for target, speed in targets.items():
            store.set_target(run_id, target, target, {"bare_host": target == "native"})
            for workload in workload_names:
                step = 0.9 if (target, workload) == ("vm", "fileio") and i >= 3 * runs // 4 else 1
                for idx, job in enumerate(made[workload].prepare_jobs()):
                    store.add_rep(run_id, target=target, workload=workload,
                                  params={"time": 2}, phase="prepare", idx=idx, status="ok",
                                  argv=job.argv, started=time.time(), host_elapsed=2.0,
                                  stdout=(OUTPUTS / f"{workload}-prepare.txt").read_text())
                for rep in range(1 + REPS):
                    noise = float(np.exp(rng.normal(0, 0.02)))
                    metrics = [Metric(s.name, 100 * noise * (speed * step if s.higher_is_better
                                                             else 1 / (speed * step)),
                                      s.unit, s.higher_is_better)
                               for s in specs[workload]]
                    store.add_rep(run_id, target=target, workload=workload,
                                  params={"time": 2}, phase="measure" if rep else "warmup",
                                  idx=rep, status="ok", argv=made[workload].run_job().argv,
                                  started=time.time(), host_elapsed=2.0,
                                  stdout=outputs[workload], metrics=metrics)
        store.finish_run(run_id, "done")
    store.close()


def timed(*argv: str, repeat: int = 3) -> tuple[float, float]:
    """Median wall time and CPU time (user + system) of the command: on a shared host the
    wall time is mostly waiting for a CPU, which the CPU time leaves out. As a user runs
    it: with Python's compiled modules written (PYTHONDONTWRITEBYTECODE, which some shells
    set, makes every start compile vmtax's sources again: ~0.25 s) by a first, untimed
    run."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([*VMTAX, *argv], stdout=subprocess.DEVNULL, env=env)
    walls, cpus = [], []
    for _ in range(repeat):
        start, used = time.perf_counter(), _children_cpu()
        subprocess.run([*VMTAX, *argv], check=True, stdout=subprocess.DEVNULL, env=env)
        walls.append(time.perf_counter() - start)
        cpus.append(_children_cpu() - used)
    return statistics.median(walls), statistics.median(cpus)


def timed_publish(results: str) -> tuple[float, float]:
    """Wall and CPU time of publishing the store's series into a new directory (once:
    publishing again skips the pages written before)."""
    with tempfile.TemporaryDirectory() as site:
        start, used = time.perf_counter(), _children_cpu()
        subprocess.run([*VMTAX, "publish", "nightly", os.path.join(site, "site"),
                        "--results", results], check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start, _children_cpu() - used


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=400)
    args = parser.parse_args()
    print(f"4. commands that read a store of {args.runs} classic-plan runs (goal < {GOAL} s)")
    with tempfile.TemporaryDirectory() as results:
        start = time.perf_counter()
        fill(results, args.runs)
        print(f"   store filled in {time.perf_counter() - start:.0f} s")
        print(f"   host load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        wall, cpu = timed("--version", repeat=5)
        print(f"   {'vmtax --version':22} {cpu:6.2f} s CPU {wall:6.2f} s wall (start-up)")
        for command in (["runs"], ["show", "last"], ["compare"], ["trend", "nightly"]):
            wall, cpu = timed(*command, "--results", results, repeat=5)
            print(f"   {'vmtax ' + ' '.join(command):22} {cpu:6.2f} s CPU {wall:6.2f} s wall"
                  f" (load {os.getloadavg()[0]:.1f})"
                  + ("" if wall < GOAL else f"  over the goal of {GOAL} s"))
        wall, cpu = timed_publish(results)
        print(f"   {'vmtax publish nightly':22} {cpu:6.1f} s CPU {wall:6.1f} s wall"
              f" (load {os.getloadavg()[0]:.1f})"
              + ("" if wall < PUBLISH_GOAL else f"  over the goal of {PUBLISH_GOAL} s"))
    print()


if __name__ == "__main__":
    main()
