"""Intervals: a median's distribution-free confidence interval, a bootstrap's
percentile interval, and what either one is when there are few runs.

  * Medians, not means: benchmark samples have one-sided outliers (a slow first run, a
    noisy neighbour). The median CI is the exact distribution-free binomial interval
    [X(k), X(n+1-k)] (`median_ci`). Its best coverage is 1 - 2**(1-n), so 95% needs
    n >= 6 and 99% needs n >= 8; below that the CI is [min, max] and its real coverage
    (n=3: 0.75, n=1: 0) is given with it, never the requested one.
  * A ratio's or change's interval is the percentiles of its bootstrap replicates
    (`percentile_ci`, from `vmtax.analysis.resampling`). A zero denominator median gives
    inf (x/0) or NaN (0/0), and a NaN replicate makes the interval NaN.
  * A bootstrap interval from very few runs is narrower than its nominal level (at 2 vs 2
    a ratio CI above 1 only says that both target runs beat both baseline runs, which
    chance does 1 time in 6): below the run counts at which a rank test could reach the
    interval's level it is called the runs' range, never a CI (`interval_kind`).

May import: numpy (through `vmtax.core.blas`), `vmtax.analysis.significance`; nothing
else of vmtax.
"""

from __future__ import annotations

import math
from typing import Literal

from vmtax.analysis.significance import min_p_value
from vmtax.core import blas

with blas.one_thread():   # numpy without OpenBLAS's spinning threads
    import numpy as np

# What an interval is: a confidence interval that reaches its stated level ("ci"), the
# range the runs gave where there are too few runs for one ("range"), or nothing at all:
# one run a side ("none"). Every view names it so (interval_kind).
IntervalKind = Literal["ci", "range", "none"]


def median_ci(x: np.ndarray, confidence: float) -> tuple[float, float, float]:
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


def percentile_ci(replicates: np.ndarray, confidence: float) -> tuple[float, float]:
    """The k-th smallest and k-th largest replicate: mirror-symmetric, and no
    interpolation, so inf replicates survive as inf instead of turning into NaN."""
    if np.isnan(replicates).any():
        return math.nan, math.nan
    s = np.sort(replicates)
    k = int((s.size - 1) * (1 - confidence) / 2)
    return float(s[k]), float(s[s.size - 1 - k])


def interval_kind(n: int, n_other: int, confidence: float = 0.95) -> IntervalKind:
    """What a bootstrap interval of a ratio or change of medians from n against n_other
    runs is. A confidence interval only where a rank test on those runs could reach its
    level (4 vs 4 at 95%, 5 vs 5 at 99%): with fewer, the bootstrap's percentiles are the
    most extreme ratios the runs give (at 2 vs 2 exactly min/max to max/min), a range
    that covers the truth far less often than it claims. From one run a side, nothing."""
    if max(n, n_other) < 2:
        return "none"
    return "ci" if min_p_value(n, n_other) <= 1 - confidence else "range"
