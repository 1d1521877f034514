"""Density across runs: `vmtax density show RUN RUN` and `--compare RUN` set a container run
beside a VM run, with memory per instance, KSM off and on, the ratio, and why KSM did
nothing for containers."""

import json
import time

import pytest
from click.testing import CliRunner

from vmtax.cli import density as cli_density
from vmtax.cli.main import cli
from vmtax.core.errors import VmtaxError
from vmtax.results.store import Store
from vmtax.studies import density
from vmtax.studies import density_results
from vmtax.studies.plan import TargetSpec


def step(n, added, used, pss):
    return density.Step(instances=n, added=added, start_seconds=1.0, used_delta=used,
                        kernel_delta=dict.fromkeys(density.KERNEL_LINES, 0.0), pss=pss,
                        rss=pss, answering=n, settled=True, settle_seconds=1.0,
                        available=1000.0)


def store_study(store, name, kind, per_instance, kernel="6.1.0-56-amd64"):
    """A finished density run of one target, KSM off and on, as run_density stores it."""
    specs = {name: TargetSpec(name, kind)}
    run_id = store.new_run(density.noted_plan(specs, kernel), {"kernel": kernel}, "0")
    for with_ksm, cost in ((False, per_instance[0]), (True, per_instance[1])):
        steps = [step(1, 1, cost, cost), step(2, 1, 2 * cost, 2 * cost)]
        for i, s in enumerate(steps):
            store.add_rep(run_id, target=name, workload=density.WORKLOAD,
                          params=density_results.params(with_ksm), phase="step", idx=i, status="ok",
                          argv=["density"], started=time.time(),
                          stdout=density_results.json_step(s),
                          metrics=density_results.step_metrics(s))
        outcome = density.Outcome(name, with_ksm, steps, "max", 100.0)
        store.add_rep(run_id, target=name, workload=density.WORKLOAD,
                      params=density_results.params(with_ksm), phase="measure", idx=0, status="ok",
                      argv=["density"], started=time.time(),
                      stdout=density_results.json_summary(outcome),
                      metrics=density_results.summary_metrics(
                          density_results.summarize(outcome), None))
    store.set_target(run_id, name, kind, {"kind": kind})
    store.finish_run(run_id, "done")
    return run_id


@pytest.fixture
def runs(tmp_path):
    store = Store(tmp_path)
    container = store_study(store, "container", "container", (4.0, 4.0))
    time.sleep(0.01)
    vm = store_study(store, "vm:tcg", "vm", (80.0, 40.0))
    store.close()
    return str(tmp_path), container, vm


def show(results, *args):
    return CliRunner().invoke(cli, ["density", "show", *args, "--results", results,
                                    "--json"])


def test_two_runs_side_by_side_with_the_ratio_per_ksm_setting(runs):
    results, container, vm = runs
    res = show(results, container, "last")   # "last" (or a unique prefix) names a run too
    assert res.exit_code == 0, res.output
    found = json.loads(res.output)
    assert found["runs"] == [container, vm]
    rows = {(s["run"], s["target"], s["ksm"]): s for s in found["summaries"]}
    assert rows[(vm, "vm:tcg", False)]["adjusted"] == 80.0
    assert rows[(vm, "vm:tcg", False)]["ratio"] == 20.0
    assert rows[(vm, "vm:tcg", True)]["ratio"] == 10.0
    assert rows[(container, "container", True)]["ratio"] == 1.0
    assert found["ratios"] == [
        "KSM off, per instance against container (PSS 4.0 MiB, adjusted 4.0 MiB): vm:tcg "
        "PSS 80.0 MiB = 20.00×, adjusted 80.0 MiB = 20.00×",
        "KSM on, per instance against container (PSS 4.0 MiB, adjusted 4.0 MiB): vm:tcg "
        "PSS 40.0 MiB = 10.00×, adjusted 40.0 MiB = 10.00×"]
    # Containers were measured with KSM on: why it changed nothing is said, once.
    [note] = found["notes"]
    assert "MADV_MERGEABLE" in note and "6.1.0-56-amd64" in note
    assert "no prctl(PR_SET_MEMORY_MERGE)" in note


def test_the_table_form(runs):
    results, container, vm = runs
    res = CliRunner().invoke(cli, ["density", "show", container, vm, "--results", results],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "across runs" in res.output and container in res.output
    assert "density ratio, KSM off, per instance against container" in res.output
    assert res.output.count("note: KSM and container") == 1


def test_the_same_target_in_two_runs_is_kept_apart(tmp_path):
    store = Store(tmp_path)
    first = store_study(store, "container", "container", (4.0, 4.0))
    second = store_study(store, "container", "container", (8.0, 8.0))
    studies = [density_results.stored_study(store.load_run(r, with_output=True))
               for r in (first, second)]
    rows, kinds = density_results.combine(studies)
    labels = [s.target for _, s in rows if not s.ksm]
    assert labels == [f"container ({first})", f"container ({second})"]
    assert kinds[labels[1]] == "container"
    assert density_results.ratios([s for _, s in rows])[(labels[1], False)] == 2.0


def test_used_memory_that_fell_gives_the_pss_ratio_alone():
    def summary(target, adjusted, pss):
        return density_results.Summary(target, False, 10, "max", adjusted, adjusted, pss, None,
                                       True)
    [line] = density_results.ratio_lines([summary("c", -12.7, 1.2), summary("v", 60.0, 48.0)])
    assert line == "KSM off, per instance against c (PSS 1.2 MiB): v PSS 48.0 MiB = 40.00×"
    # Nor does the table's ratio take v, alone with a positive cost, for the cheapest.
    assert density_results.ratios([summary("c", -12.7, 1.2), summary("v", 60.0, 48.0)]) == {}
    assert density_results.ratio_lines([summary("c", 3.0, 1.2)]) == []   # nothing to set it beside


def test_a_run_that_is_not_a_density_run_is_one_line(tmp_path, runs):
    results, container, _ = runs
    store = Store(results)
    other = store.new_run({"kind": "boot", "targets": []}, {}, "0")
    store.finish_run(other, "done")
    plain = store.new_run({"targets": [], "workloads": []}, {}, "0")
    store.finish_run(plain, "done")
    store.close()
    for run_id, message in ((other, "is not a density run (a boot run)"),
                            (plain, "is not a density run (a run of workloads)"),
                            ("nosuchrun", "unknown run id 'nosuchrun'")):
        res = show(results, container, run_id)
        # vmtax's entry point prints a VmtaxError as one line, without a traceback.
        assert isinstance(res.exception, VmtaxError)
        assert message in str(res.exception) and "\n" not in str(res.exception)


def test_show_takes_runs_and_nothing_that_would_run(runs):
    results, container, _ = runs
    with pytest.raises(VmtaxError, match="name stored density runs"):
        CliRunner().invoke(cli, ["density", "show", "--results", results],
                           standalone_mode=False, catch_exceptions=False)
    with pytest.raises(VmtaxError, match="--max do not apply"):
        CliRunner().invoke(cli, ["density", "show", container, "--max", "3", "--results",
                                 results], standalone_mode=False, catch_exceptions=False)
    with pytest.raises(VmtaxError, match="one plan file, got 2"):
        CliRunner().invoke(cli, ["density", "a.toml", "b.toml"], standalone_mode=False,
                           catch_exceptions=False)


def test_compare_names_are_checked_before_anything_runs(runs, monkeypatch):
    results, _, _ = runs

    def no_run(*args, **kwargs):
        raise AssertionError("ran a study")
    monkeypatch.setattr(cli_density, "run_density", no_run)
    res = CliRunner().invoke(cli, ["density", "--targets", "container", "--compare",
                                   "nosuchrun", "--results", results])
    assert isinstance(res.exception, VmtaxError)
    assert "unknown run id 'nosuchrun'" in str(res.exception)


def test_the_report_figure_says_why_ksm_did_nothing_for_containers(runs):
    from vmtax.analysis.model import study_records
    from vmtax.report import plots
    results, container, vm = runs
    store = Store(results, readonly=True)

    def figures(run):
        return {c.slug: c for c in plots.density_memory(run, {}, study_records(run).density)}

    charts = figures(store.load_run(container))
    assert "no prctl(PR_SET_MEMORY_MERGE)" in charts["density-memory-used"].caption
    charts = figures(store.load_run(vm))
    assert "MADV_MERGEABLE" not in charts["density-memory-used"].caption
