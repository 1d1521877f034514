"""Resampling: the bootstrap's replicates of two groups' medians, and medians fast.

  * Ratios and changes of medians get percentile-bootstrap intervals
    (`vmtax.analysis.intervals.percentile_ci`) from `boot_medians`: each group resampled
    independently, N_BOOT times, from a generator seeded by the caller, so the same runs
    give the same interval on every call and on any thread.
  * The replicates' medians are np.median's, bit for bit (ties and -0.0 included), but
    computed for many rows of a few values by compare-exchanges of whole columns
    (odd-even transposition): four times as fast as sorting each row for 5 repetitions,
    and most of the time of a run's summary.

May import: numpy (through `vmtax.core.blas`); nothing else of vmtax.
"""

from __future__ import annotations

import functools

from vmtax.core import blas

with blas.one_thread():   # numpy without OpenBLAS's spinning threads
    import numpy as np
    import numpy.typing as npt

Floats = npt.NDArray[np.float64]

N_BOOT = 10_000


def boot_medians(x: np.ndarray, y: np.ndarray, n_boot: int,
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
    m1, m2 = row_medians(first[picks[0]]), row_medians(second[picks[1]])
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


def row_medians(samples: Floats) -> Floats:
    """np.median(samples, axis=1), bit for bit (the middle value, or the mean of the two
    middle ones), for finite rows; sorting short rows is twice as fast as its partition.
    Its mean adds to 0.0 first, so a middle -0.0 is 0.0 as np.median gives it. Sorts
    samples in place (a long segment's replicates are tens of megabytes to copy), or
    leaves them as they were when they are many rows of a few values."""
    rows, size = samples.shape
    columns: list[Floats]
    if rows >= _NETWORK_ROWS and 2 <= size <= _NETWORK_COLUMNS:
        columns = _sorted_columns(samples)
    else:
        samples.sort(axis=1)
        columns = list(samples.T)
    half = size // 2
    medians: Floats = (columns[half] + 0.0 if size % 2 else
                       (columns[half - 1] + columns[half] + 0.0) / 2)
    return medians


def _sorted_columns(samples: Floats) -> list[Floats]:
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


def median(x: Floats) -> np.float64:
    """np.median(x) of a finite sample, bit for bit, without the NaN check that loads
    numpy.ma (~6 ms of a `vmtax show`)."""
    return np.float64(row_medians(np.array(x)[np.newaxis])[0])
