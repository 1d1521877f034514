"""Significance tests: the p-value of a difference between two groups of runs, the most
any test can say at given run counts, and the adjustment for testing many at once.

  * p-values: two-sided Mann-Whitney U (rank based, so outliers cannot drive it). Exact
    distribution without ties; with ties an exact permutation test of U while it has at
    most MAX_EXACT_PERMUTATIONS arrangements, else the tie-corrected normal
    approximation. No seed needed.
  * Any rank or permutation test on n_a vs n_b runs has p >= 2 / C(n_a+n_b, n_a)
    (`min_p_value`): 3 vs 3 -> 0.1, 4 vs 4 -> 0.029, 5 vs 5 -> 0.0079. At alpha 0.01 a
    difference is only detectable with >= 5 runs per side, more when several metrics are
    adjusted together (`min_runs_to_detect`); with fewer runs a rank test can call
    nothing.
  * So with few runs (rank tests unable to reach alpha / 10, i.e. fewer than 7 vs 7 at
    alpha 0.01) the p-value comes from a t-test on log values instead (`p_value`): it
    assumes roughly log-normal noise, which suits rates and times, and can speak at 3 vs
    3. With equal run counts it is Student's pooled test (4 degrees of freedom at 3 vs 3,
    where Welch's has 2-4; with equal n it is robust to unequal variances), else Welch's.
    It needs T_LOG_MIN_RUNS runs a side: at 2 vs 2 it would rest on 2 degrees of freedom
    and an assumption two values cannot check.
  * Holm (family-wise error) or Benjamini-Hochberg (false discovery rate) adjust the
    p-values of many comparisons judged together (`adjust_pvalues`).

No scipy.stats (~0.6 s to import, more than a whole `vmtax compare` may take): the tests
here compute its p-values as it does; scripts/bench_stats.py (6.) checks them against it.

May import: numpy (through `vmtax.core.blas`); nothing else of vmtax.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

from vmtax.core import blas

with blas.one_thread():   # numpy without OpenBLAS's spinning threads
    import numpy as np

# Beyond this many arrangements the exact permutation test gets slow (~0.15 s here).
MAX_EXACT_PERMUTATIONS = 20_000
# Fewest runs per side for the t-test on logs (2 vs 2 leaves it 2 degrees of freedom).
T_LOG_MIN_RUNS = 3


def check_level(confidence: float, what: str = "confidence") -> None:
    """A confidence level or an alpha: strictly between 0 and 1, else ValueError."""
    if not 0 < confidence < 1:
        raise ValueError(f"{what} must be between 0 and 1, got {confidence}")


def mann_whitney_p(a: np.ndarray, b: np.ndarray) -> float:
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
    elif math.comb(a.size + b.size, a.size) <= MAX_EXACT_PERMUTATIONS:
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


def t_log_p(a: np.ndarray, b: np.ndarray) -> float:
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


def p_value(a: np.ndarray, b: np.ndarray, alpha: float) -> tuple[float, str]:
    """Mann-Whitney when the sample sizes let a rank test speak at alpha (with room for a
    multiplicity adjustment); else a t-test on logs, for positive samples of 3+ runs each."""
    small = min_p_value(a.size, b.size) >= alpha / 10
    if small and min(a.size, b.size) >= T_LOG_MIN_RUNS and (a > 0).all() and (b > 0).all():
        return t_log_p(a, b), "t-log"
    return mann_whitney_p(a, b), "mann-whitney"


def no_test(a: np.ndarray, b: np.ndarray) -> bool:
    """The same constant on both sides: nothing to test."""
    return bool(np.ptp(a) == 0 and np.ptp(b) == 0 and a[0] == b[0])


def min_p_value(n_a: int, n_b: int) -> float:
    """Smallest two-sided p any rank/permutation test can give for n_a vs n_b runs."""
    return min(1.0, 2 / float(math.comb(n_a + n_b, n_a)))


def min_runs_to_detect(alpha: float = 0.01, tests: int = 1) -> int:
    """Fewest runs per side (equal sides) for which p < alpha / tests is attainable.

    alpha / tests is what Holm (and BH, when only one of `tests` metrics changed)
    demands of the smallest p. alpha 0.01: 1 test -> 5 runs, 2-4 -> 6, 5-17 -> 7.
    """
    check_level(alpha, "alpha")
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


def can_test(n: int, n_baseline: int, confidence: float = 0.95) -> bool:
    """Whether n against n_baseline runs can test a difference at `confidence` at all."""
    return min(n, n_baseline) >= 1 and min_p_value(n, n_baseline) <= 1 - confidence
