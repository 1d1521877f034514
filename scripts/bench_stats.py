#!/usr/bin/env python3
"""`make bench-stats`: do vmtax's verdicts deserve trust? Real sysbench runs, default settings.

Each run uses vmtax's defaults: plan.DEFAULT_RUNS measured runs after 1 warm-up, --time 2.
1. A vs A: native sysbench cpu and memory, stored runs compared pairwise; the share of
   metrics called significant must be <= 1%.
2. A real, small difference: sysbench cpu --cpu-max-prime=2000 vs 2100 (about 5% more work
   per event) must be called `worse` on events/s in >= 90% of the repetitions.
3. The guest-clock flag fires on guests whose clock is skewed (QEMU -icount; a wrong TSC
   frequency on the kernel command line) and stays silent on native and on a normal guest.
"""

from __future__ import annotations

import argparse
import tempfile

from vmtax import analysis, host, plan as plan_mod
from vmtax.errors import VmtaxError
from vmtax.runner import Runner
from vmtax.store import Store


def stored_run(store: Store, workloads: list[plan_mod.WorkloadSpec], targets=("native",),
               options=None, runs: int = plan_mod.DEFAULT_RUNS,
               time: int = plan_mod.DEFAULT_TIME) -> str:
    plan = plan_mod.Plan(targets=plan_mod.target_specs(list(targets), options or {}),
                         workloads=workloads, runs=runs, warmup=1, time=time)
    return Runner(plan, store).execute()


def compare_native(store: Store, a: str, b: str) -> list:
    return analysis.compare_targets([(store.load_run(a), "native", store.load_run(b), "native")])


def a_vs_a(store: Store, trials: int) -> None:
    print(f"1. A vs A: {trials + 1} runs of native cpu + memory ({plan_mod.DEFAULT_RUNS} runs "
          f"each), {trials} pairwise comparisons")
    ids = [stored_run(store, [plan_mod.WorkloadSpec("cpu"), plan_mod.WorkloadSpec("memory")])
           for _ in range(trials + 1)]
    called = total = 0
    for a, b in zip(ids, ids[1:]):
        rows = compare_native(store, a, b)
        total += len(rows)
        significant = [r for r in rows if r.comparison.significant]
        called += len(significant)
        for r in significant:
            print(f"   false alarm: {r.workload} {r.metric} {r.comparison.verdict} "
                  f"({r.comparison.change:+.1%}, p={r.comparison.p_adjusted:.2g})")
    print(f"   {called} of {total} metrics called significant = {called / total:.2%} "
          "(goal <= 1%)\n")


def detection(store: Store, trials: int) -> None:
    print(f"2. cpu-max-prime 2000 vs 2100, {trials} repetitions of a pair of runs")
    found = 0
    for _ in range(trials):
        a = stored_run(store, [plan_mod.WorkloadSpec("cpu", {"cpu-max-prime": 2000})])
        b = stored_run(store, [plan_mod.WorkloadSpec("cpu", {"cpu-max-prime": 2100})])
        rows = compare_native(store, a, b)
        eps = next(r.comparison for r in rows if r.metric == "events/s")
        found += eps.verdict == "worse"
        print(f"   events/s {eps.median_a:9.1f} -> {eps.median_b:9.1f} ({eps.change:+.1%}, "
              f"p={eps.p_adjusted:.2g}, {eps.test}): {eps.verdict}")
    print(f"   detected as worse in {found}/{trials} = {found / trials:.0%} (goal >= 90%)\n")


def clock_flag(store: Store) -> None:
    print("3. guest clock cross-check (flag 'clock skew' when guest and host time differ > 2%)")
    cpu = [plan_mod.WorkloadSpec("cpu")]
    cases = [("native", ("native",), {}),
             ("normal TCG guest", ("vm:tcg",), {}),
             # One vCPU: with two, icount's fixed shift hangs the guest's SMP bring-up.
             ("TCG guest with -icount shift=0,sleep=off (guest time = instruction count)",
              ("vm:tcg",), {"icount": ["shift=0,sleep=off"], "vcpus": ["1"]})]
    khz = host.tsc_khz()
    if khz:
        cases.append(("TCG guest told its TSC runs at twice its real rate (guest clock at "
                      "half speed)", ("vm:tcg",),
                      {"kernel_args": [f"tsc_early_khz={2 * khz}"]}))
    for label, targets, options in cases:
        try:
            run = store.load_run(stored_run(store, cpu, targets, options, runs=2, time=2))
        except VmtaxError as exc:
            print(f"   {label}: not measured: {exc}")
            continue
        summary = analysis.summarize_run(run)
        cell = next(r for r in summary.rows if r.metric == "events/s").cells[targets[0]]
        ratios = [r.guest_elapsed / r.host_elapsed for r in run.reps
                  if r.guest_elapsed and r.host_elapsed]
        shown = ", ".join(f"{x:.3f}" for x in ratios) or "host clock only"
        print(f"   {label}: guest/host elapsed {shown}; flagged: "
              f"{'clock skew' in cell.flags}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--skip-vm", action="store_true", help="skip the guest clock check")
    parser.add_argument("--clock-only", action="store_true", help="only the guest clock check")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as results:
        store = Store(results)
        if not args.clock_only:
            a_vs_a(store, args.trials)
            detection(store, args.trials)
        if not args.skip_vm:
            clock_flag(store)


if __name__ == "__main__":
    main()
