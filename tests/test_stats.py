import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from vmtax.analysis import resampling, significance, stats
from vmtax.analysis.intervals import interval_kind
from vmtax.analysis.significance import (
    adjust_pvalues,
    can_test,
    min_p_value,
    min_runs_to_detect,
)
from vmtax.core.notation import bracket
from vmtax.analysis.stats import (
    RatioSummary,
    Summary,
    clock_skew,
    compare,
    compare_many,
    faster_than_baseline,
    interleave,
    next_action,
    noisy,
    precise_enough,
    ratio,
    summarize,
)

# Small integer-valued floats: realistic magnitudes and plenty of ties.
samples = st.lists(st.integers(1, 60).map(float), min_size=1, max_size=12)
prop = settings(deadline=None, max_examples=60, derandomize=True)


# ---- summarize ---------------------------------------------------------------------------

def test_summary_known_values():
    s = summarize([4.0, 1.0, 3.0, 2.0])
    assert (s.n, s.median, s.mean) == (4, 2.5, 2.5)
    assert s.stdev == pytest.approx(math.sqrt(5 / 3))
    assert s.cv == pytest.approx(math.sqrt(5 / 3) / 2.5)
    assert summarize([7, 1, 5]).median == 5


def test_median_ci_n10_uses_2nd_and_9th_order_statistics():
    # P(Bin(10,1/2) <= 1) = 11/1024, so [X(2), X(9)] covers 1 - 22/1024; X(3)..X(8) is 89%.
    s = summarize([10, 1, 9, 2, 8, 3, 7, 4, 6, 5])
    assert (s.ci_low, s.ci_high) == (2, 9)
    assert s.ci_level == 1 - 22 / 1024


def test_median_ci_n20_uses_6th_and_15th_order_statistics():
    # P(Bin(20,1/2) <= 5) = (1+20+190+1140+4845+15504) / 2**20 = 21700 / 2**20.
    s = summarize(range(101, 121))
    assert (s.ci_low, s.ci_high) == (106, 115)
    assert s.ci_level == pytest.approx(1 - 2 * 21700 / 2**20)


@pytest.mark.parametrize("n", range(6, 40, 3))
def test_median_ci_matches_scipy_quantile_test(n):
    x = np.random.default_rng(n).lognormal(size=n)
    ci = sps.quantile_test(x, q=np.median(x), p=0.5).confidence_interval(0.95)
    s = summarize(x)
    assert (s.ci_low, s.ci_high) == (ci.low, ci.high)
    assert s.ci_level >= 0.95


@pytest.mark.parametrize("n, level", [(1, 0.0), (2, 0.5), (3, 0.75), (5, 0.9375)])
def test_small_n_falls_back_to_min_max_with_true_coverage(n, level):
    s = summarize([10.0 + i for i in range(n)])
    assert (s.ci_low, s.ci_high, s.ci_level) == (10.0, 10.0 + n - 1, level)


def test_n6_reaches_95_percent_and_99_percent_needs_8():
    assert summarize(range(6)).ci_level == 1 - 2 / 64
    assert summarize(range(7), confidence=0.99).ci_level < 0.99
    assert summarize(range(8), confidence=0.99).ci_level == 1 - 2 / 256


def test_single_value_and_undefined_cv():
    s = summarize([3.5])
    assert s == Summary(n=1, median=3.5, ci_low=3.5, ci_high=3.5, mean=3.5, stdev=None,
                        cv=None, ci_level=0.0)
    assert summarize([-1.0, 1.0]).cv is None


@pytest.mark.parametrize("bad", [[], [1.0, math.nan], [math.inf], [[1.0, 2.0]]])
def test_summarize_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        summarize(bad)


def test_summarize_accepts_generators():
    assert summarize(x for x in (1, 2, 3)).median == 2


@given(samples, st.sampled_from([0.5, 0.8, 0.9, 0.95, 0.99]))
@prop
def test_ci_contains_median_and_is_honest(values, confidence):
    s = summarize(values, confidence)
    assert s.ci_low <= s.median <= s.ci_high
    assert 0 <= s.ci_level <= 1
    if s.ci_level < confidence:  # only the widest interval may fall short
        assert (s.ci_low, s.ci_high) == (min(values), max(values))


# ---- ratio -------------------------------------------------------------------------------

def test_ratio_direction():
    native, doubled = [10.0, 10.5, 9.5, 10.2, 9.8], [20.0, 21.0, 19.0, 20.4, 19.6]
    latency = ratio(doubled, native, higher_is_better=False)  # slower VM
    assert latency.value == 0.5
    assert latency.ci_low <= 0.5 <= latency.ci_high < 1
    assert ratio(native, doubled, higher_is_better=True).value == 0.5  # half the throughput
    assert ratio(doubled, native, higher_is_better=True).value == 2.0


def test_ratio_bootstrap_is_seeded():
    rng = np.random.default_rng(0)
    x, base = rng.normal(10, 1, 15), rng.normal(10, 1, 15)
    assert ratio(x, base, True, seed=3) == ratio(x, base, True, seed=3)
    # The seed matters, but with the default 10,000 resamples hardly at all.
    assert ratio(x, base, True, seed=3, n_boot=100) != ratio(x, base, True, seed=4, n_boot=100)
    a, b = ratio(x, base, True, seed=3), ratio(x, base, True, seed=4)
    assert (a.ci_low, a.ci_high) == pytest.approx((b.ci_low, b.ci_high), rel=0.01)


def test_ratio_zero_medians_give_inf_or_nan():
    assert ratio([1.0, 2.0, 3.0], [0.0, 0.0, 0.0], True) == RatioSummary(
        math.inf, math.inf, math.inf, "range")
    nan = ratio([0.0, 0.0, 1.0], [0.0, 0.0, 2.0], True)
    assert all(math.isnan(v) for v in (nan.value, nan.ci_low, nan.ci_high))
    assert not faster_than_baseline(nan, 5, 5)


@given(st.lists(st.floats(0.1, 1e6), min_size=1, max_size=15))
@prop
def test_ratio_of_sample_with_itself_is_one(values):
    for hib in (True, False):
        r = ratio(values, values, hib, n_boot=500)
        assert r.value == 1.0
        assert r.ci_low <= 1.0 <= r.ci_high


# ---- p-values ----------------------------------------------------------------------------

def mw(a, b):
    """The Mann-Whitney p compare() uses once samples are large enough for a rank test."""
    return significance.mann_whitney_p(np.asarray(a, float), np.asarray(b, float))


def test_mann_whitney_smallest_possible_p():
    assert mw([1, 2, 3], [6, 7, 8]) == pytest.approx(2 / 20)
    assert mw([1, 2, 3, 4], [6, 7, 8, 9]) == pytest.approx(2 / 70)
    assert mw(range(1, 6), range(6, 11)) == pytest.approx(2 / 252)
    assert compare(range(1, 8), range(8, 15), True).p_value == pytest.approx(2 / 3432)
    assert [min_p_value(n, n) for n in (3, 4, 5)] == pytest.approx([0.1, 2 / 70, 2 / 252])


def test_p_value_without_ties_matches_scipy():
    rng = np.random.default_rng(1)
    for na, nb in [(3, 7), (8, 8), (12, 15)]:
        a, b = rng.normal(100, 1, na), rng.normal(101, 1, nb)
        assert mw(a, b) == pytest.approx(sps.mannwhitneyu(a, b).pvalue)
    a, b = rng.normal(100, 1, 12), rng.normal(101, 1, 15)
    c = compare(a, b, True)
    assert (c.test, c.p_value) == ("mann-whitney", pytest.approx(sps.mannwhitneyu(a, b).pvalue))


def _brute_force_permutation_p(a, b):
    """Two-sided p of U over every split of the pooled runs, independent of scipy's code."""
    pooled = np.concatenate([a, b])
    ranks = sps.rankdata(pooled)

    def u(idx):
        return ranks[list(idx)].sum() - len(a) * (len(a) + 1) / 2
    observed = u(range(len(a)))
    null = np.array([u(idx) for idx in itertools.combinations(range(len(pooled)), len(a))])
    return min(1.0, 2 * min(np.mean(null >= observed), np.mean(null <= observed)))


@pytest.mark.parametrize("a, b", [
    ([1, 1, 2], [2, 3, 3]),
    ([5, 5, 5, 6, 7], [6, 7, 7, 8, 8, 9]),
    ([10, 11, 11, 12, 12, 12, 13], [12, 13, 13, 14, 14, 15, 15]),
])
def test_p_value_with_ties_is_exact_permutation(a, b):
    expected = _brute_force_permutation_p(np.array(a, float), np.array(b, float))
    assert mw(a, b) == pytest.approx(expected)


def test_p_value_with_ties_hand_checked():
    # Ranks of 1,1,2 | 2,3,3 give U_A = 0.5; of the 20 splits, 2 (U 0 and 0.5) are that
    # extreme on each side: p = 2 * 2/20.
    assert mw([1, 1, 2], [2, 3, 3]) == pytest.approx(0.2)
    assert mw([4, 4, 4], [4, 4, 4]) == 1.0
    # A lone run tied with one of three: midrank 1.5 of 1.5, 1.5, 3, 4 -> p = 2 * 2/4.
    assert mw([1], [1, 3, 4]) == pytest.approx(1.0)
    assert compare([5], [1, 1, 2, 3, 4], True).p_value == pytest.approx(2 / 6)


def test_runs_needed_to_detect_anything():
    assert min_runs_to_detect(0.01) == 5
    assert [min_runs_to_detect(0.01, m) for m in (2, 4, 5, 17, 18)] == [6, 6, 7, 7, 8]
    assert min_runs_to_detect(0.05) == 4


# ---- compare -----------------------------------------------------------------------------

def _shifted(factor, n=10, seed=0, sd=0.5):
    rng = np.random.default_rng(seed)
    return rng.normal(100, sd, n), rng.normal(100 * factor, sd, n)


def test_compare_verdicts_follow_direction():
    a, b = _shifted(1.10)
    up = compare(a, b, higher_is_better=True)
    assert up.verdict == "better" and up.significant
    assert up.change == pytest.approx((up.median_b - up.median_a) / up.median_a)
    assert up.change_ci[0] <= up.change <= up.change_ci[1]
    assert up.change_ci[0] > 0 and up.p_value < 1e-3
    assert compare(a, b, higher_is_better=False).verdict == "worse"
    assert compare(b, a, higher_is_better=False).verdict == "better"


def test_noise_floor_suppresses_real_but_tiny_changes():
    a, b = _shifted(1.01, sd=0.2)  # a genuine 1% change, very significant
    tiny = compare(a, b, True)
    assert tiny.p_value < 1e-3 and tiny.change_ci[0] > 0
    assert tiny.verdict == "~"
    assert compare(a, b, True, noise_floor=0.005).verdict == "better"


def test_few_runs_use_a_t_test_on_logs_because_ranks_cannot_reach_alpha():
    a, b = [1.0, 1.1, 1.2], [5.0, 5.1, 5.2]
    c = compare(a, b, True)
    assert (c.min_p, c.test, c.verdict) == (pytest.approx(0.1), "t-log", "better")
    # Equal run counts: Student's pooled test; unequal: Welch's.
    assert c.p_value == pytest.approx(
        sps.ttest_ind(np.log(a), np.log(b), equal_var=True).pvalue)
    assert compare(a, b + [5.3], True).p_value == pytest.approx(
        sps.ttest_ind(np.log(a), np.log(b + [5.3]), equal_var=False).pvalue)
    # Two runs a side are too few for it (2 degrees of freedom): the rank test is used.
    assert compare(a, b[:2], True).test == "mann-whitney"
    # Constant (quantized) samples: equal -> p 1, different -> systematic.
    assert compare([2.0] * 3, [2.0] * 3, True).p_value == 1.0
    # ... and identical constants stay out of the adjustment of the others.
    pairs = [("m", [1.0, 1.1, 1.2], [5.0, 5.1, 5.2], True)] + [
        (f"c{i}", [2.0] * 3, [2.0] * 3, True) for i in range(5)]
    many = compare_many(pairs, method="bh")
    assert many[0].p_adjusted == pytest.approx(many[0].p_value)
    assert all(c.p_adjusted == 1.0 for c in many[1:])
    assert compare([2.0] * 3, [3.0] * 3, True).verdict == "better"
    assert compare(range(1, 8), range(8, 15), True).test == "mann-whitney"
    # Zeros cannot be logged: the rank test is used.
    assert compare([0.0, 1.0, 2.0], [5.0, 6.0, 7.0], True).test == "mann-whitney"


def test_two_runs_a_side_say_they_are_too_few_instead_of_no_change():
    # issue 18: n=2 per side printed "~" next to -83%.
    c = compare([10.0, 10.5], [1.7, 1.8], True)
    assert c.change == pytest.approx(-0.83, abs=0.01)
    assert (c.test, c.verdict, c.significant) == ("mann-whitney", "too few runs", False)
    assert c.note == ("n=2 per side: the smallest possible p is 0.33, not below α=0.01; "
                      "need ≥ 5 runs")
    assert compare([10.0, 10.5], [1.7, 1.8, 1.9], True).note.startswith(
        "n=2 vs 3: the smallest possible p is 0.2,")
    assert "need ≥ 4 runs" in compare([10.0, 10.5], [1.7, 1.8], True, alpha=0.05).note
    # Zeros keep the t-test out: 3 vs 3 on ranks cannot reach 0.01 either.
    assert compare([0.0, 1.0, 2.0], [5.0, 6.0, 7.0], True).verdict == "too few runs"
    # Where a verdict is possible, "no change" stays "~" with no note.
    rng = np.random.default_rng(1)
    for n in (3, 5, 7):   # t-test on logs at 3 and 5, ranks at 7
        same = compare(rng.normal(100, 1, n), rng.normal(100, 1, n), True)
        assert (same.verdict, same.note) == ("~", ""), n


def test_medians_at_the_resolution_give_no_change_and_stay_out_of_the_adjustment():
    changed = ("ops", list(range(1, 8)), list(range(8, 15)), True)
    quantized = ("latency", [0.0, 0.01, 0.0, 0.0, 0.01], [0.02, 0.01, 0.02, 0.02, 0.03], False)
    alone = compare_many([changed])[0]
    both = compare_many([changed, quantized], resolutions=[None, 0.01])
    assert both[0].p_adjusted == alone.p_adjusted and both[0].verdict == "better"
    below = both[1]
    assert (below.verdict, below.significant, below.p_adjusted) == (
        "below resolution", False, 1.0)
    assert math.isnan(below.change) and all(math.isnan(v) for v in below.change_ci)
    assert below.note.startswith("a median is at or below the resolution 0.01")
    # Without the resolution the same pair is an infinite change.
    assert math.isinf(compare_many([changed, quantized])[1].change)
    # Above it, medians one step apart are what rounding alone gives (bench-stats' A vs A
    # runs called 0.03 vs 0.04 ms "+33.3%, p=0"): "~", said why, and out of the adjustment.
    step = ("l", [0.02] * 5, [0.03] * 5, False)
    one = compare_many([changed, step], resolutions=[None, 0.01])
    assert (one[1].verdict, one[1].significant, one[1].p_adjusted) == ("~", False, 1.0)
    assert one[1].note.startswith("medians one step of the resolution the tool prints them "
                                  "in (0.01) apart")
    assert one[0].p_adjusted == alone.p_adjusted
    # Two steps apart are read.
    read = compare_many([("l", [0.02] * 5, [0.04] * 5, False)], resolutions=[0.01])[0]
    assert read.verdict == "worse"
    with pytest.raises(ValueError, match="1 resolutions for 2 pairs"):
        compare_many([changed, quantized], resolutions=[0.01])


def test_compare_is_reproducible():
    a, b = _shifted(1.02, n=6)
    assert compare(a, b, True, seed=7) == compare(a, b, True, seed=7)


@given(samples, samples, st.sampled_from([1.0, 1.01, 1.05, 1.5]), st.booleans())
@prop
def test_swapping_a_and_b_flips_the_verdict(a, b_raw, factor, hib):
    b = [v * factor for v in b_raw]
    ab = compare(a, b, hib, n_boot=300)
    ba = compare(b, a, hib, n_boot=300)
    assert ba.verdict == {"better": "worse", "worse": "better", "~": "~",
                          "too few runs": "too few runs"}[ab.verdict]
    assert ab.p_value == pytest.approx(ba.p_value)


def test_a_vs_a_false_positive_rate_at_most_alpha():
    rng = np.random.default_rng(2024)
    calls = [compare(rng.normal(100, 1, 10), rng.normal(100, 1, 10), True, n_boot=2000)
             for _ in range(300)]
    assert sum(c.significant for c in calls) <= 3  # alpha 0.01 of 300


def test_real_5_percent_shift_is_found_at_n10():
    rng = np.random.default_rng(5)
    calls = [compare(rng.normal(100, 1, 10), rng.normal(95, 1, 10), True, n_boot=2000)
             for _ in range(20)]
    assert all(c.verdict == "worse" for c in calls)


# ---- multiple comparisons ----------------------------------------------------------------

def test_holm_and_bh_hand_computed():
    p = [0.01, 0.04, 0.03, 0.005]
    # Holm: sorted 0.005*4, 0.01*3, 0.03*2, 0.04*1, then running max.
    assert adjust_pvalues(p, "holm") == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # BH: sorted p*4/rank = 0.02, 0.02, 0.04, 0.04, then running min from the top.
    assert adjust_pvalues(p, "bh") == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert adjust_pvalues([0.5, 0.9], "holm") == [1.0, 1.0]  # 2*0.5, then max(1.0, 0.9)
    assert adjust_pvalues([], "bh") == []
    with pytest.raises(ValueError):
        adjust_pvalues(p, "bonferroni")


def test_compare_many_adjusts_across_metrics():
    rng = np.random.default_rng(3)
    changed = ("ops", list(range(1, 8)), list(range(8, 15)), True)  # p = 2/3432 alone
    nulls = [(f"m{i}", rng.normal(10, 1, 7), rng.normal(10, 1, 7), True) for i in range(19)]
    assert compare(*changed[1:]).verdict == "better"
    holm = compare_many([changed, *nulls[:4]], method="holm")
    assert [c.name for c in holm] == ["ops", "m0", "m1", "m2", "m3"]
    assert holm[0].p_adjusted == pytest.approx(5 * 2 / 3432)
    assert holm[0].verdict == "better"
    # 7 vs 7 runs cannot survive Holm over 20 tests (20 * 2/3432 > 0.01), and say so.
    holm20 = compare_many([changed, *nulls], method="holm")[0]
    assert holm20.verdict == "too few runs" and not holm20.significant
    assert holm20.note == ("n=7 per side: the smallest possible p is 0.00058 (0.012 after "
                           "Holm's adjustment over 20 tests), not below α=0.01; need ≥ 8 runs")
    holm = holm[:5]
    assert [c.p_adjusted for c in holm] == pytest.approx(
        adjust_pvalues([c.p_value for c in holm], "holm"))
    bh = compare_many([changed, *nulls[:4]], method="bh")
    assert all(c.p_adjusted >= c.p_value for c in bh)
    assert bh[0].change_ci == compare(*changed[1:]).change_ci


def test_compare_many_all_changed_survives_bh():
    pairs = [(f"m{i}", range(1, 8), range(8, 15), True) for i in range(20)]
    assert [c.verdict for c in compare_many(pairs, method="bh")] == ["better"] * 20
    assert [c.verdict for c in compare_many(pairs, method="holm")] == ["too few runs"] * 20


# ---- adaptive repetition -----------------------------------------------------------------

def test_precise_enough_needs_a_real_ci():
    tight = [100.0, 100.1, 99.9, 100.05, 99.95, 100.02]
    assert not precise_enough(tight[:5])  # [min, max] is only 94% coverage
    assert precise_enough(tight)
    assert not precise_enough([90.0, 110.0, 100.0, 95.0, 105.0, 100.0])
    assert not precise_enough([0.0] * 8)


def test_next_action_policy():
    tight = [100.0, 100.1, 99.9, 100.05, 99.95, 100.02]
    wide = [90.0, 110.0, 100.0, 95.0, 105.0, 100.0]
    assert next_action(tight[:3], 5, 10) == "more"
    assert next_action(tight, 5, 10) == "done"
    assert next_action(wide, 5, 10) == "more"
    assert next_action(wide, 3, 6) == "gave_up"
    assert next_action(tight, 3, 6) == "done"
    with pytest.raises(ValueError):
        next_action(tight, 5, 4)


@given(st.lists(st.floats(1, 1000), min_size=1, max_size=25), st.integers(1, 25),
       st.integers(0, 10))
@prop
def test_next_action_terminates_by_max_runs(values, min_runs, extra):
    max_runs = min_runs + extra
    stream = iter(values * 25)
    runs = [next(stream)]
    while (action := next_action(runs, min_runs, max_runs)) == "more":
        runs.append(next(stream))
    assert action in ("done", "gave_up") and len(runs) <= max_runs


# ---- sanity flags ------------------------------------------------------------------------

def test_clock_skew():
    assert clock_skew(10.0, 10.1) is False
    assert clock_skew(10.0, 10.5) is True
    assert clock_skew(10.0, 9.5) is True
    assert clock_skew(10.0, 10.5, tolerance=0.1) is False
    assert clock_skew(None, 1.0) is None
    assert clock_skew(0.0, 1.0) is None
    assert clock_skew(1.0, math.nan) is None
    # A 15 ms channel round trip is not skew, once taken off; nor is jitter within slack.
    assert clock_skew(0.215, 0.2) is True
    assert clock_skew(0.215, 0.2, overhead=0.015) is False
    assert clock_skew(0.22, 0.2, overhead=0.015, slack=0.01) is False
    assert clock_skew(0.25, 0.2, overhead=0.015, slack=0.01) is True


def test_noisy_and_faster_than_baseline():
    assert noisy(summarize([100, 110, 90]))
    assert not noisy(summarize([100, 101, 99]))
    assert not noisy(summarize([100]))
    assert faster_than_baseline(RatioSummary(1.2, 1.05, 1.3), 5, 5)
    assert not faster_than_baseline(RatioSummary(1.2, 0.98, 1.3), 5, 5)


def test_faster_than_baseline_is_tested_with_runs_enough_for_its_interval():
    # issue 18: at 2 vs 2 a "95%" interval above 1 only says both runs beat both baseline
    # runs, which chance does 1 time in 6.
    rng = np.random.default_rng(5)
    by_chance = sum(ratio(rng.normal(100, 3, 2), rng.normal(100, 3, 2), True,
                          n_boot=500).ci_low > 1 for _ in range(300))
    assert 30 < by_chance < 70    # ~1/6 of 300: the interval cannot be trusted at 2 vs 2
    marginal = RatioSummary(1.06, 1.02, 1.09, "range")
    counts = [(2, 2), (3, 3), (3, 4), (2, 6), (4, 4), (3, 5), (5, 5), (1, 39)]
    assert [faster_than_baseline(marginal, n, m) for n, m in counts] == [
        False, False, False, False, True, True, True, True]
    assert [can_test(n, m) for n, m in counts] == [
        False, False, False, False, True, True, True, True]
    assert not faster_than_baseline(marginal, 4, 4, confidence=0.99)
    assert not faster_than_baseline(marginal, 0, 5)


def test_a_clear_win_is_flagged_at_any_run_count():
    # issue 36: gVisor's fio at 7.44 [7.3–7.5] from 2 runs went unflagged. A win whose
    # whole range clears 1 by more than the margin is flagged untested; one within it not.
    clear = RatioSummary(7.44, 7.3, 7.5, "range")
    assert all(faster_than_baseline(clear, n, m) for n, m in [(1, 1), (2, 2), (3, 3), (1, 5)])
    single = RatioSummary(1.55, 1.55, 1.55, "none")
    assert faster_than_baseline(single, 1, 1)
    assert not faster_than_baseline(RatioSummary(1.08, 1.08, 1.08, "none"), 1, 1)
    assert not faster_than_baseline(RatioSummary(1.3, 0.95, 1.6, "range"), 2, 2)


def test_interval_kind_names_ranges_and_single_runs():
    # issue 36: `composite last` printed 1.05 [1.05, 1.05] from one run; a 2-run range was
    # labelled a 95% CI.
    assert [interval_kind(n, m) for n, m in [(1, 1), (1, 2), (2, 2), (3, 3), (4, 4), (3, 5)]] \
        == ["none", "range", "range", "range", "ci", "ci"]
    assert interval_kind(4, 4, 0.99) == "range" and interval_kind(5, 5, 0.99) == "ci"
    assert ratio([10.0], [5.0], True).interval == "none"
    assert ratio([10.0, 11.0], [5.0, 5.5], True).interval == "range"
    assert ratio([10.0, 11.0, 10.5, 10.2], [5.0, 5.5, 5.2, 5.1], True).interval == "ci"
    assert [summarize(range(1, n + 1)).interval for n in (1, 2, 5, 6)] == [
        "none", "range", "range", "ci"]
    assert compare([1.0, 1.1], [1.2, 1.3], True).interval == "range"
    assert compare([1.0, 1.1, 1.05, 1.02, 1.03], [1.2, 1.3, 1.25, 1.22, 1.21], True).interval \
        == "ci"
    assert bracket("ci", "1", "2") == " [1–2]" and bracket("range", "1", "2") == " (1–2)"
    assert bracket("range", "-1%", "+2%") == " (-1%, +2%)"
    assert bracket("ci", "-1%", "+2%") == " [-1%, +2%]" and bracket("none", "1", "1") == ""
    assert bracket("ci", "13,472", "18,272") == " [13,472 – 18,272]"


# ---- interleave --------------------------------------------------------------------------

def test_interleave_two_labels_is_abba():
    assert interleave(["A", "B"], 3) == list("ABBAAB")
    assert interleave(["A", "B"], 4) == list("ABBAABBA")


def test_interleave_three_labels_rotates_and_reverses():
    assert "".join(interleave(["A", "B", "C"], 6)) == "ABC" "CBA" "BCA" "ACB" "CAB" "BAC"


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_interleave_cancels_linear_drift(k):
    labels = [chr(ord("A") + i) for i in range(k)]
    order = interleave(labels, 2 * k)
    assert all(order.count(label) == 2 * k for label in labels)
    position_sums = {label: sum(i for i, x in enumerate(order) if x == label) for label in labels}
    assert len(set(position_sums.values())) == 1
    assert order == interleave(labels, 2 * k)


def test_interleave_edge_cases():
    assert interleave(["only"], 3) == ["only"] * 3
    assert interleave(["A", "B"], 0) == []
    for labels, runs in [([], 2), (["A", "A"], 2), (["A", "B"], -1)]:
        with pytest.raises(ValueError):
            interleave(labels, runs)


def test_a_cell_of_more_than_1023_repetitions_has_a_median_interval():
    """Found by the torture's readers-against-a-writer attack: 2.0 ** n overflowed a float
    from n = 1024, and `vmtax show` of such a run crashed."""
    s = stats.summarize(np.arange(1, 3001, dtype=float))
    assert s.ci_low < s.median < s.ci_high and s.ci_level >= 0.95


@pytest.mark.parametrize("df", [1, 2, 3, 7, 9, 30])
@pytest.mark.parametrize("p", [0.005, 0.025, 0.25])
def test_t_isf_inverts_students_t_as_scipy_does(df, p):
    assert significance.t_isf(p, df) == pytest.approx(sps.t.isf(p, df), rel=1e-9)


# Two middle values near the largest float overflow to inf in their mean, np.median's too.
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=40))
def test_median_is_numpys_bit_for_bit(values):
    """vmtax's medians (no numpy.ma on `show`'s path) are np.median's, bit for bit: even
    and odd n, -0.0, subnormals."""
    x = np.asarray(values)
    assert resampling.median(x).tobytes() == np.median(x).tobytes()
    rows = np.stack([x, x[::-1], -x])
    assert resampling.row_medians(rows).tobytes() == np.median(rows, axis=1).tobytes()


@pytest.mark.parametrize("size", range(1, 10))
def test_medians_of_many_short_rows_are_numpys_bit_for_bit(size):
    """A bootstrap's thousands of resamples of a few repetitions take another way to their
    medians (compare-exchanges of columns): the same bits, ties, -0.0 and 0.0 included."""
    rng = np.random.default_rng(size)
    rows = np.round(rng.normal(size=(2000, size)), 1)
    rows[rows == 0] = -0.0
    rows[::7, 0] = 0.0
    assert resampling.row_medians(rows.copy()).tobytes() == np.median(rows, axis=1).tobytes()
