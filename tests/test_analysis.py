from vmtax import analysis
from vmtax.store import Store
from vmtax.workloads.base import Metric


def run_with(tmp_path, kinds: dict[str, str], values: dict[str, list[float]], baseline: str,
             metric: Metric = Metric("events/s", 0, "events/s", True)):
    store = Store(tmp_path)
    plan = {"targets": [{"name": n, "kind": k, "options": {}} for n, k in kinds.items()],
            "baseline": baseline}
    run_id = store.new_run(plan, {}, "0")
    for name, kind in kinds.items():
        store.set_target(run_id, name, kind, {})
        for i, v in enumerate(values[name]):
            store.add_rep(run_id, target=name, workload="cpu", params={}, phase="measure",
                          idx=i, status="ok", argv=[], started=0.0,
                          metrics=[Metric(metric.name, v, metric.unit, metric.higher_is_better)])
    return analysis.summarize_run(store.load_run(run_id))


def cell(summary, target):
    return summary.rows[0].cells[target]


def test_faster_than_native_is_flagged(tmp_path):
    s = run_with(tmp_path, {"native": "native", "vm": "vm"},
                 {"native": [100, 101, 99, 100, 100, 101], "vm": [130, 131, 129, 130, 130, 131]},
                 "native")
    assert "faster than baseline" in cell(s, "vm").flags


def test_less_spread_than_native_is_not_flagged_as_faster(tmp_path):
    # A guest doing fewer events has a smaller stddev of events per thread.
    s = run_with(tmp_path, {"native": "native", "vm": "vm"},
                 {"native": [170, 140, 320, 200, 180], "vm": [46, 44, 58, 47, 45]}, "native",
                 Metric("fairness events stddev", 0, "events", False))
    assert cell(s, "vm").ratio.ci_low > 1 and "faster than baseline" not in cell(s, "vm").flags


def test_faster_than_another_target_is_the_finding_not_a_flag(tmp_path):
    s = run_with(tmp_path, {"nohuge": "vm", "huge": "vm"},
                 {"nohuge": [100, 101, 99, 100, 100, 101], "huge": [130, 131, 129, 130, 130, 131]},
                 "nohuge")
    assert cell(s, "huge").ratio.value > 1.2
    assert "faster than baseline" not in cell(s, "huge").flags
