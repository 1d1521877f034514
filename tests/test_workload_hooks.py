"""The hooks of the Workload contract that the parts above the plugins call instead of
naming a workload: the stream its report is on, its own cell flags, its explanations of
suspicious wins and its own figures. Each is tried with a tiny workload only these tests
know, so a part that went back to naming a workload would fail them."""

import sys

import pytest

from vmtax.analysis import composite
from vmtax.analysis import summary as analysis
from vmtax.analysis.stats import Summary
from vmtax.analysis.summary import Cell, Row, RunSummary
from vmtax.core import plugin
from vmtax.core.figures import Bars, Lines, Mark
from vmtax.core.types import Job, JobResult, Metric, MetricSpec
from vmtax.core.workload import Outcome, Workload
from vmtax.report import plots
from vmtax.results.store import Store
from vmtax.studies import plan as plan_mod
from vmtax.studies.runner import Runner
from vmtax.workloads.dd import Dd

# -- the report's stream -----------------------------------------------------------------

# Prints a decoy on stdout and its report on stderr, as stress-ng does.
_ON_STDERR = "import sys; print('decoy'); print({}, file=sys.stderr)"


class OnStderr(Workload):
    name = "stderr-test"
    report_stream = "stderr"
    metrics = (MetricSpec("value", "u", True, primary=True),
               MetricSpec("prepared", "u", True))

    def prepare_jobs(self):
        return [Job([sys.executable, "-c", _ON_STDERR.format(3)], timeout=10)]

    def run_job(self):
        return Job([sys.executable, "-c", _ON_STDERR.format(42)], timeout=10)

    def parse(self, output):
        return [self.metric("value", int(output))]

    def parse_prepare(self, output):
        return [self.metric("prepared", int(output))]


def test_a_report_on_stderr_reaches_the_parsers(tmp_path, monkeypatch):
    monkeypatch.setitem(plugin.registry()["workload"], OnStderr.name, OnStderr)
    plan = plan_mod.Plan(targets=plan_mod.target_specs(["native"], {}),
                         workloads=[plan_mod.WorkloadSpec(OnStderr.name, {})],
                         runs=1, warmup=0, time=None)
    store = Store(tmp_path)
    run = store.load_run(Runner(plan, store).execute(), with_output=True)
    prepare, measure = run.reps
    assert (prepare.phase, prepare.status, [m.value for m in prepare.metrics]) == (
        "prepare", "ok", [3.0])
    assert (measure.status, [m.value for m in measure.metrics]) == ("ok", [42.0])
    # Both streams are stored, whichever was read.
    assert (measure.stdout, measure.stderr) == ("decoy\n", "42\n")


def test_the_report_is_on_stdout_unless_declared():
    result = JobResult(0, "out", "err", 1.0)
    assert Workload.report_stream == "stdout"
    assert Dd.make({}).report(result) == "out"
    assert OnStderr.make({}).report(result) == "err"


# -- flags on a cell -----------------------------------------------------------------------

class Capped(Workload):
    """Says on its throughput when a repetition hit its cap (a metric of its own)."""
    name = "capped"
    metrics = (MetricSpec("events/s", "events/s", True, primary=True),
               MetricSpec("capped", "flag", False, secondary=True))

    @classmethod
    def cell_flags(cls, metric_key, reps):
        hits = sum(m.value for metrics in reps for m in metrics if m.name == "capped")
        return [f"capped: {hits:g} of {len(reps)} runs"] if metric_key == "events/s" and hits \
            else []


@pytest.fixture
def tiny_registered(monkeypatch):
    for cls in (Capped, Cached, Panels):
        monkeypatch.setitem(plugin.registry()["workload"], cls.name, cls)


def _stored(tmp_path, workload, reps):
    """A run of workload on native (the bare host) and vm: reps maps target ->
    [(status, metrics)] per repetition."""
    store = Store(tmp_path)
    run_id = store.new_run({"targets": [{"name": "native"}, {"name": "vm"}],
                            "baseline": "native"}, {}, "0")
    for target, done in reps.items():
        store.set_target(run_id, target, "x", {"bare_host": target == "native"})
        for idx, (status, metrics) in enumerate(done):
            store.add_rep(run_id, target=target, workload=workload, params={},
                          phase="measure", idx=idx, status=status, argv=[], started=0.0,
                          host_elapsed=5.0, metrics=metrics)
    return analysis.summarize_run(store.load_run(run_id))


def _capped(value, capped):
    return [Metric("events/s", value, "events/s", True), Metric("capped", capped, "flag", False)]


def test_a_workload_flags_its_own_cells_from_its_successful_repetitions(tmp_path,
                                                                         tiny_registered):
    summary = _stored(tmp_path, "capped", {
        "native": [("ok", _capped(100, 0)), ("ok", _capped(101, 0)),
                   ("failed", _capped(0, 1))],
        "vm": [("ok", _capped(90, 1)), ("ok", _capped(91, 0))]})
    rows = {row.metric: row for row in summary.rows}
    assert "capped: 1 of 2 runs" in rows["events/s"].cells["vm"].flags
    # the failed repetition's metrics are not the cell's
    assert not any(f.startswith("capped") for f in rows["events/s"].cells["native"].flags)
    assert not any(f.startswith("capped") for f in rows["capped"].cells["vm"].flags)


def test_the_contract_declares_no_flags_no_explanation_no_figures():
    assert Workload.cell_flags("events/s", [[Metric("events/s", 1.0, "events/s", True)]]) == []
    win = Outcome("events/s", {}, 1.5, True)
    assert Workload.explain_win(win, [], "native") is None
    assert Workload.figures == ()


# -- explanations of suspicious wins -------------------------------------------------------

class Cached(Workload):
    """A cached and an uncached read, like dd's buffered and direct copies."""
    name = "cached"
    metrics = (MetricSpec("reads/s", "reads/s", True, group="CPU", primary=True,
                          dimensions=("path",)),)

    @classmethod
    def explain_win(cls, win, others, baseline):
        uncached = [o for o in others if o.dimensions.get("path") == "uncached"]
        if win.dimensions.get("path") == "cached" and uncached and \
                not uncached[0].beats_baseline:
            return f"the cache: the uncached read is ×{uncached[0].ratio:.2f} of {baseline}"
        return None


def _reads(cached, uncached):
    return [Metric("reads/s", cached, "reads/s", True, {"path": "cached"}),
            Metric("reads/s", uncached, "reads/s", True, {"path": "uncached"})]


def test_a_workload_explains_its_own_suspicious_wins(tmp_path, tiny_registered):
    summary = _stored(tmp_path, "cached", {
        "native": [("ok", _reads(100 + i, 100 + i)) for i in range(5)],
        "vm": [("ok", _reads(150 + i, 50 + i)) for i in range(5)]})
    assert composite.explanations(summary) == [
        "vm · cached reads/s path=cached: the cache: the uncached read is ×0.51 of native"]


def test_a_win_the_workload_does_not_explain_gets_the_generic_line(tmp_path,
                                                                     tiny_registered):
    summary = _stored(tmp_path, "cached", {
        "native": [("ok", _reads(100 + i, 100 + i)) for i in range(5)],
        "vm": [("ok", _reads(150 + i, 150 + i)) for i in range(5)]})
    assert [line.split(": ", 1)[1] for line in composite.explanations(summary)] == [
        "no I/O to explain it and no clock skew seen: check the host's load during the "
        "baseline's runs"] * 2


def test_dd_explains_a_buffered_win_by_the_page_cache():
    buffered = Outcome("throughput", {"mode": "buffered"}, 1.4, True)
    direct = Outcome("throughput", {"mode": "direct"}, 0.8, False)
    assert Dd.explain_win(buffered, [direct], "native").startswith(
        "host page cache: the buffered copy beats native but the oflag=direct copy does not "
        "(×0.8)")
    winning = Outcome("throughput", {"mode": "direct"}, 1.3, True)
    assert Dd.explain_win(buffered, [winning], "native").startswith(
        "its O_DIRECT copy wins too")
    # a direct copy's win is the generic disk I/O explanation's
    assert Dd.explain_win(winning, [buffered], "native") is None


# -- a workload's own figures ----------------------------------------------------------------

class Panels(Workload):
    """Latency per offered load and size, and throughput per size: its own figures."""
    name = "panels"
    metrics = (MetricSpec("ops/s", "ops/s", True, primary=True, dimensions=("size",)),
               MetricSpec("latency", "ms", False, dimensions=("size", "load")))
    figures = (
        Lines("latency-vs-load", "latency vs load", "Latency per load.", metric="latency",
              x="load", x_label="load (ops/s)", panels="size", log_y=True,
              mark=Mark("ops/s", "best")),
        Bars("ops", "ops/s per size", "Throughput per size.", metric="ops/s",
             groups="size"),
    )


def _cell(median):
    return Cell(n=3, failed=0, summary=Summary(3, median, median * 0.9, median * 1.1, median,
                                               None, None, 0.95), values=[median] * 3)


def _panels_summary():
    rows = []
    for size, best in (("small", 20), ("large", 10)):
        for load in (10, 20, 40):
            rows.append(Row("panels", {}, "latency", {"size": size, "load": str(load)}, "ms",
                            False, {"native": _cell(load / 10), "vm": _cell(load / 5)}))
        rows.append(Row("panels", {}, "ops/s", {"size": size}, "ops/s", True,
                        {"native": _cell(best), "vm": _cell(best * 0.7)}))
    for row in analysis.headline(rows):   # as summarize_run marks them
        row.headline = True
    return RunSummary("r", "native", ["native", "vm"], rows, [])


def test_declared_figures_replace_the_generic_ones(tiny_registered):
    charts = plots.charts(_panels_summary(), {"native": "native", "vm": "vm"})
    assert [(c.slug, c.title, c.caption) for c in charts] == [
        ("panels-latency-vs-load", "panels: latency vs load", "Latency per load."),
        ("panels-ops", "panels: ops/s per size", "Throughput per size.")]
    lines, bars = (c.figure for c in charts)
    panels = [ax for ax in lines.axes if ax.get_title("left")]
    assert [ax.get_title("left") for ax in panels] == ["small", "large"]
    assert [(ax.get_xscale(), ax.get_yscale()) for ax in panels] == [("linear", "log")] * 2
    assert panels[0].get_xlabel() == "load (ops/s)"
    assert panels[0].get_ylabel() == "latency (ms)  ↓"
    # the mark: native's best (20) on its small line; the vm's (14) is at no load it had
    rings = [(float(line.get_xdata()[0]), line.get_marker()) for line in panels[0].get_lines()
             if line.get_linestyle() == "None"]
    assert rings == [(20.0, "o")]
    legend = [t.get_text() for t in lines.legends[0].get_texts()]
    assert legend == ["native", "vm", "best"]
    [ax] = bars.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["small", "large"]
    assert ax.get_ylabel() == "ops/s  ↑"


def test_without_declared_figures_the_generic_ones_are_drawn(tiny_registered, monkeypatch):
    monkeypatch.setattr(Panels, "figures", ())
    slugs = [c.slug for c in plots.charts(_panels_summary(), {"native": "native", "vm": "vm"})]
    assert "panels-repetitions" in slugs and not any("vs-load" in s for s in slugs)
