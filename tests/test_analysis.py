import pytest
from rich.console import Console

from vmtax.analysis.model import analyse
from vmtax.analysis import stats
from vmtax.analysis import summary as analysis
from vmtax.core import plugin
from vmtax.core.types import Metric, MetricSpec
from vmtax.core.workload import Workload
from vmtax.report import comparison_table
from vmtax.report import html as htmlreport
from vmtax.report import terminal as report
from vmtax.results.store import Store

NATIVE = [100, 101, 99, 100, 100, 101]
FASTER = [130, 131, 129, 130, 130, 131]


class Spreads(Workload):
    """A workload only these tests know: its manifest calls one of its metrics a spread.
    Never instantiated, so it needs no jobs or parser."""
    name = "spreads"
    metrics = (MetricSpec("events/s", "events/s", True, primary=True),
               MetricSpec("fairness events stddev", "events", False, spread=True))


@pytest.fixture
def spreads_registered(monkeypatch):
    monkeypatch.setitem(plugin.registry()["workload"], Spreads.name, Spreads)


def store_run(store, targets: dict[str, bool], reps: dict[str, list[list[Metric]]],
              baseline: str, workload: str = "cpu",
              elapsed: dict[str, list[float]] | None = None):
    """A run of one workload: targets maps name -> bare host, reps each one's metrics,
    elapsed (if given) each one's host times."""
    plan = {"targets": [{"name": n, "options": {}} for n in targets], "baseline": baseline}
    run_id = store.new_run(plan, {}, "0")
    for name, bare_host in targets.items():
        store.set_target(run_id, name, "native" if bare_host else "vm", {"bare_host": bare_host})
        for i, metrics in enumerate(reps[name]):
            store.add_rep(run_id, target=name, workload=workload, params={}, phase="measure",
                          idx=i, status="ok", argv=[], started=0.0, metrics=metrics,
                          host_elapsed=elapsed[name][i] if elapsed else None)
    return store.load_run(run_id)


EVENTS = Metric("events/s", 0, "events/s", True)


def run_with(tmp_path, targets: dict[str, bool], values: dict[str, list[float]], baseline: str,
             metric: Metric = EVENTS, workload: str = "cpu"):
    reps = {t: [[Metric(metric.name, v, metric.unit, metric.higher_is_better)] for v in vs]
            for t, vs in values.items()}
    return analysis.summarize_run(store_run(Store(tmp_path), targets, reps, baseline, workload))


def cell(summary, target):
    return summary.rows[0].cells[target]


def test_faster_than_the_bare_host_is_flagged(tmp_path):
    s = run_with(tmp_path, {"native": True, "vm": False}, {"native": NATIVE, "vm": FASTER},
                 "native")
    assert "faster than baseline" in cell(s, "vm").flags


def test_the_fingerprint_not_the_kind_says_what_the_bare_host_is(tmp_path):
    store = Store(tmp_path)
    reps = {"host": [[Metric("events/s", v, "events/s", True)] for v in NATIVE],
            "vm": [[Metric("events/s", v, "events/s", True)] for v in FASTER]}
    run = store_run(store, {"host": False, "vm": False}, reps, "host")
    run.targets["host"] = {"kind": "metal", "fingerprint": {"bare_host": True}}
    assert "faster than baseline" in cell(analysis.summarize_run(run), "vm").flags
    run.targets["host"] = {"kind": "native", "fingerprint": {"bare_host": False}}
    assert "faster than baseline" not in cell(analysis.summarize_run(run), "vm").flags


def test_less_spread_than_native_is_not_flagged_as_faster(tmp_path, spreads_registered):
    # A guest doing fewer events has a smaller stddev of events per thread.
    s = run_with(tmp_path, {"native": True, "vm": False},
                 {"native": [170, 140, 320, 200, 180], "vm": [46, 44, 58, 47, 45]}, "native",
                 Metric("fairness events stddev", 0, "events", False), workload="spreads")
    assert cell(s, "vm").ratio.ci_low > 1 and "faster than baseline" not in cell(s, "vm").flags


@pytest.mark.parametrize("workload", ["spreads", "uninstalled"])
def test_a_metric_no_manifest_declares_is_taken_as_a_speed(tmp_path, spreads_registered,
                                                           workload):
    # A run stored by an older vmtax, or by a plugin not installed here.
    s = run_with(tmp_path, {"native": True, "vm": False},
                 {"native": [170, 140, 320, 200, 180], "vm": [46, 44, 58, 47, 45]}, "native",
                 Metric("undeclared stddev", 0, "events", False), workload=workload)
    assert "faster than baseline" in cell(s, "vm").flags


def test_faster_than_another_target_is_the_finding_not_a_flag(tmp_path):
    s = run_with(tmp_path, {"nohuge": False, "huge": False},
                 {"nohuge": NATIVE, "huge": FASTER}, "nohuge")
    assert cell(s, "huge").ratio.value > 1.2
    assert "faster than baseline" not in cell(s, "huge").flags


def latencies(p50: float, p99: float) -> list[Metric]:
    return [Metric("latency", p50, "us", False, {"percentile": "50"}),
            Metric("latency", p99, "us", False, {"percentile": "99"}),
            Metric("iops", 1000.0, "IO/s", True)]


def test_dimensioned_values_of_one_metric_are_separate_rows(tmp_path):
    run = store_run(Store(tmp_path), {"native": True, "vm": False},
                    {"native": [latencies(10 + i, 100 + i) for i in range(3)],
                     "vm": [latencies(20 + i, 400 + i) for i in range(3)]}, "native")
    rows = analysis.summarize_run(run).rows
    assert [(r.metric, r.dimensions) for r in rows] == [
        ("latency", {"percentile": "50"}), ("latency", {"percentile": "99"}), ("iops", {})]
    p50, p99, _ = rows
    assert p50.cells["native"].n == 3 and p50.cells["native"].summary.median == 11
    assert p99.cells["vm"].summary.median == 401
    assert p50.cells["vm"].ratio.value == pytest.approx(11 / 21)
    assert p99.cells["vm"].ratio.value == pytest.approx(101 / 401)


def test_compare_keeps_dimensioned_values_apart(tmp_path):
    store = Store(tmp_path)
    a = store_run(store, {"native": True}, {"native": [latencies(10 + i, 100 + i)
                                                       for i in range(5)]}, "native")
    b = store_run(store, {"native": True}, {"native": [latencies(10 + i, 200 + i)
                                                       for i in range(5)]}, "native")
    rows = analysis.compare_targets([(a, "native", b, "native")])
    assert [(r.metric, r.dimensions) for r in rows] == [
        ("latency", {"percentile": "50"}), ("latency", {"percentile": "99"}), ("iops", {})]
    p50, p99, _ = rows
    assert p50.comparison.median_b == 12 and p99.comparison.median_b == 202
    assert p99.comparison.name == "latency[percentile=99]"
    assert p99.comparison.significant and not p50.comparison.significant


# -- issue 18: repetitions too short, values at the tool's resolution, too few runs ------

def test_repetitions_shorter_than_a_second_are_flagged_too_short(tmp_path):
    store = Store(tmp_path)
    value = [[Metric("events/s", 100.0, "events/s", True)]] * 3
    run = store_run(store, {"native": True, "vm": False}, {"native": value, "vm": value},
                    "native", elapsed={"native": [0.047, 0.05, 0.9], "vm": [1.4, 0.6, 1.2]})
    native, vm = cell(analysis.summarize_run(run), "native"), cell(
        analysis.summarize_run(run), "vm")
    assert native.duration == pytest.approx(0.05) and native.flags == ["too short"]
    assert vm.duration == pytest.approx(1.2) and vm.flags == []
    # The minimum is a setting; repetitions stored without a host time are not judged.
    assert cell(analysis.summarize_run(run, min_duration=2), "vm").flags == ["too short"]
    untimed = store_run(store, {"native": True}, {"native": value}, "native")
    assert cell(analysis.summarize_run(untimed), "native").flags == []
    assert cell(analysis.summarize_run(untimed), "native").duration is None


def test_the_too_short_flag_shows_its_median_duration(tmp_path):
    short = analysis.Cell(n=3, failed=0, flags=["too short"], duration=0.0472,
                          summary=stats.summarize([1.0, 1.0, 1.0]))
    assert "⚠ too short (47.2 ms)" in report.cell_text(short).plain
    detail = htmlreport._flag_detail("too short", short)
    assert detail.startswith("its repetitions last 47.2 ms (median), too short to time")


def test_a_workload_that_times_itself_says_how_short_a_run_may_be(tmp_path):
    """Issue 48.17: the classic plan's mutex lasts 0.12-0.16 s, so every default run carried
    a "too short" flag; sysbench times that run itself (no start-up, no VM round trip in
    it), and mutex says from how long its time is good (50 ms)."""
    store = Store(tmp_path)
    total = [[Metric("total time", 0.14, "s", False)]] * 3
    run = store_run(store, {"native": True}, {"native": total}, "native", workload="mutex",
                    elapsed={"native": [0.12, 0.16, 0.15]})
    assert cell(analysis.summarize_run(run), "native").flags == []
    shorter = store_run(store, {"native": True}, {"native": total}, "native",
                        workload="mutex", elapsed={"native": [0.03, 0.04, 0.03]})
    assert cell(analysis.summarize_run(shorter), "native").flags == ["too short"]
    memory = store_run(store, {"native": True}, {"native": total}, "native",
                       workload="memory", elapsed={"native": [0.12, 0.16, 0.15]})
    assert cell(analysis.summarize_run(memory), "native").flags == ["too short"]


class Quantized(Workload):
    """Latencies printed in 0.01 ms steps, like sysbench's."""
    name = "quantized"
    metrics = (MetricSpec("events/s", "events/s", True, primary=True),
               MetricSpec("latency avg", "ms", False, resolution=0.01))


@pytest.fixture
def quantized_registered(monkeypatch):
    monkeypatch.setitem(plugin.registry()["workload"], Quantized.name, Quantized)


LATENCY = Metric("latency avg", 0, "ms", False)


def test_a_median_at_the_resolution_gives_no_ratio_and_no_flag(tmp_path, quantized_registered):
    # The guest's latency median is 0.01 ms, the last printed digit: without the resolution
    # it read as 5 times faster than native (and noisy), with it as nothing.
    values = {"native": [0.05, 0.05, 0.06, 0.05, 0.05], "vm": [0.01, 0.01, 0.0, 0.01, 0.01]}
    vm = cell(run_with(tmp_path / "a", {"native": True, "vm": False}, values, "native",
                       LATENCY, workload="quantized"), "vm")
    assert (vm.ratio, vm.no_ratio, vm.flags) == (None, "below resolution", [])
    unknown = cell(run_with(tmp_path / "b", {"native": True, "vm": False}, values, "native",
                            LATENCY, workload="cpu-uninstalled"), "vm")
    assert unknown.ratio.value == pytest.approx(5) and "faster than baseline" in unknown.flags
    # A baseline at the resolution: no target gets a ratio to it.
    s = run_with(tmp_path / "c", {"native": True, "vm": False},
                 {"native": [0.0] * 5, "vm": [0.02, 0.03, 0.02, 0.02, 0.03]}, "native",
                 LATENCY, workload="quantized")
    assert cell(s, "native").no_ratio == cell(s, "vm").no_ratio == "below resolution"
    assert cell(s, "vm").ratio is None
    assert s.to_json()["rows"][0]["cells"]["vm"]["no_ratio"] == "below resolution"
    # Above it, the ratio is read as ever.
    s = run_with(tmp_path / "d", {"native": True, "vm": False},
                 {"native": [0.02] * 5, "vm": [0.04] * 5}, "native", LATENCY,
                 workload="quantized")
    assert cell(s, "vm").ratio.value == pytest.approx(0.5) and cell(s, "vm").no_ratio is None


def test_below_resolution_is_what_the_table_and_the_html_say(tmp_path, quantized_registered):
    run = store_run(Store(tmp_path), {"native": True, "vm": False},
                    {"native": [[Metric("latency avg", 0.0, "ms", False)]] * 5,
                     "vm": [[Metric("latency avg", 0.02, "ms", False)]] * 5}, "native",
                    workload="quantized")
    summary = analysis.summarize_run(run)
    console = Console(record=True, width=160)
    report.print_summary(console, run, summary)
    table = console.export_text()
    body = table.split("median [95% CI]")[0]   # the caption explains ×ratios
    assert body.count("below resolution") == 2 and "×" not in body
    html = htmlreport.render_html([htmlreport.build(analyse(run))])
    assert html.count('data-no-ratio="below resolution"') == 2


def test_compare_says_below_resolution_and_too_few_runs(tmp_path, quantized_registered):
    store = Store(tmp_path)

    def side(eps, latency):
        return store_run(store, {"native": True},
                         {"native": [[Metric("events/s", e, "events/s", True),
                                      Metric("latency avg", lat, "ms", False)]
                                     for e, lat in zip(eps, latency)]},
                         "native", workload="quantized")

    a, b = side([100, 101], [0.0, 0.01]), side([17, 18], [0.01, 0.01])
    eps, latency = (r.comparison for r in
                    analysis.compare_targets([(a, "native", b, "native")]))
    assert (eps.verdict, eps.note) == (
        "too few runs", "n=2 per side: the smallest possible p is 0.33, not below α=0.01; "
                        "need ≥ 5 runs")
    assert latency.verdict == "below resolution"
    console = Console(record=True, width=200)
    comparison_table.print_comparison(
        console, analysis.compare_targets([(a, "native", b, "native")]), 0.01, 0.02, "bh")
    text = console.export_text()
    assert "n=2 per side: the smallest possible p is 0.33" in text
    assert "resolution │" in text and "inf" not in text   # "below" wraps above it
