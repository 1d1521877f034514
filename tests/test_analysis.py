import pytest

from vmtax import analysis, workloads
from vmtax.store import Store
from vmtax.types import Metric, MetricSpec
from vmtax.workloads.base import Workload

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
    monkeypatch.setattr(workloads, "registered", lambda: {"spreads": Spreads})


def store_run(store, targets: dict[str, bool], reps: dict[str, list[list[Metric]]],
              baseline: str, workload: str = "cpu"):
    """A run of one workload: targets maps name -> bare host, reps each one's metrics."""
    plan = {"targets": [{"name": n, "options": {}} for n in targets], "baseline": baseline}
    run_id = store.new_run(plan, {}, "0")
    for name, bare_host in targets.items():
        store.set_target(run_id, name, "native" if bare_host else "vm", {"bare_host": bare_host})
        for i, metrics in enumerate(reps[name]):
            store.add_rep(run_id, target=name, workload=workload, params={}, phase="measure",
                          idx=i, status="ok", argv=[], started=0.0, metrics=metrics)
    return store.load_run(run_id)


def run_with(tmp_path, targets: dict[str, bool], values: dict[str, list[float]], baseline: str,
             metric: Metric = Metric("events/s", 0, "events/s", True), workload: str = "cpu"):
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
