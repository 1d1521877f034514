"""The composite index: each workload counts once, per class and overall, with intervals
propagated in log space, and a recommendation only beyond noise."""

import math

import pytest
from rich.console import Console

from vmtax.analysis import composite
from vmtax.analysis.composite import Index, combine
from vmtax.analysis.stats import RatioSummary
from vmtax.analysis.summary import Cell, Row, RunSummary
from vmtax.report.composite_table import print_composite


def cell(value, low, high) -> Cell:
    return Cell(n=3, failed=0, ratio=RatioSummary(value, low, high))


def row(workload, metric, cells, **dims) -> Row:
    return Row(workload, {}, metric, dims, "s", False,
               {"native": Cell(n=3, failed=0), **cells})


def summary(rows) -> RunSummary:
    return RunSummary("r1", "native", ["native", "container", "vm"], rows, [])


def test_combine_is_a_geometric_mean_with_log_space_intervals():
    one = combine([Index(2.0, 1.0, 4.0), Index(0.5, 0.25, 1.0)])
    assert one.value == pytest.approx(1.0)
    # each side: sqrt(2 * ln(2)^2) / 2 = ln(2) / sqrt(2)
    assert one.ci_low == pytest.approx(math.exp(-math.log(2) / math.sqrt(2)))
    assert one.ci_high == pytest.approx(math.exp(math.log(2) / math.sqrt(2)))
    with pytest.raises(ValueError):
        combine([])


def test_a_workload_counts_once_whatever_its_dimensions():
    rows = [
        row("dd", "throughput", {"vm": cell(4.0, 3.0, 5.0), "container": cell(1, 0.9, 1.1)},
            mode="buffered"),
        row("dd", "throughput", {"vm": cell(0.25, 0.2, 0.3), "container": cell(1, 0.9, 1.1)},
            mode="direct"),
        row("dbench", "throughput", {"vm": cell(0.5, 0.4, 0.6),
                                     "container": cell(1, 0.9, 1.1)}),
        # not primary: never counted
        row("dbench", "max latency", {"vm": cell(100, 90, 110), "container": cell(1, 1, 1)}),
        row("bzip2", "time", {"vm": cell(0.8, 0.75, 0.85), "container": cell(1, 0.98, 1.02)},
            input="file"),
    ]
    classes = {c.cls: c for c in composite.composite(summary(rows))}
    assert list(classes) == ["CPU", "disk I/O", "overall"]
    disk = classes["disk I/O"]
    # dd's two copies make one workload of ratio 1, then the mean with dbench's 0.5
    assert disk.by_target["vm"].value == pytest.approx(math.sqrt(1.0 * 0.5))
    assert disk.by_target["vm"].parts == ("dd", "dbench")
    assert disk.by_target["native"] == Index(1.0, 1.0, 1.0, interval="none")
    overall = classes["overall"].by_target["vm"]
    assert overall.value == pytest.approx((1.0 * 0.5 * 0.8) ** (1 / 3))
    # container's interval holds native's 1; the VM's lies below it
    assert classes["CPU"].recommendation == \
        "CPU: no significant difference between native and container; vm keeps 0.800 of native"


def test_recommendation_only_beyond_noise():
    wins = {"native": Index(1, 1, 1), "vm": Index(1.3, 1.1, 1.5), "c": Index(1.0, 0.9, 1.05)}
    assert composite.recommend("CPU", wins, "native") == "CPU: vm (index 1.30 [1.1–1.5])"
    overlaps = {"native": Index(1, 1, 1), "vm": Index(1.3, 0.95, 1.5)}
    # an interval this wide (±21%) cannot rule out a difference: it is no answer
    assert composite.recommend("CPU", overlaps, "native") == (
        "CPU: not told apart: too noisy to tell (±21%)")
    # the baseline itself wins when every other target is worse beyond noise
    loses = {"native": Index(1, 1, 1), "vm": Index(0.5, 0.4, 0.6)}
    assert composite.recommend("disk I/O", loses, "native") == \
        "disk I/O: native (the others lose beyond noise; vm keeps 0.500 of native)"


def test_the_verdict_ends_with_the_biggest_fact():
    # a tie between native and container must not hide a VM at a tenth of native
    tie = {"native": Index(1, 1, 1), "container": Index(1.01, 0.99, 1.03),
           "vm:tcg": Index(0.109, 0.1, 0.12), "vm:kvm": Index(0.8, 0.7, 0.9)}
    assert composite.recommend("CPU", tie, "native") == (
        "CPU: no significant difference between native and container; "
        "vm:tcg keeps 0.109 of native, vm:kvm 0.800")
    # a winner other than the baseline, with its doubt, then the loss beside it
    won = {"native": Index(1, 1, 1), "container": Index(1.3, 1.1, 1.5),
           "vm": Index(0.1, 0.09, 0.11)}
    assert composite.recommend("CPU", won, "native", {"container": ", suspicious"}) == \
        "CPU: container (index 1.30 [1.1–1.5]), suspicious; vm keeps 0.100 of native"
    # the baseline among the losers is only said to be worse: its index is 1 by definition
    above = {"native": Index(1, 1, 1), "container": Index(1.3, 1.2, 1.4),
             "vm": Index(1.2, 0.9, 1.5)}
    assert composite.recommend("CPU", above, "native") == \
        "CPU: not told apart between container and vm: too noisy to tell (±25%); native worse"


def test_cells_without_a_ratio_are_left_out_and_said():
    rows = [row("dbench", "throughput", {"vm": Cell(n=0, failed=3),
                                         "container": cell(0.9, 0.8, 1.0)})]
    disk = composite.composite(summary(rows))[0]
    assert set(disk.by_target) == {"native", "container"}
    assert disk.skipped == ["throughput of dbench on vm: no ratio (failed or missing runs)"]
    console = Console(record=True, width=200)
    made = summary(rows)
    print_composite(console, made, composite.composite(made), composite.explanations(made))
    text = console.export_text()
    assert "0.900 [0.8–1.0]" in text and "not counted: throughput of dbench on vm" in text
    assert "disk I/O: not told apart: too noisy to tell (±11%)" in text


def test_single_runs_give_no_verdict():
    single = {"native": Index(1, 1, 1), "vm": Index(2.0, 2.0, 2.0, runs=1)}
    assert composite.recommend("CPU", single, "native") == \
        "CPU: too few runs for a verdict (at least 3 per target)"
    two = {"native": Index(1, 1, 1), "vm": Index(2.0, 1.5, 2.5, runs=2)}
    assert composite.recommend("CPU", two, "native").startswith("CPU: too few runs")
    assert combine([Index(2, 1, 3, runs=3), Index(2, 1, 3, runs=1)]).runs == 1


# -- suspicious wins, from stored results -------------------------------------------------

def _stored_dd_run(tmp_path, vm_direct: float, vm_guest_elapsed: float = 2.0):
    from vmtax.analysis import summary as analysis
    from vmtax.results.store import Store
    run_id = store_dd_run(tmp_path / "results", vm_direct, vm_guest_elapsed)
    return analysis.summarize_run(Store(str(tmp_path / "results")).load_run(run_id))


def store_dd_run(results, vm_direct: float, vm_guest_elapsed: float = 2.0) -> str:
    """A run stored in results as the runner stores one: native (the bare host) and a VM,
    5 dd runs each; the VM's buffered copy is 3 times native's, its direct copy
    `vm_direct` (native's: 100 MB/s)."""
    from vmtax.results.store import Store
    from vmtax.workloads.dd import Dd
    store = Store(str(results))
    plan = {"baseline": "native", "targets": [{"name": "native"}, {"name": "vm"}]}
    run_id = store.new_run(plan, {}, "test")
    store.set_target(run_id, "native", "native", {"kind": "native", "bare_host": True})
    store.set_target(run_id, "vm", "vm", {"kind": "vm", "job_overhead_s": 0.0})
    dd = Dd.make({})
    for target, buffered, direct in (("native", 300.0, 100.0), ("vm", 900.0, vm_direct)):
        for i in range(5):
            metrics = [dd.metric("throughput", buffered + i, mode="buffered"),
                       dd.metric("throughput", direct + i, mode="direct")]
            store.add_rep(run_id, target=target, workload="dd", params=dd.params,
                          phase="measure", idx=i, status="ok", argv=["dd"], started=0.0,
                          host_elapsed=2.0, guest_elapsed=vm_guest_elapsed
                          if target == "vm" else None, metrics=metrics)
    store.finish_run(run_id, "done")
    store.close()
    return run_id


def test_buffered_dd_win_without_a_direct_one_is_the_host_page_cache(tmp_path):
    lines = composite.explanations(_stored_dd_run(tmp_path, vm_direct=60.0))
    assert len(lines) == 1
    assert lines[0].startswith("vm · dd throughput mode=buffered: host page cache: the "
                               "buffered copy beats native but the oflag=direct copy "
                               "does not (×0.6")


def test_direct_dd_win_too_blames_the_disk_cache_and_clock_drift_comes_first(tmp_path):
    lines = composite.explanations(_stored_dd_run(tmp_path / "a", vm_direct=300.0))
    assert len(lines) == 2 and "O_DIRECT copy wins too" in lines[0]
    drift = composite.explanations(_stored_dd_run(tmp_path / "b", vm_direct=60.0,
                                                  vm_guest_elapsed=1.0))
    assert drift and "guest clock drift" in drift[0]


def test_no_win_no_explanation(tmp_path):
    summary = _stored_dd_run(tmp_path, vm_direct=60.0)
    for row in summary.rows:
        row.cells["vm"].flags.clear()
    assert composite.explanations(summary) == []


def test_a_class_won_against_the_bare_host_is_called_suspicious():
    rows = [row("bzip2", "time", {"vm": cell(0.5, 0.4, 0.6), "container": cell(1.3, 1.1, 1.5)},
                input="file")]
    on_host = summary(rows)
    on_host.baseline_bare_host = True
    assert composite.composite(on_host)[0].recommendation == \
        "CPU: container (index 1.30 [1.1–1.5]), faster than native: suspicious; " \
        "vm keeps 0.500 of native"
    # against another target (E5's huge pages) a win is the finding itself
    assert composite.composite(summary(rows))[0].recommendation == \
        "CPU: container (index 1.30 [1.1–1.5]); vm keeps 0.500 of native"
