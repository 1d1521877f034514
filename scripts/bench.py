#!/usr/bin/env python3
"""`make bench`: the figures that show vmtax measures without getting in the way.

1. vmtax's native sysbench cpu events/s against the same sysbench command run directly,
   interleaved A B A B, median ratio (goal: within 0.5%).
2. Guest boot to agent-ready under TCG, median of 10 (goal: <= 1.5 s), and KVM where usable,
   at the vm target's defaults and at E4's instance size (1 vCPU, 256 MiB);
   the same with the minimal guest kernel (vmtax.guest.minimal_kernel; goal: <= 1.0 s,
   and <= 0.6 s at E4's size with E4's per-plan guest), part by part, and the per-plan
   initramfs's size against the classic plan's.
3. Wall time of the classic plan at default settings.
4. The commands that read a store (runs, show, compare, trend) on a store of 400 runs
   (scripts/bench_history.py; goal: < 0.5 s CPU each, medians of 5).
5. The everyday commands' latency against issue #37's goals: --help, runs, show last,
   compare (two runs of 2 targets × 2 workloads), doctor; whole-process medians of 5.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vmtax.workloads.sysbench import Cpu

ROOT = Path(__file__).resolve().parent.parent
VMTAX = [sys.executable, "-m", "vmtax"]


def native_overhead(pairs: int, seconds: int) -> None:
    print(f"1. vmtax native vs direct sysbench cpu, {pairs} interleaved pairs of {seconds} s")
    direct_argv = Cpu.make({"time": seconds}).run_job().argv
    ratios = []
    with tempfile.TemporaryDirectory() as results:
        for i in range(pairs):
            out = subprocess.run([*VMTAX, "run", "--targets", "native", "--workloads", "cpu",
                                  "--runs", "1", "--warmup", "0", "--time", str(seconds),
                                  "--results", results, "--json"],
                                 capture_output=True, text=True, check=True).stdout
            rows = json.loads(out)["summary"]["rows"]
            row = next(r for r in rows if r["metric"] == "events/s")
            via = row["cells"]["native"]["summary"]["median"]
            direct_out = subprocess.run(direct_argv, capture_output=True, text=True,
                                        check=True).stdout
            direct = next(m.value for m in Cpu.make({}).parse(direct_out) if m.name == "events/s")
            ratios.append(via / direct)
            print(f"   pair {i + 1}: vmtax {via:10.2f}  direct {direct:10.2f}  "
                  f"ratio {via / direct:.4f}")
    median = statistics.median(ratios)
    print(f"   median ratio {median:.4f} ({(median - 1) * 100:+.2f}%; goal within ±0.5%)\n")


def boot_time() -> None:
    print("2. guest boot to agent-ready, median of 10, part by part: Debian's kernel (goal "
          "<= 1.5 s), then the minimal kernel (goal <= 1.0 s; built from linux-source on "
          "first use); each at the vm target's defaults (2 vCPUs, 1 GiB) with the classic "
          "plan's guest (sysbench), and at E4's instance size (1 vCPU, 256 MiB) with E4's "
          "per-plan guest (nginx; goal with the minimal kernel <= 0.6 s), against the "
          "classic plan's initramfs and one without programs; then E4's smallest guest "
          "(the vm target's small_options, as `vmtax density` starts it)")
    bench_boot = [sys.executable, str(ROOT / "scripts" / "bench_boot.py"), "--runs", "10"]
    from vmtax.core import paths
    from vmtax.core import target as targets
    from vmtax.guest import minimal_kernel
    kernel = minimal_kernel.minimal_kernel(paths.cache_dir())
    classic = ["--plan", str(ROOT / "src" / "vmtax" / "plans" / "classic.toml")]
    e4 = ["--vcpus", "1", "--memory", "256M"]
    # The guest `vmtax density` and `vmtax boot` start now: the vm target's smallest.
    smallest = ["--vcpus", "1", "--memory", targets.get("vm").small_options["memory"]]
    for label, extra in (("Debian's kernel", []), (
            f"minimal kernel {kernel.version} ({kernel.path.stat().st_size >> 20} MiB)",
            ["--kernel", str(kernel.path)])):
        print(f"   {label}:")
        shapes = [classic, e4] if not extra else [classic, [*e4, "--against-full"], smallest]
        for shape in shapes:
            subprocess.run([*bench_boot, *extra, *shape], check=True)
    print()


def classic_wall_time() -> None:
    print("3. wall time of the classic plan at default settings (vmtax run)")
    with tempfile.TemporaryDirectory() as results:
        start = time.perf_counter()
        subprocess.run([*VMTAX, "run", "--results", results], check=True,
                       stdout=subprocess.DEVNULL)
        print(f"   {time.perf_counter() - start:.0f} s\n")


# Issue #37's goals (seconds), measured as a user runs them: a new process each time.
LATENCY_GOALS = {"--help": 0.2, "runs": 0.2, "show last": 0.3, "compare": 0.3, "doctor": 1.0}


def latency() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_history

    print("5. latency of everyday commands, median of 5 (wall; CPU beside it, which a "
          "busy host's waiting leaves out)")
    with tempfile.TemporaryDirectory() as results:
        bench_history.fill(results, 2, {"native": 1.0, "vm": 0.6}, ("cpu", "memory"))
        print(f"   host load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        for command, goal in LATENCY_GOALS.items():
            store = [] if command in ("--help", "doctor") else ["--results", results]
            wall, cpu = bench_history.timed(*command.split(), *store, repeat=5)
            over = [kind for kind, took in (("wall", wall), ("CPU", cpu)) if took > goal]
            print(f"   {'vmtax ' + command:18} {wall:6.3f} s wall {cpu:6.3f} s CPU  "
                  f"goal <= {goal} s{'  (' + ' and '.join(over) + ' over)' if over else ''}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5, help="sysbench --time of each pair")
    parser.add_argument("--skip-classic", action="store_true")
    parser.add_argument("--only", choices=["latency", "history"],
                        help="Only part 5 (latency) or part 4 (a store of 400 runs).")
    args = parser.parse_args()
    if args.only:
        {"latency": latency, "history": history}[args.only]()
        return
    native_overhead(args.pairs, args.seconds)
    boot_time()
    if not args.skip_classic:
        classic_wall_time()
    history()
    latency()


def history() -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_history.py")], check=True)


if __name__ == "__main__":
    main()
