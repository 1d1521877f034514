"""Change points over series of runs (analysis/changepoint.py): a real step is found where
it is, with its effect; spikes, noise, two modes and too short a context are not changes.
`make bench-stats` checks the rates over many series, against Otava."""

import numpy as np
import pytest

from vmtax.analysis import changepoint


def series(levels, noise=0.01, reps=5, seed=0):
    rng = np.random.default_rng(seed)
    return [level * np.exp(rng.normal(0, noise, reps)) for level in levels]


def test_a_step_is_found_where_it_is_with_its_effect():
    found = changepoint.detect(series([100] * 12 + [90] * 8))
    assert [c.index for c in found.changes] == [12]
    change = found.changes[0]
    assert change.change == pytest.approx(-0.10, abs=0.01)
    assert change.ci[0] < change.ratio < change.ci[1] < 1
    assert change.p_value <= 0.001
    assert found.segments() == [(0, 12), (12, 20)]


def test_two_steps_are_two_changes():
    found = changepoint.detect(series([100] * 8 + [120] * 8 + [100] * 8))
    assert [c.index for c in found.changes] == [8, 16]


def test_a_single_spike_is_not_a_change():
    levels = [100] * 20
    levels[10] = 150
    assert changepoint.detect(series(levels)).changes == ()


def test_a_step_in_the_last_points_waits_for_context():
    short = changepoint.detect(series([100] * 15 + [80] * 2))
    assert short.changes == ()
    later = changepoint.detect(series([100] * 15 + [80] * 5))
    assert [c.index for c in later.changes] == [15]


def test_a_stationary_bimodal_series_raises_no_change():
    rng = np.random.default_rng(7)
    levels = rng.choice([100, 108], size=30)
    assert changepoint.detect(series(levels, seed=3)).changes == ()


def test_a_change_below_the_noise_floor_is_not_called():
    found = changepoint.detect(series([100] * 15 + [101] * 15, noise=0.001))
    assert found.changes == ()
    assert [c.index for c in changepoint.detect(
        series([100] * 15 + [101] * 15, noise=0.001), noise_floor=0.005).changes] == [15]


def test_too_few_points_say_how_many_more_are_needed():
    found = changepoint.detect(series([100, 90, 80]))
    # At alpha 0.01 (detect's default) the fewest runs a clean step is called in are 12.
    assert found.changes == () and found.points_needed == 9
    assert changepoint.detect(series([100] * 11)).points_needed == 1
    assert changepoint.detect(series([100] * 12)).points_needed == 0
    assert changepoint.detect(series([100] * 6), alpha=0.05).points_needed == 2


def test_the_same_series_always_gets_the_same_answer():
    s = series([100] * 10 + [95] * 10, noise=0.02)
    assert changepoint.detect(s) == changepoint.detect(s)


def test_adjusting_counts_the_series_that_called_no_change():
    strong = changepoint.detect(series([100] * 12 + [70] * 12))
    weak = changepoint.detect(series([100] * 6 + [94] * 6, noise=0.02, seed=5))
    quiet = [changepoint.detect(series([100] * 12, seed=s)) for s in range(40)]
    assert strong.changes and weak.changes and not any(q.changes for q in quiet)
    assert changepoint.adjust([strong, weak], alpha=0.05)[1].changes
    kept = changepoint.adjust([strong, weak, *quiet], alpha=0.05)
    assert kept[0].changes and kept[0].changes[0].p_adjusted >= strong.changes[0].p_value
    assert kept[1].changes == ()


def test_non_positive_values_are_refused():
    with pytest.raises(ValueError, match="positive"):
        changepoint.detect([[1.0], [0.0]] * 4)


def test_kept_permutations_give_what_shuffling_gives():
    """A trend's series of one length take the orders the first drew (_Orders): each gets
    the detection it gets alone, with nothing kept, and in threads."""
    from concurrent.futures import ThreadPoolExecutor

    levels = [[100] * 40 + [93] * 20, [100] * 60, [100] * 30 + [104] * 30, [100] * 60]
    many = [series(lv, noise=0.03, seed=i) for i, lv in enumerate(levels)]
    alone = []
    for points in many:
        changepoint._Orders._kept.clear()
        alone.append(changepoint.detect(points))
    assert alone[0].changes and alone[0].p_values[0] < 0.01   # a test of every permutation
    changepoint._Orders._kept.clear()
    assert [changepoint.detect(points) for points in many] == alone
    assert changepoint._Orders._kept      # kept, and taken again
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(changepoint.detect, many * 2)) == alone * 2
    # Fewer permutations end in a batch of another size: not the kept ones.
    fewer = changepoint.detect(many[0], permutations=2999)
    changepoint._Orders._kept.clear()
    assert changepoint.detect(many[0], permutations=2999) == fewer


def test_counting_the_permutations_that_reach_skips_no_row_that_does():
    """`reaching` computes few statistics; it must count exactly the rows whose largest
    statistic reaches the observed one, also when one equals it to the last bit."""
    rng = np.random.default_rng(7)
    for n in (6, 13, 40, 150, 400):
        _, ends, kinds = changepoint._tests(n, changepoint.MIN_SEGMENT)
        ranks = changepoint._ranks(np.round(rng.normal(size=n), 1))   # with ties
        rows = changepoint._centred_sums(ranks[rng.permuted(np.tile(np.arange(n), (300, 1)),
                                                           axis=1)], ends)
        for kind in kinds:
            largest = np.array([kind.largest(row) for row in rows])
            for observed in (*np.quantile(largest, [0, 0.5, 0.9, 0.99, 1]),
                             largest[3], largest[3] - 1e-12, np.nextafter(largest[3], 0),
                             largest.max() + 1, 0.0):
                assert kind.reaching(rows, observed) == np.count_nonzero(largest >= observed)


def test_orders_drawn_ahead_are_the_ones_a_test_takes():
    """prepare(n) draws a first test's orders on a thread while trend reads the store; a
    series tested after (or while) they are drawn gets what it gets alone."""
    rng = np.random.default_rng(3)
    series = [[float(v)] for v in np.r_[rng.normal(100, 1, 30), rng.normal(106, 1, 30)]]
    changepoint._Orders._kept.clear()
    alone = changepoint.detect(series)
    changepoint._Orders._kept.clear()
    drawing = changepoint.prepare(len(series))
    assert drawing is not None
    drawing.join()
    kept = list(changepoint._Orders._kept.values())
    assert len(kept) == 1 and sum(len(o) for o, _ in kept[0].batches) == changepoint.PERMUTATIONS
    assert changepoint.detect(series) == alone
    now = list(changepoint._Orders._kept.values())
    # The test of the whole series took them (its pieces' tests draw their own).
    assert kept[0] not in now and any(o.batches is kept[0].batches for o in now)
    changepoint._Orders._kept.clear()
    changepoint.prepare(len(series))   # still drawing while the test runs
    assert changepoint.detect(series) == alone


def test_many_series_are_detected_as_alone_the_likeliest_to_take_longest_first(monkeypatch):
    rng = np.random.default_rng(5)
    flat = [list(rng.normal(100, 1, 40)) for _ in range(3)]
    step = list(np.r_[rng.normal(100, 1, 25), rng.normal(110, 1, 15)])
    series = [*flat, step, flat[0][:4]]
    alone = [changepoint.detect_medians(s) for s in series]
    started = []
    real = changepoint.map_on_cpus
    monkeypatch.setattr(changepoint, "map_on_cpus",
                        lambda work, items: started.extend(items) or real(work, items))
    assert changepoint.detect_many(series) == alone
    assert started[0] == 3 and sorted(started) == [0, 1, 2, 3, 4]


def test_a_change_alone_among_hundreds_of_series_survives_the_adjustment():
    """A fleet's trend judges hundreds of series together: with 9,999 permutations the
    smallest p-value (2e-4) times 300 tests no longer passes 0.05, so one clear step
    among them was dropped; detect_many draws enough for the series it is given."""
    rng = np.random.default_rng(11)
    flat = [list(rng.normal(100, 1, 40)) for _ in range(300)]
    step = list(np.r_[rng.normal(100, 1, 25), rng.normal(115, 1, 15)])
    found = changepoint.adjust(changepoint.detect_many([*flat, step], alpha=0.05), 0.05)
    assert [c.index for c in found[-1].changes] == [25]
    assert not any(d.changes for d in found[:-1])
    assert changepoint.enough_permutations(125, 0.05) == changepoint.PERMUTATIONS


@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_what_detection_promises_it_keeps_on_clean_steps_of_every_size(alpha):
    """A clean step (two levels, a little noise, in any order within each side) of a runs
    and then b is called wherever `calls` promises it, which it does from runs_each_side
    runs on each side on; points_needed more runs make some split promised; and below
    what the test can reach, nothing is called. The old promise, 3 runs on each side, could
    not be kept: the rank test of 3 against 3 has 20 orders, so its p is never below 0.1."""
    each = changepoint.runs_each_side(alpha)
    assert each == {0.05: 5, 0.01: 6}[alpha]
    rng = np.random.default_rng(11)
    for a in range(1, 11):
        for b in range(1, 11):
            promised = changepoint.calls(a, b, alpha)
            assert promised or not (a >= each and b >= each), (a, b)
            for order in range(3):
                levels = np.r_[100 + rng.permutation(a) * 0.1, 60 + rng.permutation(b) * 0.1]
                found = changepoint.detect_medians(levels, alpha=alpha)
                if promised:
                    assert [c.index for c in found.changes] == [a], (a, b, order)
                if a + b <= {0.05: 7, 0.01: 9}[alpha]:    # (3 + 3: p >= 0.1, 4 + 4: 0.026)
                    assert found.changes == (), (a, b, order)
    for n in range(1, 16):
        more = changepoint.points_needed(n, alpha)
        assert any(changepoint.calls(k, n + more - k, alpha) for k in range(n + more))
        assert more == 0 or not any(changepoint.calls(k, n + more - 1 - k, alpha)
                                    for k in range(n + more - 1))
