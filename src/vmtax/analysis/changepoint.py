"""Change points in a series of runs: when did a metric move, with what effect, how sure.

A series is one metric of one target × workload over runs that repeat (a name's runs, in
time order); each point is one run and holds that run's measured repetitions. The method
is binary segmentation with a rank statistic and a permutation test:

- Each point is reduced to the median of its repetitions. Repetitions of one run share
  its conditions (host state, boot, page cache), so the points, not the pooled
  repetitions, are the units of the test and of the effect's interval; pooling them would
  claim more evidence than a series holds.
- Whether a stretch of points holds a change is tested on ranks: for every split leaving
  at least `min_segment` points on both sides, the standardized rank sum of the left side
  (Mann-Whitney's statistic over the point medians); the largest in absolute value is
  compared with the same maximum over permuted orders of the points (`permutations`,
  seeded, so a series always gets the same answer), which accounts for having searched
  every split and lets no single outlier decide.
- Where the change is, is placed by least squares on the logs of the point medians (the
  likeliest single shift), which weighs how far points lie and not only their order.
- A split is a change only if its p-value is at most `alpha` AND its effect passes the
  gate: the ratio of the two segments' medians is at least `noise_floor` away from 1 and
  its bootstrap interval excludes 1. A stationary but noisy or bimodal series can reach
  a small p-value by chance ordering; it rarely passes both.
- Segments on either side of a change are searched again, until no split passes.

Guards from trackers of such tools: `min_segment` points on each side means a single
spike is never a change, and a point near either end of the series cannot be called
until enough points follow it. p-values are raw here; `adjust` applies Benjamini-Hochberg
or Holm across everything a report judges together (series × metrics), as `compare` does.

What the test can call is said from the test itself, never from `min_segment` alone: a rank
test of a points against b cannot go below a floor whatever the step (3 against 3: 20
orders, p >= 0.1, so at alpha 0.05 never). `step_p` is the largest p-value a clean step of
a and b points can get (its order within each side is free), `calls` whether that passes
alpha, `runs_each_side` the sides from which on every clean step is called, and
`Detection.points_needed` how many more points a series needs before any could be.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from vmtax.analysis import significance, stats
from vmtax.analysis.cpus import map_on_cpus
from vmtax.core import blas

with blas.one_thread():   # numpy without OpenBLAS's spinning threads
    import numpy as np
    import numpy.typing as npt

Floats = npt.NDArray[np.float64]

MIN_SEGMENT = 3
# 2 / (1 + PERMUTATIONS) is the smallest p-value (two statistics): small enough to survive
# adjusting across 125 series twice over; detect_many draws more for more series.
PERMUTATIONS = 9999
_BATCH_CELLS = 2_000_000    # permuted statistics per batch (memory)
_GRID = 48                  # at most this many stretch ends are tried per side
_EXCEEDANCES = 50


@dataclass(frozen=True)
class Change:
    index: int                 # the first point of the new segment
    before: float              # median of the point medians of the segment before
    after: float               # ... and of the segment from `index` on
    ratio: float               # after / before (raw, not direction-oriented)
    ci: tuple[float, float]    # 95% bootstrap interval of `ratio`
    p_value: float             # permutation p of the split, raw
    p_adjusted: float | None = None   # after `adjust`, across what was judged together

    @property
    def change(self) -> float:
        """The relative change, after vs before: +0.05 is 5% higher."""
        return self.ratio - 1


@dataclass(frozen=True)
class Detection:
    points: int
    changes: tuple[Change, ...]
    min_segment: int
    # Every test made, a change called or not: what an adjustment counts.
    p_values: tuple[float, ...] = ()
    alpha: float = 0.01
    permutations: int = PERMUTATIONS

    @property
    def points_needed(self) -> int:
        """How many more points before a clean step somewhere in the series could be
        called at alpha (0: enough now), before the adjustment across series."""
        return points_needed(self.points, self.alpha, self.min_segment, self.permutations)

    def segments(self) -> list[tuple[int, int]]:
        """[start, end) of each stretch without a change, oldest first."""
        bounds = [0, *(c.index for c in self.changes), self.points]
        return list(zip(bounds[:-1], bounds[1:]))


def _distinct(a: np.ndarray) -> np.ndarray:
    """np.unique of integers, which loads numpy.ma (~8 ms of a `vmtax trend`)."""
    a = np.sort(a)
    return a[np.r_[True, a[1:] != a[:-1]]]


@functools.lru_cache(maxsize=32)   # a trend's series are mostly of one length
def _intervals(n: int, min_segment: int, step: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Candidate stretches [i, j) that differ from the rest: at least `min_segment` points
    inside and outside, and each outside piece empty or at least `min_segment` long; i = 0
    or j = n is a single change, others a change and its recovery. `step` thins the grid
    of ends for long series. Read-only: they are shared."""
    ends = _distinct(np.r_[np.arange(0, n + 1, step), n])
    i, j = np.meshgrid(ends, ends, indexing="ij")
    inside = j - i
    ok = ((inside >= min_segment) & (n - inside >= min_segment)
          & ((i == 0) | (i >= min_segment)) & ((j == n) | (n - j >= min_segment)))
    i, j = i[ok], j[ok]
    i.flags.writeable = j.flags.writeable = False
    return i, j


class _Stretches:
    """The stretches of one kind that a test takes the largest statistic over: each as the
    positions of its two ends among the grid's ends, and its statistic's scale."""

    _CHUNK = 64   # stretches at a time, in the order of their thresholds

    def __init__(self, ends: np.ndarray, i: np.ndarray, j: np.ndarray, n: int):
        self.starts, self.stops = np.searchsorted(ends, i), np.searchsorted(ends, j)
        inside = j - i
        self.scale = np.sqrt(inside * (n - inside) * (n + 1) / 12)

    def largest(self, centred: np.ndarray) -> float:
        """Of `centred` (_centred_sums at the grid's ends), the largest |standardized rank
        sum| over the stretches: Mann-Whitney's statistic, inside vs outside."""
        return float((np.abs(centred[self.stops] - centred[self.starts]) / self.scale).max())

    def reaching(self, centred: np.ndarray, observed: float) -> int:
        """How many rows of `centred` have a stretch whose statistic is at least `observed`:
        exactly the rows whose `largest` is, with most statistics never computed. A row's
        sums are halves of integers, so their differences are exact and none exceeds the
        row's range; and |d| / scale >= observed holds from a threshold of |d| on (a
        correctly rounded division is monotone). So a stretch whose threshold lies above a
        row's range cannot reach it: a row is only tried on the stretches below its
        range, those with the lowest thresholds first, until one reaches."""
        if observed <= 0:
            return len(centred)
        threshold = self._thresholds(observed)
        order = np.argsort(threshold, kind="stable")
        threshold, starts, stops = threshold[order], self.starts[order], self.stops[order]
        span = centred.max(axis=1) - centred.min(axis=1)
        reached, open_rows = 0, np.arange(len(centred))
        for at in range(0, len(threshold), self._CHUNK):
            open_rows = open_rows[span[open_rows] >= threshold[at]]   # the rest cannot
            if not open_rows.size:
                break
            rows = centred[open_rows]
            chunk = slice(at, at + self._CHUNK)
            hit = (np.abs(rows[:, stops[chunk]] - rows[:, starts[chunk]])
                   >= threshold[chunk]).any(axis=1)
            reached += int(np.count_nonzero(hit))
            open_rows = open_rows[~hit]
        return reached

    def _thresholds(self, observed: float) -> Floats:
        """Per stretch, the least |d| with |d| / scale >= observed, in floats."""
        t: Floats = observed * self.scale
        while (low := t / self.scale < observed).any():
            t = np.where(low, np.nextafter(t, np.inf), t)
        while (high := np.nextafter(t, -np.inf) / self.scale >= observed).any():
            t = np.where(high, np.nextafter(t, -np.inf), t)
        return t


def _centred_sums(ranks: np.ndarray, ends: np.ndarray) -> Floats:
    """Per row of `ranks` (points in order, or permuted), at each end e of `ends` (sorted
    grid ends, 0 and n among them): the sum of the ranks before e less what it is expected
    to be, e (n + 1) / 2. A stretch [i, j)'s rank sum less its expectation is the
    difference of two of these. Exact (ranks are halves of integers), so the same floats
    whichever way they are summed: here the pieces between ends, then their running sum
    (half the time of a running sum over every point)."""
    n = ranks.shape[-1]
    cumulative = np.zeros(ranks.shape[:-1] + (len(ends),))
    np.cumsum(np.add.reduceat(ranks, ends[:-1], axis=-1), axis=-1, out=cumulative[..., 1:])
    centred: Floats = cumulative - ends * (n + 1) / 2
    return centred


@functools.lru_cache(maxsize=32)
def _tests(n: int, min_segment: int) -> tuple[int, np.ndarray, list[_Stretches]]:
    """What _p_value tests in n points: how many permutations a batch holds, the grid's
    ends, and the stretches of each kind."""
    i, j = _intervals(n, min_segment, step=-(-n // _GRID))
    # Batches sized by every stretch, as before the mirrors were left out: the same batches
    # stop the test after the same permutations, so a series keeps its p-value.
    batch = max(50, _BATCH_CELLS // max(1, len(i)))
    # Only the stretches of the two kinds (a stretch [i, n) is the mirror of [0, i): the
    # same statistic).
    ends = _distinct(np.r_[i, j])
    single, inner = i == 0, (i > 0) & (j < n)
    return batch, ends, [_Stretches(ends, i[kind], j[kind], n) for kind in (single, inner)
                         if kind.any()]


class _Orders:
    """The permuted orders of n points that tests draw from a generator in one state, batch
    after batch, kept: the next test of n points from that state (a trend's every series
    starts from the seed, and most have one length) takes them instead of shuffling again.
    A shuffle moves positions whatever the values are, so ranks[orders] is what shuffling
    the ranks gives (`rng.permuted` was half of a test's time), and the generator is left
    in the state the shuffles leave it in. Threads may share them (a lock)."""

    _kept: dict[tuple[int, ...], _Orders] = {}
    _lock = threading.Lock()
    _CELLS = 8_000_000     # positions kept in all (64 MB), the least recently used dropped

    def __init__(self, n: int, rng: np.random.Generator) -> None:
        self.n, self.rng, self.at = n, rng, 0
        self.batches: list[tuple[np.ndarray, Mapping[str, Any]]] = []   # orders, state after

    @classmethod
    def of(cls, rng: np.random.Generator, n: int, schedule: tuple[int, ...]) -> _Orders:
        """The orders of n points that rng gives from its state now, batch by batch (`next`),
        in batches of sizes that `schedule` decides; those drawn before are taken again."""
        state = rng.bit_generator.state
        mine = cls(n, rng)
        if state["bit_generator"] != "PCG64" or state["has_uint32"]:
            return mine           # a state this does not key: nothing kept
        key = (n, *schedule, state["state"]["state"], state["state"]["inc"])
        with cls._lock:
            before = cls._kept.pop(key, None)
            if before is not None:
                mine.batches = before.batches   # one list: what either draws, both keep
            cls._kept[key] = mine   # the most recently used, last
            while len(cls._kept) > 1 and sum(orders.size for o in cls._kept.values()
                                             for orders, _ in o.batches) > cls._CELLS:
                del cls._kept[next(iter(cls._kept))]
        return mine

    def next(self, size: int) -> np.ndarray:
        """The next `size` orders: those rng.permuted gives for as many rows of positions
        (the schedule's next size: each batch is drawn once, by whichever test needs it
        first)."""
        with self._lock:
            if self.at < len(self.batches):
                orders, after = self.batches[self.at]
                self.rng.bit_generator.state = after
            else:
                orders = self.rng.permuted(np.tile(np.arange(self.n), (size, 1)), axis=1)
                self.batches.append((orders, self.rng.bit_generator.state))
        self.at += 1
        return orders


def _batch_sizes(batch: int, permutations: int) -> Iterator[int]:
    """How many permutations each batch of a test holds. Batches grow from a few hundred: a
    series without a change is done after the first, where a full batch of a long series
    would cost ten times as much."""
    done = 0
    while done < permutations:
        size = min(batch, permutations - done, max(4 * _EXCEEDANCES, done))
        yield size
        done += size


def prepare(n: int, min_segment: int = MIN_SEGMENT, permutations: int = PERMUTATIONS,
            seed: int = 0) -> threading.Thread | None:
    """Start drawing, on a thread of its own (returned), the permuted orders that detect's
    first test of a series of n points takes (all of them when its p-value is small: the
    shuffles are then most of its time), while the caller reads the series: with a
    second CPU they are drawn by the time the tests ask. The same orders the tests would
    draw (_Orders): only when they are drawn changes."""
    if n < 2 * min_segment or len(os.sched_getaffinity(0)) < 2:
        return None
    batch = _tests(n, min_segment)[0]
    orders = _Orders.of(np.random.default_rng(seed), n, (batch, permutations))
    drawing = threading.Thread(target=lambda: [orders.next(size) for size in
                                               _batch_sizes(batch, permutations)],
                               name="vmtax-orders")
    drawing.start()
    return drawing


def _statistics(ranks: np.ndarray, min_segment: int) -> list[float]:
    """The largest statistic of each kind (_tests) in points of these ranks."""
    _, ends, kinds = _tests(len(ranks), min_segment)
    centred = _centred_sums(ranks, ends)
    return [kind.largest(centred) for kind in kinds]


def _p_value(ranks: np.ndarray, min_segment: int, permutations: int,
             rng: np.random.Generator) -> float:
    """Is there a change in these points? Two rank statistics are each compared with the
    same maximum over permuted orders: the largest over single changes (stretches that
    touch an end), and over a change and its recovery (stretches inside); the smaller p,
    Bonferroni-corrected for two. Either alone misses what the other sees: one step is
    diluted among all stretches, a regression that recovered among single changes."""
    batch, ends, kinds = _tests(len(ranks), min_segment)
    observed = [statistic - 1e-12 for statistic in _statistics(ranks, min_segment)]
    # Permutations in batches, stopping once every statistic saw _EXCEEDANCES arrangements
    # as extreme as the observed one (Besag & Clifford's sequential test: the p-value stays
    # valid, and a series clearly without a change costs hundreds of permutations, not
    # thousands).
    done, extreme = 0, np.zeros(len(kinds), dtype=int)
    orders = _Orders.of(rng, len(ranks), (batch, permutations))
    # The orders rearrange the ranks sorted, which is the same null (any fixed order of the
    # ranks, shuffled, is uniform) but the same draws for every series of n untied points:
    # what a clean step's p can be is then known beforehand (step_p).
    ordered = np.sort(ranks)
    for size in _batch_sizes(batch, permutations):
        null = _centred_sums(np.take(ordered, orders.next(size)), ends)
        extreme += [kind.reaching(null, o) for kind, o in zip(kinds, observed)]
        done += size
        if extreme.min() >= _EXCEEDANCES:
            break
    # Unless stopped early, the observed order counts as one of the arrangements.
    p = (extreme / done if extreme.min() >= _EXCEEDANCES else (1 + extreme) / (1 + done))
    return float(min(1.0, len(kinds) * p.min()))


@functools.cache
def step_p(before: int, after: int, min_segment: int = MIN_SEGMENT,
           permutations: int = PERMUTATIONS, below: float = 0.0) -> float:
    """The largest p-value detect gives a clean step: `before` points at one level, then
    `after` at another, in any order within each side (1.0 when a side is shorter than
    min_segment). Every such series has at least the statistic of its split over single
    changes, sqrt(3 a b / (n + 1)); the test takes the smaller p of its two kinds times
    their count, and stops drawing once each kind saw _EXCEEDANCES orders as extreme (when
    depends on the other kind, so on the order within the sides). So this is that count
    times the largest chance of reaching the split's statistic that the test could stop
    at, over the orders it draws (the same seed, batches and sorted ranks as _p_value, so
    exactly what it gives untied points). Returned early, once above `below`: then only
    that is known."""
    n = before + after
    if min(before, after) < min_segment:
        return 1.0
    batch, ends, kinds = _tests(n, min_segment)
    observed = math.sqrt(3 * before * after / (n + 1)) - 1e-12
    orders = _Orders.of(np.random.default_rng(0), n, (batch, permutations))
    ranks = np.arange(1.0, n + 1)
    done = extreme = 0
    worst = 0.0
    for size in _batch_sizes(batch, permutations):
        extreme += kinds[0].reaching(_centred_sums(np.take(ranks, orders.next(size)), ends),
                                     observed)
        done += size
        if extreme >= _EXCEEDANCES:
            worst = max(worst, len(kinds) * extreme / done)
            if below and worst > below:
                return min(1.0, worst)
    return float(min(1.0, max(worst, len(kinds) * (1 + extreme) / (1 + done))))


def calls(before: int, after: int, alpha: float, min_segment: int = MIN_SEGMENT,
          permutations: int = PERMUTATIONS) -> bool:
    """Whether every clean step of `before` points and then `after` passes alpha (raw, before
    an adjustment across series), whatever its order within each side."""
    return step_p(before, after, min_segment, permutations, below=alpha) <= alpha


@functools.cache
def points_needed(points: int, alpha: float, min_segment: int = MIN_SEGMENT,
                  permutations: int = PERMUTATIONS) -> int:
    """How many more points a series of `points` needs before a clean step somewhere in it
    could be called at alpha: none from twice runs_each_side on; below, the splits of each
    length are tried, the most even (which has the most orders) first."""
    enough = 2 * runs_each_side(alpha, min_segment, permutations)
    for total in range(max(points, 2 * min_segment), enough):
        if any(calls(a, total - a, alpha, min_segment, permutations)
               for a in sorted(range(min_segment, total - min_segment + 1),
                               key=lambda a: abs(2 * a - total))):
            return total - points
    return max(0, enough - points)


# alpha below this no test reaches (its floor, with two kinds of stretch and all
# permutations drawn): runs_each_side then says so rather than searching for ever.
_NO_SIDE = 10 ** 6


@functools.cache
def runs_each_side(alpha: float, min_segment: int = MIN_SEGMENT,
                   permutations: int = PERMUTATIONS) -> int:
    """The fewest runs on each side from which every clean step is called at alpha (raw,
    before an adjustment across series): the promise a trend states. A longer side only
    adds orders, so a clean step grows easier to call, but where the longer side brings
    the test's second kind of stretch in (its p doubles there): the sides tried beside k
    are k, k + 1 and those up to one past that point."""
    if alpha < 2 / (1 + permutations):
        return _NO_SIDE
    k = min_segment
    while not all(calls(k, b, alpha, min_segment, permutations)
                  and calls(b, k, alpha, min_segment, permutations)
                  for b in range(k, max(k + 2, 3 * min_segment - k + 1))):
        k += 1
    return k


def _located(x: np.ndarray, min_segment: int) -> int:
    """Where the likeliest change is, by least squares on `x` (the Gaussian maximum
    likelihood, which weighs how far points lie and not only their order): the best single
    change, unless a change and its recovery explain the points better by more than the
    extra change costs (BIC: 2 σ² ln n, σ from successive differences). Of a change and
    recovery, the change is returned; the recovery is found when the pieces are searched
    again."""
    n = len(x)
    i, j = _intervals(n, min_segment)
    cumulative = np.r_[0.0, np.cumsum(x)]
    inside = j - i
    sums = cumulative[j] - cumulative[i]
    gain = ((sums / inside - (cumulative[n] - sums) / (n - inside)) ** 2
            * inside * (n - inside) / n)
    single = i == 0
    best_single = int(np.argmax(np.where(single, gain, -np.inf)))
    best = int(np.argmax(gain))
    steps = np.diff(x)   # _median: np.median's value, without loading numpy.ma (~8 ms)
    sigma = 1.4826 * _median(np.abs(steps - _median(steps, "step")), "step") / np.sqrt(2)
    if not single[best] and gain[best] - gain[best_single] > 2 * sigma ** 2 * np.log(n):
        return int(i[best])
    return int(j[best_single])


def _ranks(x: np.ndarray) -> Floats:
    """Mid-ranks, 1-based: tied values share the mean of their ranks."""
    order = np.argsort(x, kind="mergesort")
    position = np.empty(len(x), dtype=int)
    position[order] = np.arange(len(x))
    ordered = x[order]
    starts = np.r_[True, ordered[1:] != ordered[:-1]]
    group = np.cumsum(starts)[position]
    bounds = np.r_[np.nonzero(starts)[0], len(x)]
    ranks: Floats = 0.5 * (bounds[group] + bounds[group - 1] + 1)
    return ranks


def _median(values: Sequence[float] | np.ndarray, what: str) -> float:
    """np.median's value, without its per-call cost: a trend's points are thousands of runs'
    few repetitions each."""
    try:
        x = sorted(map(float, values))
    except (TypeError, ValueError):
        x = []
    if not x or not all(map(math.isfinite, x)):
        x = sorted(stats._sample(values, what).tolist())   # raises its one-line error
    mid = len(x) // 2
    return x[mid] if len(x) % 2 else (x[mid - 1] + x[mid]) / 2


def detect(points: Sequence[Sequence[float]], **options: Any) -> Detection:
    """The change points of one series; `points[i]` holds run i's repetitions (> 0)."""
    return detect_medians([_median(p, f"point {i}") for i, p in enumerate(points)], **options)


def detect_medians(point_medians: Sequence[float], *, min_segment: int = MIN_SEGMENT,
                   alpha: float = 0.01, noise_floor: float = 0.02,
                   permutations: int = PERMUTATIONS, seed: int = 0) -> Detection:
    """detect, given the median of each point's repetitions."""
    if min_segment < 1:
        raise ValueError(f"min_segment must be at least 1, got {min_segment}")
    medians = np.array(point_medians, dtype=float)
    if not np.isfinite(medians).all():
        raise ValueError("a point's median is NaN or infinite")
    if np.any(medians <= 0):
        raise ValueError("change points are sought in positive metrics only (ratios)")
    rng = np.random.default_rng(seed)
    changes: list[Change] = []
    tested: list[float] = []
    stack = [(0, len(medians))]
    while stack:
        start, end = stack.pop()
        if end - start < 2 * min_segment or np.ptp(medians[start:end]) == 0:
            continue
        logs = np.log(medians[start:end])
        p = _p_value(_ranks(logs), min_segment, permutations, rng)
        tested.append(p)
        at = start + _located(logs, min_segment)
        change = _gated(medians[start:at], medians[at:end], at, p, alpha, noise_floor)
        if change is not None:
            changes.append(change)
            stack += [(start, at), (at, end)]
    return Detection(len(medians), tuple(sorted(changes, key=lambda c: c.index)),
                     min_segment, tuple(tested), alpha, permutations)


def detect_many(series_medians: Sequence[Sequence[float]], **options: Any) -> list[Detection]:
    """detect_medians of each series, on every CPU (each test's generator starts from its
    seed: a series' answer does not depend on the thread that finds it), those likeliest
    to take longest first: the series whose ranks lie furthest from a random order, whose
    tests cannot stop early and whose changes need a bootstrap. Started last, one of them
    alone would keep a CPU busy after the others are done."""
    min_segment = options.get("min_segment", MIN_SEGMENT)
    options.setdefault("permutations", enough_permutations(len(series_medians),
                                                           options.get("alpha", 0.01)))
    order = sorted(range(len(series_medians)), key=lambda i: -_strength(
        series_medians[i], min_segment))
    found = dict(zip(order, map_on_cpus(lambda i: detect_medians(series_medians[i], **options),
                                        order)))
    return [found[i] for i in range(len(series_medians))]


def enough_permutations(series: int, alpha: float) -> int:
    """Permutations enough that a change alone among `series` series, at the smallest
    p-value a test can give (2 / (1 + P)), passes `alpha` after the adjustment across
    their tests, with room for as many tests again (the pieces of split series): below
    that, a fleet's one regression among hundreds of series could never be called."""
    return max(PERMUTATIONS, math.ceil(4 * series / alpha) - 1)


def _strength(medians: Sequence[float], min_segment: int) -> float:
    """The largest rank statistic of the whole series (0 when too short or flat)."""
    x = np.array(medians, dtype=float)
    if len(x) < 2 * min_segment or not np.isfinite(x).all() or np.ptp(x) == 0:
        return 0.0
    return max(_statistics(_ranks(x), min_segment))


def _gated(before: np.ndarray, after: np.ndarray, index: int, p: float, alpha: float,
           noise_floor: float) -> Change | None:
    if p > alpha:
        return None
    median_before, median_after = _median(before, "before"), _median(after, "after")
    if abs(median_after / median_before - 1) < noise_floor:
        return None     # stats.ratio's value: its bootstrap (~40 ms at 400 points) spared
    effect = stats.ratio(after, before, higher_is_better=True)
    if effect.ci_low <= 1 <= effect.ci_high:
        return None
    return Change(index, median_before, median_after, effect.value,
                  (effect.ci_low, effect.ci_high), p)


def adjust(detections: Sequence[Detection], alpha: float = 0.01,
           method: str = "bh") -> list[Detection]:
    """The detections with every change's p-value adjusted across every test that all of
    them made (those that called no change count too), and the changes that no longer
    pass `alpha` dropped."""
    raw = [p for d in detections for p in d.p_values]
    adjusted = dict(zip(raw, significance.adjust_pvalues(raw, method))) if raw else {}
    out = []
    for d in detections:
        kept = tuple(replace(c, p_adjusted=adjusted[c.p_value]) for c in d.changes
                     if adjusted[c.p_value] <= alpha)
        out.append(replace(d, changes=kept))
    return out
