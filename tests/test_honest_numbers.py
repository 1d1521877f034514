"""Numbers that never overclaim (issue 36): wins over the bare host flagged at any run
count, intervals from one or two runs never passed off as confidence intervals, the
profiler's bookkeeping kept out of the results, capacities that are only lower bounds kept
out of the index, and an environment shown without Python's spelling."""

import io
import re

import pytest
from rich.console import Console

from vmtax.analysis import composite
from vmtax.analysis import summary as analysis
from vmtax.analysis.model import analyse
from vmtax.analysis.stats import RatioSummary
from vmtax.analysis.summary import Cell, Row, RunSummary
from vmtax.core.workload import LOWER_BOUND, Metric
from vmtax.report import parts
from vmtax.report import comparison_table
from vmtax.report import html as htmlreport
from vmtax.report import terminal as report
from vmtax.report.composite_table import print_composite
from vmtax.results.store import Store

TARGETS = {"native": {"kind": "native", "bare_host": True},
           "container": {"kind": "container", "bare_host": False, "runtime": "runc"}}
# The container "wins" fileio (the page cache) and loses a little CPU.
KEEPS = {"cpu": 0.95, "fileio": 1.6}


def _metrics(target, workload, idx):
    keep = KEEPS[workload] if target == "container" else 1.0
    wiggle = 1 + 0.01 * (idx % 2)
    if workload == "cpu":
        return [Metric("events/s", 1000 * keep * wiggle, "events/s", True)]
    return [Metric("reads/s", 3000 * keep * wiggle, "reads/s", True),
            Metric("writes/s", 2000 * keep * wiggle, "writes/s", True)]


def make_run(store, runs, slower=1.0):
    run_id = store.new_run({"targets": [{"name": t} for t in TARGETS], "baseline": "native",
                            "runs": runs, "warmup": 0, "time": 1}, {"cpu_model": "x"}, "0.1.0")
    for name, fp in TARGETS.items():
        store.set_target(run_id, name, fp["kind"], fp)
    for workload in ("cpu", "fileio"):
        for target in TARGETS:
            for idx in range(runs):
                metrics = [Metric(m.name, m.value * slower, m.unit, m.higher_is_better)
                           for m in _metrics(target, workload, idx)]
                store.add_rep(run_id, target=target, workload=workload, params={},
                              phase="measure", idx=idx, status="ok", argv=["sysbench"],
                              started=float(idx), host_elapsed=2.0, metrics=metrics)
    store.finish_run(run_id, "done")
    return store.load_run(run_id)


def _printed(fn, *args) -> str:
    console = Console(file=io.StringIO(), width=160, color_system=None)
    fn(console, *args)
    return console.file.getvalue()


# An interval whose bounds are equal ([1.05, 1.05]): one run passed off as a CI.
POINT = re.compile(r"\[([\d.,]+)(?:, |–)\1\]")


@pytest.mark.parametrize("runs", [1, 2])
def test_a_clear_win_is_flagged_and_explained_at_any_run_count(tmp_path, runs):
    model = analyse(make_run(Store(tmp_path), runs))
    fileio = next(r for r in model.summary.rows if r.metric == "reads/s")
    assert composite.FASTER in fileio.cells["container"].flags
    headline = _printed(report.print_headline, model)
    assert "suspicious win: container · fileio reads/s" in headline
    assert f"too few runs to test the win, n={runs}" in headline
    assert "faster than baseline (too few runs to test it" in _printed(
        report.print_summary, model.run, model.summary)
    # a loss within noise is no suspicious win, nor a weakest metric
    cpu = next(r for r in model.summary.rows if r.metric == "events/s")
    assert composite.FASTER not in cpu.cells["container"].flags


def test_one_run_shows_no_interval_anywhere(tmp_path):
    store = Store(tmp_path)
    a, b = make_run(store, 1), make_run(store, 1, slower=0.93)
    model = analyse(a)
    texts = [_printed(report.print_headline, model),
             _printed(report.print_summary, a, model.summary),
             _printed(print_composite, model.summary, model.classes, model.explanations)]
    rows = analysis.compare_targets([(a, "container", b, "container")])
    texts.append(_printed(comparison_table.print_comparison, rows, 0.01, 0.02, "bh"))
    html = htmlreport.render_html([htmlreport.build(model)])
    for text in [*texts, html]:
        assert not POINT.search(text), POINT.search(text).group(0)
    assert "-7.0%" in texts[-1] and "-7.0% [" not in texts[-1]
    assert all(c.interval == "none" for ci in model.classes for c in ci.by_target.values())


def test_two_runs_show_a_range_called_a_range(tmp_path):
    store = Store(tmp_path)
    a, b = make_run(store, 2), make_run(store, 2, slower=0.93)
    model = analyse(a)
    headline = _printed(report.print_headline, model)
    assert re.search(r"1\.60 \(1\.6–1\.6\)", headline)
    assert "ratio to it (a range: the runs' extremes, too few runs for a 95% CI)" in headline
    index = _printed(print_composite, model.summary, model.classes, model.explanations)
    assert "(" in index and "range" in index and not re.search(r"\d \[\d", index)
    rows = analysis.compare_targets([(a, "container", b, "container")])
    compared = _printed(comparison_table.print_comparison, rows, 0.01, 0.02, "bh")
    assert re.search(r"-7\.0% \(-7\.\d%, -6\.\d%\)", compared)
    assert "or (range of the runs: too few for a CI)" in compared
    assert rows[0].comparison.interval == "range"
    html = htmlreport.render_html([htmlreport.build(model)])
    assert "<small>(1.6–1.6)</small>" in html and "<small>[" not in html


def test_the_weakest_metric_is_one_told_apart_from_native(tmp_path):
    # issue 36: "cpu latency max keeps 40.1% (×0.4012 [0.1129, 3.1])" was picked
    model = analyse(make_run(Store(tmp_path), 2))
    assert model.worst == {}
    html = htmlreport.render_html([htmlreport.build(model)])
    assert re.search(r"container \(runc\)</strong>: none told apart from native", html)
    loses = Cell(n=5, failed=0, ratio=RatioSummary(0.5, 0.4, 0.6))
    unclear = Cell(n=5, failed=0, ratio=RatioSummary(0.4, 0.11, 3.1))
    summary = RunSummary("r", "native", ["native", "container"], [
        Row("cpu", {}, "events/s", {}, "events/s", True,
            {"native": Cell(n=5, failed=0), "container": loses}),
        Row("cpu", {}, "latency max", {}, "ms", False,
            {"native": Cell(n=5, failed=0), "container": unclear})], [])
    from vmtax.analysis.model import _worst
    assert _worst(summary)["container"][0].metric == "events/s"


def test_a_capacity_that_is_only_a_lower_bound_is_not_averaged_in():
    bounded = f"{LOWER_BOUND}: ≥ 200/s, no step failed"

    def cell(value, flags=()):
        return Cell(n=5, failed=0, ratio=RatioSummary(value, value * 0.95, value * 1.05),
                    flags=list(flags))
    rows = [Row("serving", {}, "requests/s", {"endpoint": e}, "requests/s", True,
                {"native": Cell(n=5, failed=0, flags=[bounded] if e != "upload" else []),
                 "container": cell(ratio, [bounded] if e != "upload" else [])})
            for e, ratio in (("download", 1.0), ("small", 1.0), ("upload", 0.8))]
    summary = RunSummary("r", "native", ["native", "container"], rows, [])
    network = composite.composite(summary)[0]
    assert network.cls == "network"
    assert network.by_target["container"].value == pytest.approx(0.8)
    assert len(network.skipped) == 2 and "only a lower bound" in network.skipped[0]


def test_the_environment_is_shown_as_words_not_python():
    assert parts.fingerprint_value(None) == parts.fingerprint_value([]) == "–"
    assert parts.fingerprint_value(0.03536973999987007) == "0.03537"
    assert parts.fingerprint_value([{"pid": 17207, "name": "pip", "cpu": 0.4},
                                     {"pid": 3, "name": "sh", "cpu": 0.2}]) == \
        "pid=17207 name=pip cpu=0.4; pid=3 name=sh cpu=0.2"
    items = dict(htmlreport.fingerprint_items(
        {"quiet": {"busiest": [{"pid": 17207}], "turbo": None, "load": [1.39, 2.0]}}))
    assert items == {"quiet.busiest": "pid=17207", "quiet.turbo": "–",
                     "quiet.load": "1.39, 2"}


def test_trends_and_figures_call_a_range_a_range(tmp_path):
    from vmtax.analysis.stats import compare
    from vmtax.report import plots
    def shown(c):
        return parts.change_interval(c.interval, *c.change_ci)
    assert re.fullmatch(r" \(\+\d+\.\d%, \+\d+\.\d%\)",
                        shown(compare([1.0, 1.1], [1.2, 1.3], True)))
    assert shown(compare([1.0], [1.2], True)) == ""
    model = analyse(make_run(Store(tmp_path), 2))
    captions = [c.caption for c in plots.charts(model.summary, {})]
    assert any("or where there are too few runs for one" in c for c in captions)


@pytest.mark.parametrize("runs", [1, 2])
def test_a_container_serving_uploads_faster_than_native_is_flagged(tmp_path, runs):
    """issue 36: serving showed a container uploading at 2.29× native, unflagged. A
    serving cell's win goes through the same rule as any: flagged, explained, and said to
    be untested below the runs a test needs."""
    store = Store(tmp_path)
    run_id = store.new_run({"targets": [{"name": t} for t in TARGETS], "baseline": "native",
                            "runs": runs, "warmup": 0, "time": 2}, {"cpu_model": "x"}, "0.1.0")
    for name, fp in TARGETS.items():
        store.set_target(run_id, name, fp["kind"], fp)
    for target, upload in (("native", 100.0), ("container", 229.0)):
        for idx in range(runs):
            wiggle = 1 + 0.01 * idx
            store.add_rep(run_id, target=target, workload="serving",
                          params={"mode": "workers"}, phase="measure", idx=idx, status="ok",
                          argv=["vegeta"], started=float(idx), host_elapsed=2.0, metrics=[
                              Metric("requests/s", value * wiggle, "requests/s", True,
                                     {"endpoint": endpoint})
                              for endpoint, value in (("download", 1000.0), ("upload", upload))])
    store.finish_run(run_id, "done")
    model = analyse(store.load_run(run_id))
    upload = next(r for r in model.summary.rows if r.dimensions == {"endpoint": "upload"})
    assert composite.FASTER in upload.cells["container"].flags
    headline = _printed(report.print_headline, model)
    assert "suspicious win: container · serving" in " ".join(headline.split())
    assert f"too few runs to test the win, n={runs}: flagged as its ×2.29" in " ".join(
        headline.split())
    download = next(r for r in model.summary.rows if r.dimensions == {"endpoint": "download"})
    assert composite.FASTER not in download.cells["container"].flags
    # a server reads and writes files: its win is not said to have "no I/O to explain it"
    assert "no I/O" not in headline and "network path differs" in " ".join(headline.split())
