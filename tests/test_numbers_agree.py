"""Numbers that never contradict each other: a ratio inside its own printed interval, and
no raw value where a ratio belongs."""

import random
import re

import pytest
from rich.console import Console
from test_ux import store_classic

from vmtax.analysis.model import analyse
from vmtax.analysis import summary as analysis
from vmtax.report import parts
from vmtax.report import terminal as report
from vmtax.results.store import Store


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def test_a_printed_ratio_lies_within_its_printed_interval():
    # 1.0057 [0.904, 1.027] was printed "1.01 [0.9–1.0]"
    assert parts.ratio_texts(1.0057, 0.904, 1.027) == ("1.01", "0.9", "1.03")
    # where two digits already hold the ratio, the interval keeps them
    assert parts.ratio_texts(0.95, 0.94, 0.96) == ("0.950", "0.94", "0.96")
    rng = random.Random(30)
    for _ in range(20000):
        low = rng.uniform(0.01, 50)
        value = low * rng.uniform(1, 1.05)
        high = value * rng.uniform(1, 1.05)
        shown, low_text, high_text = parts.ratio_texts(value, low, high)
        assert _number(low_text) <= _number(shown) <= _number(high_text), (value, low, high)


def test_a_shown_bound_is_on_the_side_of_1_the_true_one_is():
    """Issue 48.9: a bound of 0.996 shown as 1.0, or of 1.003 or 1.017 as 1.0, told a
    reader the interval reached 1."""
    assert parts.ratio_texts(0.97, 0.9, 0.996) == ("0.970", "0.9", "0.996")
    assert parts.ratio_texts(0.99, 0.9772, 1.003) == ("0.990", "0.98", "1.003")
    assert parts.ratio_texts(1.03, 1.017, 1.044) == ("1.03", "1.02", "1.04")
    rng = random.Random(48)
    for _ in range(20000):
        value = rng.uniform(0.5, 1.5)
        low, high = value * rng.uniform(0.9, 1), value * rng.uniform(1, 1.1)
        shown = parts.ratio_texts(value, low, high)
        for true, text in ((low, shown[1]), (high, shown[2])):
            assert (true < 1) == (_number(text) < 1) and (true > 1) == (_number(text) > 1), (
                true, text)


def test_the_headline_prints_every_ratio_within_its_interval(tmp_path):
    run_id = store_classic(tmp_path, keeps={"native": 1.0, "container": 1.0057, "vm": 0.6})
    run = Store(tmp_path).load_run(run_id)
    console = Console(record=True, width=120)
    report.print_headline(console, analyse(run))
    text = console.export_text()
    for shown, low, high in re.findall(r"([\d.]+) \[([\d.]+)–([\d.]+)\]", text):
        assert float(low) <= float(shown) <= float(high), text


@pytest.mark.parametrize("baseline_status", ["failed", "missing"])
def test_a_failed_baseline_leaves_no_raw_value_in_a_ratio_column(tmp_path, baseline_status):
    run_id = store_classic(tmp_path, workload_names=["cpu"])
    store = Store(tmp_path)
    run = store.load_run(run_id)
    # the baseline's cell failed (or never ran): the others have a median but no ratio
    if baseline_status == "failed":
        for rep in run.reps:
            if rep.target == "native":
                rep.status, rep.error, rep.metrics[:] = "failed", "exit status 1", []
    else:
        run.reps[:] = [r for r in run.reps if r.target != "native"]
    summary = analysis.summarize_run(run)
    cell = analysis.headline(summary.rows)[0].cells["vm"]
    assert cell.ratio is None and cell.summary is not None
    why = "native failed" if baseline_status == "failed" else "not run on native"
    assert cell.no_ratio == f"no ratio: {why}"
    console = Console(record=True, width=120)
    report.print_headline(console, analyse(run))
    text = console.export_text()
    assert f"no ratio: {why}" in text
    assert parts.fmt(cell.summary.median) not in text.split("no ratio")[0].splitlines()[-1]


def test_a_collector_that_could_not_record_is_not_a_failure(tmp_path):
    """host-cpu on a container: "not recorded: why" in the table, not "failed ×1"."""
    store = Store(tmp_path)
    run_id = store.new_run({"targets": [{"name": "native"}, {"name": "container"}],
                            "baseline": "native"}, {}, "0")
    why = "container has no host process or cgroup that lasts the cell"
    for target in ("native", "container"):
        store.set_target(run_id, target, target, {})
        recorded = target == "native"
        store.add_rep(run_id, target=target, workload="cpu", params={}, phase="collect",
                      idx=0, status="ok" if recorded else "unavailable", argv=["host-cpu"],
                      started=0.0, error=None if recorded else f"host-cpu: unavailable — {why}",
                      metrics=[analysis.Metric("host cpu", 1.5, "s", False)] if recorded
                      else [])
    run = store.load_run(run_id)
    summary = analysis.summarize_run(run)
    cell = summary.rows[0].cells["container"]
    assert (cell.failed, cell.not_recorded) == (0, why)
    assert report.cell_text(cell).plain == f"not recorded: {why}"
    assert summary.failures == []


def test_each_collector_s_row_gives_its_own_reason(tmp_path):
    """Two collectors that could not record on native: each row says its own why, not the
    first collector's."""
    store = Store(tmp_path)
    run_id = store.new_run({"targets": [{"name": "native"}, {"name": "container"}],
                            "baseline": "native"}, {}, "0")
    store.set_target(run_id, "native", "native", {})
    whys = {"host-cpu": "no cgroup here", "host-mem": "no process that lasts the cell"}
    for idx, (name, why) in enumerate(whys.items()):
        store.add_rep(run_id, target="native", workload="cpu", params={}, phase="collect",
                      idx=idx, status="unavailable", argv=[name], started=0.0,
                      error=f"{name}: unavailable — {why}", metrics=[])
    store.set_target(run_id, "container", "container", {})
    store.add_rep(run_id, target="container", workload="cpu", params={}, phase="collect",
                  idx=0, status="ok", argv=["host-cpu"], started=0.0, error=None,
                  metrics=[analysis.Metric("host cpu", 1.5, "s", False),
                           analysis.Metric("host pss peak", 20.0, "MiB", False)])
    rows = {row.metric: row for row in analysis.summarize_run(store.load_run(run_id)).rows}
    assert rows["host cpu"].cells["native"].not_recorded == whys["host-cpu"]
    assert rows["host pss peak"].cells["native"].not_recorded == whys["host-mem"]
