#!/usr/bin/env python3
"""`make bench-stats`: do vmtax's verdicts deserve trust? Real sysbench runs, default settings.

Each run uses vmtax's defaults: plan.DEFAULT_RUNS measured runs after 1 warm-up, --time 2.
1. A vs A: native sysbench cpu and memory, stored runs of one name compared pairwise, as
   `vmtax compare` judges them (a change within the host's drift between the earlier runs
   of the name gets no verdict, from the fifth run on); the share of metrics called
   significant must be <= 1%. The share a test over repetitions alone calls is beside it.
2. A real, small difference: sysbench cpu --cpu-max-prime=2000 vs 2100 (about 5% more work
   per event) must be called `worse` on events/s in >= 90% of the repetitions.
3. The guest-clock flag fires on guests whose clock is skewed (QEMU -icount; a wrong TSC
   frequency on the kernel command line) and stays silent on native and on a normal guest.
4. `vmtax tune`'s search (racing rule, then verdicts adjusted over every comparison), on
   synthetic repetitions with 1% log-normal noise: a knob with a planted 5% effect must be
   found in >= 90% of 20 searches, and the A-vs-A control called significant in <= 5%.
5. Change points (`vmtax trend`): 100 synthetic series of 30 points of 5 repetitions with
   2-5% log-normal noise and no step must raise at most 5 changes in all; 100 with a
   planted 5% step at point 20 must have it found within one point in >= 90. Apache
   Otava (pinned, in a venv of its own) is run on the same series' point medians beside.
6. vmtax's own t-test on logs, Mann-Whitney (exact and normal approximation) and
   Benjamini-Hochberg adjustment, which spare `compare`, `show` and `trend` importing
   scipy.stats, against scipy's, on samples shaped like 1., 2. and 5.'s (3-9 runs a side,
   or 9-400 for the rank test, 0.5-5% log-normal noise, no step or a 2-10% step, values
   rounded to give ties; 4 vs 4 with ties for its permutation test): the largest relative
   difference of p (goal <= 1e-12: no printed digit or verdict can move) and of adjusted p.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from vmtax.analysis import changepoint, drift
from vmtax.analysis import summary as analysis
from vmtax.analysis import tune as tuning
from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.host import machine as host
from vmtax.results.store import Store
from vmtax.studies import plan as plan_mod
from vmtax.studies.runner import Runner


def stored_run(store: Store, workloads: list[plan_mod.WorkloadSpec], targets=("native",),
               options=None, runs: int = plan_mod.DEFAULT_RUNS,
               time: int = plan_mod.DEFAULT_TIME, name: str | None = None) -> str:
    plan = plan_mod.Plan(targets=plan_mod.target_specs(list(targets), options or {}),
                         workloads=workloads, runs=runs, warmup=1, time=time, name=name)
    return Runner(plan, store).execute()


def compare_native(store: Store, a: str, b: str) -> list:
    return analysis.compare_targets([(store.load_run(a), "native", store.load_run(b), "native")])


def a_vs_a(store: Store, trials: int) -> None:
    print(f"1. A vs A: {trials + 1} runs of native cpu + memory ({plan_mod.DEFAULT_RUNS} runs "
          f"each) named a-vs-a, {trials} pairwise comparisons")
    ids = [stored_run(store, [plan_mod.WorkloadSpec("cpu"), plan_mod.WorkloadSpec("memory")],
                      name="a-vs-a") for _ in range(trials + 1)]
    called = raw = total = 0
    weighed = [0, 0]   # metrics called, compared: pairs with the drift of earlier runs
    for pair, (a, b) in enumerate(zip(ids, ids[1:]), start=1):
        alone = compare_native(store, a, b)
        # Then the host's drift between earlier runs weighed, as `vmtax compare` weighs it.
        rows, _ = drift.within_drift(store, alone, store.load_run(a), store.load_run(b),
                                     alpha=0.01)
        with_drift = pair > drift.DRIFT_FROM   # run pair + 1 has `pair` runs before it
        total += len(rows)
        raw += sum(r.comparison.significant for r in alone)
        significant = [r for r in rows if r.comparison.significant]
        called += len(significant)
        if with_drift:
            weighed[0] += len(significant)
            weighed[1] += len(rows)
        for r in significant:
            print(f"   false alarm, runs {pair} and {pair + 1}"
                  f"{'' if with_drift else ' (too few earlier runs for their drift)'}: "
                  f"{r.workload} {r.metric} {r.comparison.verdict} "
                  f"({r.comparison.change:+.1%}, p={r.comparison.p_adjusted:.2g})")
    print(f"   {called} of {total} metrics called significant = {called / total:.2%} "
          f"(goal <= 1%); by the repetitions alone {raw} = {raw / total:.2%}; from run "
          f"{drift.DRIFT_FROM + 2} on (drift weighed): {weighed[0]} of {weighed[1]} = "
          f"{weighed[0] / max(1, weighed[1]):.2%}\n")


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


def tune_search(trials: int) -> None:
    print(f"4. tune: {trials} synthetic searches (baseline, control, a +5% knob, 3 null "
          "knobs; 1% noise, 3 runs then racing up to 15)")
    found = alarms = runs = 0
    for seed in range(trials):
        rng = np.random.default_rng(seed)
        truth = {"baseline": 100.0, "control": 100.0, "planted": 105.0,
                 **{f"null{i}": 100.0 for i in range(3)}}

        def measure(name: str, truth=truth, rng=rng) -> float:
            return float(truth[name] * np.exp(rng.normal(0, 0.01)))

        values = {name: [measure(name) for _ in range(3)] for name in truth}
        pairs = [("baseline", name) for name in truth if name != "baseline"]
        tuning.race(values, pairs, True, tuning.RaceRule(tests=len(pairs)), measure, 15,
                    lambda: True)
        runs += sum(map(len, values.values()))
        verdicts = {c.name: c for c in tuning.judge(
            [(b, *tuning.matched(list(enumerate(values[a])), list(enumerate(values[b]))),
              True) for a, b in pairs])}
        found += verdicts["planted"].verdict == "better"
        alarms += verdicts["control"].significant
    print(f"   planted +5% found in {found}/{trials} = {found / trials:.0%} (goal >= 90%); "
          f"control significant in {alarms}/{trials} = {alarms / trials:.0%} (goal <= 5%); "
          f"{runs / trials:.0f} repetitions per search\n")


OTAVA = "apache-otava==0.8.0"


def _series(rng: np.random.Generator, step: float) -> list[np.ndarray]:
    noise = rng.uniform(0.02, 0.05)
    return [1000 * (1 + (step if i >= 20 else 0)) * np.exp(rng.normal(0, noise, 5))
            for i in range(30)]


def _otava(series: list[list[float]]) -> list[list[int]] | None:
    """Otava's change points of each series, from its own venv (made once in the cache),
    or None with the reason printed when it cannot be installed here."""
    venv = paths.cache_dir() / "otava"
    python = venv / "bin" / "python"
    try:
        if not (venv / ".installed").read_text() == OTAVA:
            raise FileNotFoundError
    except FileNotFoundError:
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
        done = subprocess.run([str(python), "-m", "pip", "install", "-q",
                               "--disable-pip-version-check", OTAVA], capture_output=True,
                              text=True)
        if done.returncode:
            print(f"   Otava: not installed ({done.stderr.strip().splitlines()[-1:]})")
            return None
        (venv / ".installed").write_text(OTAVA)
    script = Path(__file__).with_name("otava_points.py")
    out = subprocess.run([str(python), str(script)], input=json.dumps(series),
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return json.loads(out.stdout)


def change_points(series_count: int = 100) -> None:
    print(f"5. change points: {series_count} series of 30 points × 5 repetitions, 2-5% noise, "
          "no step; and as many with a 5% step at point 20")
    rng = np.random.default_rng(20261127)
    flat = [_series(rng, 0.0) for _ in range(series_count)]
    stepped = [_series(rng, -0.05) for _ in range(series_count)]
    alarms = sum(len(changepoint.detect(s).changes) for s in flat)
    found = sum(any(abs(c.index - 20) <= 1 for c in changepoint.detect(s).changes)
                for s in stepped)
    print(f"   vmtax: {alarms} changes in the series without a step (goal <= 5); step found "
          f"in {found}/{series_count} (goal >= 90)")
    medians = [[float(np.median(p)) for p in s] for s in flat + stepped]
    otava = _otava(medians)
    if otava is not None:
        o_alarms = sum(map(len, otava[:series_count]))
        o_found = sum(any(abs(i - 20) <= 1 for i in found_at)
                      for found_at in otava[series_count:])
        print(f"   Otava ({OTAVA}, defaults, on the point medians): {o_alarms} changes "
              f"without a step; step found in {o_found}/{series_count}")
    print()


def against_scipy(cases: int = 5_000) -> None:
    import math
    import warnings

    from scipy import stats as scipy_stats

    from vmtax.analysis import significance

    print(f"6. vmtax's t-test on logs, Mann-Whitney and BH adjustment against scipy's, "
          f"{cases} cases each")
    rng = np.random.default_rng(6)
    worst = {"t-log": 0.0, "mann-whitney": 0.0, "BH-adjusted": 0.0}
    ps = []
    for _ in range(cases):
        n_a = int(rng.integers(3, 10))
        n_b = n_a if rng.random() < 0.7 else int(rng.integers(3, 10))
        noise, step = rng.uniform(0.005, 0.05), rng.choice([1.0, 1.02, 1.05, 1.1])
        a = 1000 * np.exp(rng.normal(0, noise, n_a))
        b = 1000 * step * np.exp(rng.normal(0, noise, n_b))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ref = float(scipy_stats.ttest_ind(np.log(a), np.log(b),
                                              equal_var=n_a == n_b).pvalue)
        worst["t-log"] = max(worst["t-log"], abs(significance.t_log_p(a, b) - ref) / ref)
        ps.append(ref)
        if len(ps) == 30:   # a comparison's worth of metrics
            ref_adjusted = scipy_stats.false_discovery_control(ps, method="bh")
            adjusted = significance.adjust_pvalues(ps, "bh")
            worst["BH-adjusted"] = max(worst["BH-adjusted"], max(
                abs(x - y) / y for x, y in zip(adjusted, ref_adjusted)))
            ps = []
        # The rank test: a point against its segment (5 vs up to 400 runs), or many runs.
        b = 1000 * step * np.exp(rng.normal(0, noise, int(rng.integers(9, 400))))
        a, b = (np.round(a), np.round(b)) if rng.random() < 0.3 else (a, b)
        if rng.random() < 0.1:   # few runs with ties: every arrangement is counted
            a, b = np.round(a[:4], -1), np.round(b[:4], -1)
        tied = np.unique(np.r_[a, b]).size < a.size + b.size
        exact = tied and math.comb(a.size + b.size, a.size) <= significance.MAX_EXACT_PERMUTATIONS
        method = (scipy_stats.PermutationMethod(n_resamples=np.inf) if exact
                  else "asymptotic" if tied else "auto")
        ref = float(scipy_stats.mannwhitneyu(a, b, alternative="two-sided",
                                             method=method).pvalue)
        worst["mann-whitney"] = max(worst["mann-whitney"],
                                    abs(significance.mann_whitney_p(a, b) - ref) / ref)
    print("   largest relative difference of p: "
          + ", ".join(f"{name} {value:.1e}" for name, value in worst.items())
          + " (goal <= 1e-12)\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--skip-vm", action="store_true", help="skip the guest clock check")
    parser.add_argument("--clock-only", action="store_true", help="only the guest clock check")
    parser.add_argument("--tune-only", action="store_true",
                        help="only the tune search check (synthetic, seconds)")
    parser.add_argument("--changepoints-only", action="store_true",
                        help="only the change-point check (synthetic, and Otava beside)")
    parser.add_argument("--scipy-only", action="store_true",
                        help="only the check of vmtax's tests against scipy's (seconds)")
    parser.add_argument("--a-vs-a-only", action="store_true",
                        help="only the A vs A check (real runs, ~10 min)")
    args = parser.parse_args()
    if args.a_vs_a_only:
        with tempfile.TemporaryDirectory() as results:
            a_vs_a(Store(results), args.trials)
        return
    against_scipy()
    if args.scipy_only:
        return
    change_points()
    if args.changepoints_only:
        return
    tune_search(args.trials)
    if args.tune_only:
        return
    with tempfile.TemporaryDirectory() as results:
        store = Store(results)
        if not args.clock_only:
            a_vs_a(store, args.trials)
            detection(store, args.trials)
        if not args.skip_vm:
            clock_flag(store)


if __name__ == "__main__":
    main()
