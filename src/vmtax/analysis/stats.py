"""Statistics behind every vmtax table, comparison and report.

Public API
    summarize(values, confidence)            -> Summary: median with an order-statistic CI
    ratio(values, baseline, higher_is_better) -> RatioSummary: direction-aware ratio of medians
    compare(a, b, higher_is_better)           -> Comparison: is B better/worse than A?
    compare_many(pairs, ..., method)          -> [Comparison] with multiplicity-adjusted p
    adjust_pvalues(p_values, method)          -> Holm or Benjamini-Hochberg adjusted p
    min_runs_to_detect(alpha, tests)          -> runs per side needed to ever reach p < alpha
    min_p_value(n_a, n_b)                     -> smallest p a rank test can give at n_a vs n_b
    precise_enough / next_action              -> adaptive repetition
    interval_kind(n, n_other)                 -> "ci", "range" or "none": what an interval is
    bracket(kind, low, high)                  -> that interval as every view writes it
    can_test(n, n_baseline)                   -> whether those runs can test a difference
    clock_skew / noisy / faster_than_baseline -> sanity flags
    interleave(labels, runs)                  -> counterbalanced run order

Methods and why
  * Medians, not means: benchmark samples have one-sided outliers (a slow first run, a
    noisy neighbour). The median CI is the exact distribution-free binomial interval
    [X(k), X(n+1-k)]. Its best coverage is 1 - 2**(1-n), so 95% needs n >= 6 and 99%
    needs n >= 8; below that the CI is [min, max] and `ci_level` reports its real
    coverage (n=3: 0.75, n=1: 0), never the requested one.
  * Ratios and changes get percentile-bootstrap CIs, each group resampled independently
    from a seeded generator. They assume positive quantities (times, rates); a zero
    denominator median gives inf (x/0) or NaN (0/0), and a NaN replicate makes the CI NaN.
  * p-values: two-sided Mann-Whitney U (rank based, so outliers cannot drive it). Exact
    distribution without ties; with ties an exact permutation test of U while it has at
    most 20,000 arrangements, else the tie-corrected normal approximation. No seed needed.
  * Any rank or permutation test on n_a vs n_b runs has p >= 2 / C(n_a+n_b, n_a):
    3 vs 3 -> 0.1, 4 vs 4 -> 0.029, 5 vs 5 -> 0.0079. At alpha 0.01 a difference is only
    detectable with >= 5 runs per side, more when several metrics are adjusted together
    (`min_runs_to_detect`); with fewer runs a rank test can call nothing.
  * So with few runs (rank tests unable to reach alpha / 10, i.e. fewer than 7 vs 7 at
    alpha 0.01) the p-value comes from a t-test on log values instead: it assumes roughly
    log-normal noise, which suits rates and times, and can speak at 3 vs 3. With equal
    run counts it is Student's pooled test (4 degrees of freedom at 3 vs 3, where Welch's
    has 2-4; with equal n it is robust to unequal variances), else Welch's. It needs 3
    runs a side: at 2 vs 2 it would rest on 2 degrees of freedom and an assumption two
    values cannot check. `Comparison.test` says which test gave p.
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
  * A bootstrap interval from very few runs is narrower than its nominal level (at 2 vs 2
    a ratio CI above 1 only says that both target runs beat both baseline runs, which
    chance does 1 time in 6): below the run counts at which a rank test could reach the
    interval's level it is called the runs' range, never a CI (`interval_kind`), and
    `faster_than_baseline` still flags a win whose range clears 1 by a margin, saying it
    could not be tested.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from vmtax.analysis.cpus import map_on_cpus
from vmtax.core import blas

with blas.one_thread():
    import numpy as np

# No scipy.stats (~0.6 s to import, more than a whole `vmtax compare` may take): the tests
# below compute its p-values as it does; scripts/bench_stats.py (6.) checks them against it.

N_BOOT = 10_000
# Beyond this many arrangements the exact permutation test gets slow (~0.15 s here).
_MAX_EXACT_PERMUTATIONS = 20_000
# Fewest runs per side for the t-test on logs (2 vs 2 leaves it 2 degrees of freedom).
T_LOG_MIN_RUNS = 3

# "too few runs": no verdict was possible at these run counts; "below resolution": a
# median is at or below the metric's printed resolution. Both explain themselves in `note`.
Verdict = Literal["better", "worse", "~", "too few runs", "below resolution"]
Action = Literal["more", "done", "gave_up"]
# What an interval is: a confidence interval that reaches its stated level ("ci"), the
# range the runs gave where there are too few runs for one ("range"), or nothing at all:
# one run a side ("none"). Every view names it so (interval_kind).
IntervalKind = Literal["ci", "range", "none"]
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


def _sample(values: Iterable[float], what: str = "values") -> np.ndarray:
    # list() lets generators through; np.asarray alone would wrap them as one object.
    x = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=float)
    if x.ndim != 1:
        raise ValueError(f"{what} must be a flat sequence of numbers, got shape {x.shape}")
    if x.size == 0:
        raise ValueError(f"{what} is empty: need at least one measurement")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{what} contains NaN or infinity: {x.tolist()}")
    return x


def _check_level(confidence: float, what: str = "confidence") -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"{what} must be between 0 and 1, got {confidence}")


def _median_ci(x: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """Narrowest symmetric order-statistic interval with coverage >= confidence.

    [X(k), X(n+1-k)] covers the population median with probability
    1 - 2 * P(Binomial(n, 1/2) <= k - 1), whatever the distribution.
    """
    s = np.sort(x)
    n = s.size
    k = np.arange(1, (n + 1) // 2 + 1)
    # P(B <= k - 1), summed in integers and divided exactly: 2.0 ** n overflows a float
    # from n = 1024 (a run of that many repetitions of one cell crashed `vmtax show`).
    total, below = 2 ** n, 0
    cdf = np.empty(k.size)
    for i in range(k.size):
        below += math.comb(n, i)
        cdf[i] = below / total
    coverage = 1 - 2 * cdf
    # Coverages are multiples of 2**-n; the slack absorbs cdf rounding at exact ties.
    ok = np.flatnonzero(coverage >= confidence - 1e-12)
    i = ok[-1] if ok.size else 0  # no interval is good enough: fall back to [min, max]
    return float(s[k[i] - 1]), float(s[n - k[i]]), float(coverage[i])


def summarize(values: Iterable[float], confidence: float = 0.95) -> Summary:
    """Median with a distribution-free CI plus mean/stdev/cv; ValueError on empty or
    non-finite input."""
    _check_level(confidence)
    x = _sample(values)
    lo, hi, level = _median_ci(x, confidence)
    mean = float(np.mean(x))
    stdev = float(np.std(x, ddof=1)) if x.size > 1 else None
    cv = stdev / abs(mean) if stdev is not None and mean != 0 else None
    return Summary(n=int(x.size), median=float(_median(x)), ci_low=lo, ci_high=hi,
                   mean=mean, stdev=stdev, cv=cv, ci_level=level)


def _boot_medians(x: np.ndarray, y: np.ndarray, n_boot: int,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap medians of x and of y, each group resampled independently.

    The two draws go to the groups in a canonical order of their data rather than by
    argument position, so swapping x and y swaps the replicates exactly and compare()
    stays symmetric.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot must be at least 1, got {n_boot}")
    swap = (y.size, tuple(np.sort(y))) < (x.size, tuple(np.sort(x)))
    first, second = (y, x) if swap else (x, y)
    # Draws of a cell-sized pair are kept: every metric of a comparison has those sizes.
    draw = _draws if n_boot * (first.size + second.size) <= 1 << 20 else _draws.__wrapped__
    picks = draw(seed, n_boot, first.size, second.size)
    m1, m2 = _row_medians(first[picks[0]]), _row_medians(second[picks[1]])
    return (m2, m1) if swap else (m1, m2)


@functools.lru_cache(maxsize=16)
def _draws(seed: int, n_boot: int, first: int, second: int) -> tuple[np.ndarray, np.ndarray]:
    """Which positions each bootstrap replicate takes: rng.choice(values, size) draws
    positions whatever the values are, so one draw serves every pair of these sizes."""
    rng = np.random.default_rng(seed)
    return (rng.choice(first, size=(n_boot, first)),
            rng.choice(second, size=(n_boot, second)))


# Rows of at most this many values, this many rows or more: _sorted_columns beats a sort.
_NETWORK_COLUMNS = 7
_NETWORK_ROWS = 512


def _row_medians(samples: np.ndarray) -> np.ndarray:
    """np.median(samples, axis=1), bit for bit (the middle value, or the mean of the two
    middle ones), for finite rows; sorting short rows is twice as fast as its partition.
    Its mean adds to 0.0 first, so a middle -0.0 is 0.0 as np.median gives it. Sorts
    samples in place (a long segment's replicates are tens of megabytes to copy), or
    leaves them as they were when they are many rows of a few values."""
    rows, size = samples.shape
    if rows >= _NETWORK_ROWS and 2 <= size <= _NETWORK_COLUMNS:
        columns = _sorted_columns(samples)
    else:
        samples.sort(axis=1)
        columns = list(samples.T)
    half = size // 2
    return (columns[half] + 0.0 if size % 2 else
            (columns[half - 1] + columns[half] + 0.0) / 2)


def _sorted_columns(samples: np.ndarray) -> list[np.ndarray]:
    """The columns of samples with each row sorted, by compare-exchanges of whole columns
    (odd-even transposition): for a bootstrap's 10,000 resamples of a run's 5
    repetitions four times as fast as sorting each row. The same values in the same
    places (as equal values, -0.0 and 0.0 may trade places)."""
    columns = list(np.ascontiguousarray(samples.T))
    low = np.empty(samples.shape[0])
    for step in range(len(columns)):
        for i in range(step % 2, len(columns) - 1, 2):
            np.minimum(columns[i], columns[i + 1], out=low)
            np.maximum(columns[i], columns[i + 1], out=columns[i + 1])
            columns[i], low = low, columns[i]
    return columns


def _median(x: np.ndarray) -> np.floating:
    """np.median(x) of a finite sample, bit for bit, without the NaN check that loads
    numpy.ma (~6 ms of a `vmtax show`)."""
    return _row_medians(np.array(x)[np.newaxis])[0]  # type: ignore[no-any-return]


def _percentile_ci(replicates: np.ndarray, confidence: float) -> tuple[float, float]:
    """The k-th smallest and k-th largest replicate: mirror-symmetric, and no
    interpolation, so inf replicates survive as inf instead of turning into NaN."""
    if np.isnan(replicates).any():
        return math.nan, math.nan
    s = np.sort(replicates)
    k = int((s.size - 1) * (1 - confidence) / 2)
    return float(s[k]), float(s[s.size - 1 - k])


def _divide(num, den):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.divide(num, den)


def ratio(values: Iterable[float], baseline: Iterable[float], higher_is_better: bool,
          confidence: float = 0.95, seed: int = 0, n_boot: int = N_BOOT) -> RatioSummary:
    """Ratio of medians oriented so that < 1 means worse than the baseline.

    target/baseline when higher is better, baseline/target when lower is better (a
    doubled latency gives 0.5). A zero denominator median gives inf, 0/0 gives NaN.
    """
    _check_level(confidence)
    t, b = _sample(values), _sample(baseline, "baseline")
    boot_t, boot_b = _boot_medians(t, b, n_boot, seed)
    med_t, med_b = _median(t), _median(b)
    if higher_is_better:
        value, replicates = _divide(med_t, med_b), _divide(boot_t, boot_b)
    else:
        value, replicates = _divide(med_b, med_t), _divide(boot_b, boot_t)
    lo, hi = _percentile_ci(replicates, confidence)
    return RatioSummary(value=float(value), ci_low=lo, ci_high=hi,
                        interval=interval_kind(t.size, b.size, confidence))


def interval_kind(n: int, n_other: int, confidence: float = 0.95) -> IntervalKind:
    """What a bootstrap interval of a ratio or change of medians from n against n_other
    runs is. A confidence interval only where a rank test on those runs could reach its
    level (4 vs 4 at 95%, 5 vs 5 at 99%): with fewer, the bootstrap's percentiles are the
    most extreme ratios the runs give (at 2 vs 2 exactly min/max to max/min), a range
    that covers the truth far less often than it claims. From one run a side, nothing."""
    if max(n, n_other) < 2:
        return "none"
    return "ci" if min_p_value(n, n_other) <= 1 - confidence else "range"


def _mann_whitney_p(a: np.ndarray, b: np.ndarray) -> float:
    """scipy.stats.mannwhitneyu's two-sided p (exact, normal approximation, or its
    permutation test over every arrangement), computed here as it computes them:
    scipy.stats costs ~0.6 s to import; bench_stats checks the two agree."""
    pooled = np.concatenate([a, b])
    ranks, ties = _mid_ranks(pooled)
    tied = bool((ties > 1).any())
    if not tied and min(a.size, b.size) <= 8:
        method = "exact"   # what scipy's "auto" picks without ties
    elif not tied:
        method = "asymptotic"
    elif min(a.size, b.size) == 1:
        # scipy's permutation test needs two runs per side. Under the null the lone run is
        # equally likely to hold any of the pooled (mid)ranks, which is the whole test.
        r = ranks[0] if a.size == 1 else ranks[-1]
        return float(min(1.0, 2 * min(np.mean(ranks >= r), np.mean(ranks <= r))))
    elif math.comb(a.size + b.size, a.size) <= _MAX_EXACT_PERMUTATIONS:
        # scipy's "exact" ignores ties and the normal approximation is too optimistic
        # for tiny samples, so enumerate every arrangement instead.
        return _permutation_p(ranks, a.size)
    else:
        method = "asymptotic"
    n1, n2 = a.size, b.size
    u1 = np.sum(ranks[:n1]) - n1 * (n1 + 1) / 2
    u = max(u1, n1 * n2 - u1)
    if method == "exact":
        p = _mwu_sf(int(u), n1, n2)
    else:
        tie_term = np.sum(ties ** 3 - ties)
        sd = np.sqrt(n1 * n2 / 12 * ((n1 + n2 + 1) - tie_term / ((n1 + n2) * (n1 + n2 - 1))))
        p = _normal_cdf(-float((u - n1 * n2 / 2 - 0.5) / sd))
    return float(np.clip(2 * p, 0.0, 1.0))


def _permutation_p(ranks: np.ndarray, n1: int) -> float:
    """The two-sided p of U over every arrangement of the pooled (mid)ranks, as
    scipy.stats.permutation_test gives it for mannwhitneyu (its tolerance of 100 ulps
    around the observed U included): the share of arrangements whose U lies at or beyond
    the observed one on the rarer side, doubled."""
    arrangements = np.array(list(itertools.combinations(range(ranks.size), n1)))
    null = ranks[arrangements].sum(axis=1) - n1 * (n1 + 1) / 2
    observed = np.sum(ranks[:n1]) - n1 * (n1 + 1) / 2
    gamma = abs(np.finfo(float).eps * 100 * observed)
    less = np.count_nonzero(null <= observed + gamma) / len(null)
    greater = np.count_nonzero(null >= observed - gamma) / len(null)
    return float(min(1.0, min(less, greater) * 2))


def _mid_ranks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """scipy.stats.rankdata's average ranks, and the size of each group of equal values
    (at its first, 0 elsewhere)."""
    order = np.argsort(x, kind="stable")
    ordered = x[order]
    starts = np.concatenate([[True], ordered[:-1] != ordered[1:]])
    first = np.arange(x.size)[starts]
    counts = np.diff(first, append=x.size)
    ranks = np.empty(x.size)
    ranks[order] = np.repeat(np.arange(1, x.size + 1, dtype=float)[starts]
                             + (counts.astype(float) - 1) / 2, counts)
    ties = np.zeros(x.size)
    ties[starts] = counts
    return ranks, ties


def _mwu_sf(u: int, n1: int, n2: int) -> float:
    """P(U >= u) for u >= n1 n2 / 2 without ties: scipy's _MWU.sf, by the same recurrence
    for the counts of arrangements (Andrews & Andrews), in the same order of operations."""
    n1, n2 = min(n1, n2), max(n1, n2)
    low = n1 * n2 - u   # by symmetry, P(U >= u) = P(U <= n1 n2 - u)
    sigma = np.zeros(low + 1, dtype=int)
    for d in np.arange(1, n1 + 1):
        sigma[np.arange(d, low + 1, d)] += d
    for d in np.arange(n2 + 1, n2 + n1 + 1):
        sigma[np.arange(d, low + 1, d)] -= d
    sigma = sigma[1:]
    counts = np.zeros(low + 1, dtype=np.uint64)
    counts[0] = 1
    for k in np.arange(1, low + 1):
        counts[k] = np.dot(counts[:k], sigma[k - 1::-1]) / k
    return float(np.cumsum(counts / _binom(n1 + n2, n1))[low])


def _binom(n: int, k: int) -> float:
    """scipy.special.binom for whole k < 20 (the exact test's n1 <= 8), as it multiplies."""
    k = min(k, n - k)
    num = den = 1.0
    for i in range(1, k + 1):
        num *= i + n - k
        den *= i
        if abs(num) > 1e50:
            num, den = num / den, 1.0
    return num / den


def _normal_cdf(x: float) -> float:
    """scipy.special.ndtr's formula (cephes), on the C library's erf and erfc."""
    t = x * math.sqrt(0.5)
    if abs(t) < math.sqrt(0.5):
        return 0.5 + 0.5 * math.erf(t)
    y = 0.5 * math.erfc(abs(t))
    return 1.0 - y if t > 0 else y


def _t_log_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p of Student's (equal n) or Welch's t-test on the logs: scipy's
    ttest_ind's statistic and degrees of freedom, computed as it does, with the t tail
    from _t_sf (scipy.stats costs ~0.6 s to import; bench_stats checks the two agree)."""
    la, lb = np.log(a), np.log(b)
    if np.ptp(la) == 0 and np.ptp(lb) == 0:
        # Both samples constant (quantized metrics): any difference is systematic.
        return 1.0 if la[0] == lb[0] else 0.0
    n1, n2 = float(la.size), float(lb.size)
    v1 = np.mean((la - np.mean(la)) ** 2) * (n1 / (n1 - 1))
    v2 = np.mean((lb - np.mean(lb)) ** 2) * (n2 / (n2 - 1))
    if a.size == b.size:
        df = n1 + n2 - 2.0
        denom = np.sqrt(((n1 - 1) * v1 + (n2 - 1) * v2) / df * (1.0 / n1 + 1.0 / n2))
    else:
        vn1, vn2 = v1 / n1, v2 / n2
        with np.errstate(divide="ignore", invalid="ignore"):
            df = (vn1 + vn2) ** 2 / (vn1 ** 2 / (n1 - 1) + vn2 ** 2 / (n2 - 1))
        df = 1.0 if np.isnan(df) else df
        denom = np.sqrt(vn1 + vn2)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = float(np.divide(np.mean(la) - np.mean(lb), denom))
    return 2 * _t_sf(abs(t), float(df))


def _t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with df degrees of freedom, t >= 0: half the regularized
    incomplete beta I_x(df/2, 1/2) at x = df / (df + t²)."""
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    t2 = t * t
    return 0.5 * _betainc(df / 2, 0.5, df / (df + t2), t2 / (df + t2))


@functools.lru_cache(maxsize=64)   # a trend asks it again for every series of a length
def t_isf(p: float, df: float) -> float:
    """The t with P(T > t) = p, 0 < p <= 0.5, for Student's t with df degrees of freedom:
    _t_sf inverted by bisection (it falls as t grows)."""
    low, high = 0.0, 1.0
    while _t_sf(high, df) > p:
        low, high = high, high * 2
    for _ in range(200):
        mid = (low + high) / 2
        if _t_sf(mid, df) > p:
            low = mid
        else:
            high = mid
        if high - low <= 1e-12 * high:
            break
    return (low + high) / 2


def _betainc(a: float, b: float, x: float, y: float) -> float:
    """The regularized incomplete beta I_x(a, b), y = 1 - x given exactly: Lentz's
    continued fraction (Numerical Recipes 6.4) on whichever side converges fast."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, y, x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log(y)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 1000):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-16:
            break
    return front * f


def _p_value(a: np.ndarray, b: np.ndarray, alpha: float) -> tuple[float, str]:
    """Mann-Whitney when the sample sizes let a rank test speak at alpha (with room for a
    multiplicity adjustment); else a t-test on logs, for positive samples of 3+ runs each."""
    small = min_p_value(a.size, b.size) >= alpha / 10
    if small and min(a.size, b.size) >= T_LOG_MIN_RUNS and (a > 0).all() and (b > 0).all():
        return _t_log_p(a, b), "t-log"
    return _mann_whitney_p(a, b), "mann-whitney"


def _no_test(a: np.ndarray, b: np.ndarray) -> bool:
    """The same constant on both sides: nothing to test."""
    return np.ptp(a) == 0 and np.ptp(b) == 0 and a[0] == b[0]


def min_p_value(n_a: int, n_b: int) -> float:
    """Smallest two-sided p any rank/permutation test can give for n_a vs n_b runs."""
    return min(1.0, 2 / float(math.comb(n_a + n_b, n_a)))


def min_runs_to_detect(alpha: float = 0.01, tests: int = 1) -> int:
    """Fewest runs per side (equal sides) for which p < alpha / tests is attainable.

    alpha / tests is what Holm (and BH, when only one of `tests` metrics changed)
    demands of the smallest p. alpha 0.01: 1 test -> 5 runs, 2-4 -> 6, 5-17 -> 7.
    """
    _check_level(alpha, "alpha")
    if tests < 1:
        raise ValueError(f"tests must be at least 1, got {tests}")
    n = 1
    while min_p_value(n, n) >= alpha / tests:
        n += 1
    return n


def adjust_pvalues(p_values: Sequence[float], method: str = "bh") -> list[float]:
    """Holm (family-wise error) or Benjamini-Hochberg (false discovery rate) adjustment."""
    p = np.asarray(p_values, dtype=float)
    if p.size == 0:
        return []
    if method == "bh":
        # scipy.stats.false_discovery_control's steps, in its order of operations.
        if p.size == 1:
            return [float(p[0])]
        order = np.argsort(p, kind="stable")
        steps = p[order] * (p.size / np.arange(1, p.size + 1, dtype=float))
        np.minimum.accumulate(steps[::-1], out=steps[::-1])
        adjusted = np.empty_like(p)
        adjusted[order] = steps
        return [float(v) for v in np.clip(adjusted, 0.0, 1.0)]
    if method == "holm":
        order = np.argsort(p)
        steps = np.minimum(1.0, (p.size - np.arange(p.size)) * p[order])
        adjusted = np.empty_like(p)
        adjusted[order] = np.maximum.accumulate(steps)
        return [float(v) for v in adjusted]
    raise ValueError(f"method must be 'holm' or 'bh', got {method!r}")


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
    _check_level(alpha, "alpha")
    if noise_floor < 0:
        raise ValueError(f"noise_floor must not be negative, got {noise_floor}")
    if resolutions is None:
        resolutions = [None] * len(pairs)
    if len(resolutions) != len(pairs):
        raise ValueError(f"{len(resolutions)} resolutions for {len(pairs)} pairs")

    def measured(pair: tuple[str, Iterable[float], Iterable[float], bool]) -> tuple:
        name, a_values, b_values, higher_is_better = pair
        a, b = _sample(a_values, f"{name or 'A'} (A)"), _sample(b_values, f"{name or 'B'} (B)")
        boot_a, boot_b = _boot_medians(a, b, n_boot, seed)
        return (name, a, b, bool(higher_is_better), float(_median(a)), float(_median(b)),
                _percentile_ci(_divide(boot_b, boot_a) - 1, 1 - alpha), *_p_value(a, b, alpha))

    # Each pair's bootstrap is seeded, so its answer does not depend on the thread; a
    # report's hundred pairs take half the time on two CPUs.
    raw = map_on_cpus(measured, pairs, least=8)
    below = [res is not None and min(r[4], r[5]) <= res for r, res in zip(raw, resolutions)]
    # Medians one printed step apart or less: rounding to the step alone makes that of any
    # two values that straddle a rounding boundary, however close (0.0349 and 0.0351 ms
    # print as 0.03 and 0.04). bench-stats' A vs A runs saw "+33.3%, p=0" so.
    one_step = [res is not None and not below[i] and 0 < abs(r[5] - r[4]) <= res * (1 + 1e-9)
                for i, (r, res) in enumerate(zip(raw, resolutions))]
    tested = [i for i, r in enumerate(raw)
              if not _no_test(r[1], r[2]) and not below[i] and not one_step[i]]
    adjusted = [1.0] * len(raw)
    for i, p_adj in zip(tested, adjust_pvalues([raw[i][-2] for i in tested], method)):
        adjusted[i] = p_adj
    # The smallest p each pair's test can give: a rank test's floor, none for the t-test.
    floors = [min_p_value(r[1].size, r[2].size) if r[-1] == "mann-whitney" else 0.0
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
    _check_level(confidence)
    if min(n, n_baseline) < 1:
        return False
    if can_test(n, n_baseline, confidence):
        return ratio_summary.ci_low > 1
    return min(ratio_summary.value, ratio_summary.ci_low) > 1 + SUSPICIOUS_MARGIN


def can_test(n: int, n_baseline: int, confidence: float = 0.95) -> bool:
    """Whether n against n_baseline runs can test a difference at `confidence` at all."""
    return min(n, n_baseline) >= 1 and min_p_value(n, n_baseline) <= 1 - confidence


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
