"""Statistics behind every vmtax table, comparison and report.

Public API
    summarize(values, confidence)            -> Summary: median with an order-statistic CI
    ratio(values, baseline, higher_is_better) -> RatioSummary: direction-aware ratio of medians
    compare(a, b, higher_is_better)           -> Comparison: is B better/worse than A?
    compare_many(pairs, ..., method)          -> [Comparison] with multiplicity-adjusted p
    precise_enough / next_action              -> adaptive repetition
    clock_skew / noisy / faster_than_baseline -> sanity flags
    interleave(labels, runs)                  -> counterbalanced run order

Its parts, one concern each: `significance` (p-values, the smallest p run counts allow,
`adjust_pvalues`, `can_test`), `intervals` (a median's CI, a bootstrap's percentiles,
`interval_kind`: what an interval is) and `resampling` (the bootstrap's replicates).

Verdicts and why
  * `Comparison.test` says which test gave p (`significance.p_value`: Mann-Whitney U, or
    with few runs a t-test on logs).
  * When the rank test gave p and even its smallest possible p cannot reach alpha after
    the adjustment (n=2 per side: 1/3), the verdict is not "~" (which reads as "no
    change") but "too few runs", with a note saying how many runs a side could speak.
  * A metric whose two samples are the same constant (a quantized latency, a zero stddev)
    is no test: it gets p = 1 and stays out of the multiplicity adjustment.
  * A change is significant only if adjusted p < alpha, the (1 - alpha) bootstrap CI of
    the change excludes 0, and |med_b - med_a| >= noise_floor * max(|med_a|, |med_b|).
    The floor is taken relative to the larger median (which implies |change| >= floor) so
    that swapping A and B exactly swaps "better" and "worse".
  * A median at or below the resolution the tool prints the metric in (sysbench's 0.01
    ms) is no measurement of a change: such a pair gets the verdict "below resolution",
    no change, and stays out of the multiplicity adjustment. Nor are medians one step of
    that resolution apart: rounding alone makes that of values however close (0.0349 and
    0.0351 print as 0.03 and 0.04); such a pair gets "~" with a note saying so, and stays
    out of the adjustment too.
  * A ratio interval from too few runs to be a CI is the runs' range (`interval_kind`);
    `faster_than_baseline` still flags a win whose range clears 1 by a margin, saying it
    could not be tested.

May import: numpy (through `vmtax.core.blas`), `vmtax.analysis.cpus` and the parts above.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, overload

from vmtax.analysis.cpus import map_on_cpus
from vmtax.analysis.intervals import IntervalKind, interval_kind, median_ci, percentile_ci
from vmtax.analysis.resampling import N_BOOT, Floats, boot_medians, median
from vmtax.analysis.significance import (
    adjust_pvalues,
    can_test,
    check_level,
    min_p_value,
    min_runs_to_detect,
    no_test,
    p_value,
)
from vmtax.core import blas

with blas.one_thread():   # numpy without OpenBLAS's spinning threads
    import numpy as np

# "too few runs": no verdict was possible at these run counts; "below resolution": a
# median is at or below the metric's printed resolution. Both explain themselves in `note`.
Verdict = Literal["better", "worse", "~", "too few runs", "below resolution"]
Action = Literal["more", "done", "gave_up"]
# With too few runs to test a win over the bare host, a ratio flagged as one must clear 1
# by more than this over its whole range: a few runs' noise alone gives a few percent.
SUSPICIOUS_MARGIN = 0.10


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    ci_low: float
    ci_high: float
    mean: float
    stdev: float | None  # sample stdev (ddof=1); None for n < 2
    cv: float | None  # stdev / |mean|; None for n < 2 or mean == 0
    ci_level: float  # actual coverage of [ci_low, ci_high]; below the request for small n

    @property
    def interval(self) -> IntervalKind:
        """[ci_low, ci_high] is a 95% CI, or with fewer runs (n < 6) the runs' range."""
        if self.n < 2:
            return "none"
        return "ci" if self.ci_level >= 0.95 - 1e-12 else "range"


@dataclass(frozen=True)
class RatioSummary:
    value: float  # < 1 always means worse than the baseline
    ci_low: float
    ci_high: float
    interval: IntervalKind = "ci"  # what [ci_low, ci_high] is (interval_kind)


@dataclass(frozen=True)
class Comparison:
    name: str
    median_a: float
    median_b: float
    change: float  # (median_b - median_a) / median_a, in the metric's own terms
    change_ci: tuple[float, float]  # (1 - alpha) bootstrap CI of change
    p_value: float  # raw two-sided p of `test`
    p_adjusted: float  # after Holm/BH across the comparisons it was judged with
    verdict: Verdict  # from B's point of view, in the metric's direction
    higher_is_better: bool
    n_a: int
    n_b: int
    min_p: float  # smallest p a rank test can produce at these sample sizes
    test: str = "mann-whitney"  # or "t-log" for samples too small for a rank test
    note: str = ""  # why the verdict is "too few runs" or "below resolution"
    interval: IntervalKind = "ci"  # what change_ci is (interval_kind)

    @property
    def significant(self) -> bool:
        return self.verdict in ("better", "worse")


class _Measured(NamedTuple):
    """One pair of compare_many, measured: its samples, medians, the change's bootstrap
    interval and its test's raw p."""
    name: str
    a: Floats
    b: Floats
    higher_is_better: bool
    median_a: float
    median_b: float
    ci: tuple[float, float]
    p: float
    test: str


def _sample(values: Iterable[float], what: str = "values") -> Floats:
    # list() lets generators through; np.asarray alone would wrap them as one object.
    x = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=float)
    if x.ndim != 1:
        raise ValueError(f"{what} must be a flat sequence of numbers, got shape {x.shape}")
    if x.size == 0:
        raise ValueError(f"{what} is empty: need at least one measurement")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{what} contains NaN or infinity: {x.tolist()}")
    return x


def summarize(values: Iterable[float], confidence: float = 0.95) -> Summary:
    """Median with a distribution-free CI plus mean/stdev/cv; ValueError on empty or
    non-finite input."""
    check_level(confidence)
    x = _sample(values)
    lo, hi, level = median_ci(x, confidence)
    mean = float(np.mean(x))
    stdev = float(np.std(x, ddof=1)) if x.size > 1 else None
    cv = stdev / abs(mean) if stdev is not None and mean != 0 else None
    return Summary(n=int(x.size), median=float(median(x)), ci_low=lo, ci_high=hi,
                   mean=mean, stdev=stdev, cv=cv, ci_level=level)


@overload
def _divide(num: Floats, den: Floats) -> Floats: ...
@overload
def _divide(num: float, den: float) -> float: ...
def _divide(num: Floats | float, den: Floats | float) -> Floats | float:
    """num / den elementwise, x/0 as inf and 0/0 as NaN, without numpy's warnings."""
    with np.errstate(divide="ignore", invalid="ignore"):
        quotient: Floats | float = np.divide(num, den)
        return quotient


def ratio(values: Iterable[float], baseline: Iterable[float], higher_is_better: bool,
          confidence: float = 0.95, seed: int = 0, n_boot: int = N_BOOT) -> RatioSummary:
    """Ratio of medians oriented so that < 1 means worse than the baseline.

    target/baseline when higher is better, baseline/target when lower is better (a
    doubled latency gives 0.5). A zero denominator median gives inf, 0/0 gives NaN.
    """
    check_level(confidence)
    t, b = _sample(values), _sample(baseline, "baseline")
    boot_t, boot_b = boot_medians(t, b, n_boot, seed)
    med_t, med_b = median(t), median(b)
    if higher_is_better:
        value, replicates = _divide(med_t, med_b), _divide(boot_t, boot_b)
    else:
        value, replicates = _divide(med_b, med_t), _divide(boot_b, boot_t)
    lo, hi = percentile_ci(replicates, confidence)
    return RatioSummary(value=float(value), ci_low=lo, ci_high=hi,
                        interval=interval_kind(t.size, b.size, confidence))


def compare_many(pairs: Sequence[tuple[str, Iterable[float], Iterable[float], bool]],
                 alpha: float = 0.01, noise_floor: float = 0.02,
                 method: Literal["holm", "bh"] = "bh", seed: int = 0,
                 n_boot: int = N_BOOT,
                 resolutions: Sequence[float | None] | None = None) -> list[Comparison]:
    """compare() for every (name, a, b, higher_is_better), judged with p-values adjusted
    across all of them (default BH, controlling the false discovery rate; "holm" controls
    the chance of any false call). Each pair's bootstrap uses the same `seed`, so a pair
    gets the same CI here as from compare(). `resolutions`, one per pair (None: unknown),
    are the steps the tool prints each metric in: a pair with a median at or below its
    resolution gets the verdict "below resolution"."""
    check_level(alpha, "alpha")
    if noise_floor < 0:
        raise ValueError(f"noise_floor must not be negative, got {noise_floor}")
    if resolutions is None:
        resolutions = [None] * len(pairs)
    if len(resolutions) != len(pairs):
        raise ValueError(f"{len(resolutions)} resolutions for {len(pairs)} pairs")

    def measured(pair: tuple[str, Iterable[float], Iterable[float], bool]) -> _Measured:
        name, a_values, b_values, higher_is_better = pair
        a, b = _sample(a_values, f"{name or 'A'} (A)"), _sample(b_values, f"{name or 'B'} (B)")
        boot_a, boot_b = boot_medians(a, b, n_boot, seed)
        return _Measured(name, a, b, bool(higher_is_better), float(median(a)),
                         float(median(b)), percentile_ci(_divide(boot_b, boot_a) - 1, 1 - alpha),
                         *p_value(a, b, alpha))

    # Each pair's bootstrap is seeded, so its answer does not depend on the thread; a
    # report's hundred pairs take half the time on two CPUs.
    raw = map_on_cpus(measured, pairs, least=8)
    below = [res is not None and min(r.median_a, r.median_b) <= res
             for r, res in zip(raw, resolutions)]
    # Medians one printed step apart or less: rounding to the step alone makes that of any
    # two values that straddle a rounding boundary, however close (0.0349 and 0.0351 ms
    # print as 0.03 and 0.04). bench-stats' A vs A runs saw "+33.3%, p=0" so.
    one_step = [res is not None and not below[i]
                and 0 < abs(r.median_b - r.median_a) <= res * (1 + 1e-9)
                for i, (r, res) in enumerate(zip(raw, resolutions))]
    tested = [i for i, r in enumerate(raw)
              if not no_test(r.a, r.b) and not below[i] and not one_step[i]]
    adjusted = [1.0] * len(raw)
    for i, p_adj in zip(tested, adjust_pvalues([raw[i].p for i in tested], method)):
        adjusted[i] = p_adj
    # The smallest p each pair's test can give: a rank test's floor, none for the t-test.
    floors = [min_p_value(r.a.size, r.b.size) if r.test == "mann-whitney" else 0.0
              for r in raw]
    # Holm multiplies the smallest p of all by the number of tests; BH leaves it as is
    # when every test gives it. Either way no adjusted p goes below the raw one.
    tests = max(1, len(tested))
    holm_floor = tests * min((floors[i] for i in tested), default=0.0)
    out = []
    for i, ((name, a, b, hib, med_a, med_b, ci, p, test), p_adj) in enumerate(
            zip(raw, adjusted)):
        change = float(_divide(med_b - med_a, med_a))
        significant = (p_adj < alpha and (ci[0] > 0 or ci[1] < 0)
                       and abs(med_b - med_a) >= noise_floor * max(abs(med_a), abs(med_b)))
        floor = max(floors[i], holm_floor) if method == "holm" else floors[i]
        verdict: Verdict = "~"
        note = ""
        if below[i]:
            verdict, change, ci = "below resolution", math.nan, (math.nan, math.nan)
            note = (f"a median is at or below the resolution {resolutions[i]:g} the tool "
                    f"prints this metric in (A {med_a:g}, B {med_b:g}): no change can be read")
        elif one_step[i]:
            note = (f"medians one step of the resolution the tool prints them in "
                    f"({resolutions[i]:g}) apart: rounding alone makes that of values however "
                    "close, so no change is called")
        elif significant:
            verdict = "better" if (med_b > med_a) == hib else "worse"
        elif test == "mann-whitney" and floor >= alpha:
            verdict = "too few runs"
            sizes = f"n={a.size} per side" if a.size == b.size else f"n={a.size} vs {b.size}"
            adjustment = (f" ({floor:.2g} after Holm's adjustment over {tests} tests)"
                          if floor > floors[i] else "")
            note = (f"{sizes}: the smallest possible p is {floors[i]:.2g}{adjustment}, not "
                    f"below α={alpha:g}; need ≥ "
                    f"{min_runs_to_detect(alpha, tests if method == 'holm' else 1)} runs")
        out.append(Comparison(name=name, median_a=med_a, median_b=med_b,
                              change=change, change_ci=ci,
                              p_value=p, p_adjusted=p_adj, verdict=verdict,
                              higher_is_better=hib, n_a=int(a.size), n_b=int(b.size),
                              min_p=min_p_value(a.size, b.size), test=test, note=note,
                              interval=interval_kind(a.size, b.size, 1 - alpha)))
    return out


def compare(a: Iterable[float], b: Iterable[float], higher_is_better: bool,
            alpha: float = 0.01, noise_floor: float = 0.02, seed: int = 0,
            n_boot: int = N_BOOT, name: str = "") -> Comparison:
    """Is B better or worse than A? A single comparison: p_adjusted == p_value."""
    return compare_many([(name, a, b, higher_is_better)], alpha, noise_floor,
                        seed=seed, n_boot=n_boot)[0]


def precise_enough(values: Iterable[float], ci_target: float = 0.02,
                   confidence: float = 0.95) -> bool:
    """Median CI half-width <= ci_target * |median|, with a CI that really reaches
    `confidence` (a [min, max] fallback never counts: at 95% that needs n >= 6)."""
    s = summarize(values, confidence)
    if s.ci_level < confidence - 1e-12 or s.median == 0:
        return False
    return (s.ci_high - s.ci_low) / 2 <= ci_target * abs(s.median)


def next_action(values: Iterable[float], min_runs: int, max_runs: int,
                ci_target: float = 0.02, confidence: float = 0.95) -> Action:
    """What the runner should do after the runs so far.

    "more" below min_runs, or while the median CI is wider than ci_target;
    "done" once precise_enough() holds; at max_runs it stops either way: "done" if
    precise, else "gave_up" (report the result, flagged as imprecise).
    """
    if not 1 <= min_runs <= max_runs:
        raise ValueError(f"need 1 <= min_runs <= max_runs, got {min_runs} and {max_runs}")
    x = _sample(values)
    if x.size < min_runs:
        return "more"
    if precise_enough(x, ci_target, confidence):
        return "done"
    return "gave_up" if x.size >= max_runs else "more"


def clock_skew(host_elapsed: float | None, guest_elapsed: float | None,
               tolerance: float = 0.02, overhead: float = 0.0,
               slack: float = 0.0) -> bool | None:
    """True if the guest's own timing of a run differs from the host's by more than
    `tolerance` (relative to the host), after taking off the host's fixed per-job
    `overhead` (channel round trip) and allowing `slack` seconds of timer jitter;
    None when either is missing or unusable."""
    if host_elapsed is None or guest_elapsed is None:
        return None
    if not (math.isfinite(host_elapsed) and math.isfinite(guest_elapsed)):
        return None
    host = host_elapsed - overhead
    if host <= 0 or guest_elapsed < 0:
        return None
    return abs(guest_elapsed - host) > max(tolerance * host, slack)


def noisy(summary: Summary, threshold: float = 0.05) -> bool:
    """cv above threshold; False when cv is undefined (n < 2 or mean 0)."""
    return summary.cv is not None and summary.cv > threshold


def faster_than_baseline(ratio_summary: RatioSummary, n: int, n_baseline: int,
                         confidence: float = 0.95) -> bool:
    """The target beat native, suspicious for a VM or container: at any run count.

    With runs enough for the interval to mean it (a rank test on n vs n_baseline runs
    could reach p <= 1 - confidence: 4 vs 4 or 3 vs 5 at 95%), when the whole ratio CI is
    above 1. With fewer the bootstrap interval is only the runs' range (at 2 vs 2 it lies
    above 1 whenever both target runs beat both baseline runs, by chance 1 in 6), so the
    win is flagged when that range clears 1 by more than SUSPICIOUS_MARGIN: a 7x win from
    two runs is no less suspicious for being untested (`can_test` says whether it was)."""
    check_level(confidence)
    if min(n, n_baseline) < 1:
        return False
    if can_test(n, n_baseline, confidence):
        return ratio_summary.ci_low > 1
    return min(ratio_summary.value, ratio_summary.ci_low) > 1 + SUSPICIOUS_MARGIN


def interleave(labels: Sequence[str], runs: int) -> list[str]:
    """Counterbalanced run order: `runs` blocks, each running every label once.

    Blocks alternate forward and reversed (A B, B A, A B, B A ...), so a linear drift adds
    the same total to every label over each pair of blocks. With more than two labels,
    each pair of blocks also rotates the starting label (ABC CBA, BCA ACB, CAB BAC ...)
    so no label is stuck in the middle or always follows the same one. For two labels a
    rotation is just the reversal, so the order stays A B B A A B B A.
    """
    if runs < 0:
        raise ValueError(f"runs must not be negative, got {runs}")
    if not labels or len(set(labels)) != len(labels):
        raise ValueError(f"labels must be non-empty and distinct, got {list(labels)}")
    k = len(labels)
    order: list[str] = []
    for block in range(runs):
        shift = block // 2 % k if k > 2 else 0
        base = list(labels[shift:]) + list(labels[:shift])
        order.extend(base if block % 2 == 0 else base[::-1])
    return order
