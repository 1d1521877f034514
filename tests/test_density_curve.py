"""The density study's HTTP check scaled to a saturated host, what it says of the CPUs, why
a budget ended it, and KSM's merge curve: stored, drawn, and in one terminal line."""

import dataclasses

import pytest
from test_density import FakeTarget, host  # noqa: F401 - host: a fixture
from test_density_compare import step

from vmtax.core import plugin
from vmtax.studies import density
from vmtax.studies import density_results


def settings(**values):
    return plugin.build(density.Settings, values, "density")


def test_the_http_timeout_grows_with_the_load_up_to_its_cap():
    s = settings(http_timeout=30, http_timeout_max=200)
    assert s.http_deadline(0.4) == 30          # CPU to spare: the base
    assert s.http_deadline(2.5) == 75          # 2.5 runnable tasks per CPU
    assert s.http_deadline(50.0) == 200        # never past the cap
    with pytest.raises(Exception, match="http_timeout_max"):
        settings(http_timeout=30, http_timeout_max=10)


def summary(**fields):
    s = dataclasses.replace(step(200, 10, 8000.0, 7400.0), answering=190, http_wait=90.0,
                            http_slowest=61.5, cpus=2, **fields)
    return density_results.summarize(density.Outcome("vm:tcg", True, [s], "max", 0.0))


def test_saturated_cpus_are_named_as_the_limit_with_the_cpu_per_instance():
    line = density_results.http_line(summary(host_busy=97.0, instances_cpu=0.4))
    assert line is not None
    assert line.startswith("vm:tcg (KSM on): 190/200 answered HTTP within 90 s, "
                           "the slowest after 61.5 s")
    assert "the 200 instances took 0.40 of the host's 2 CPUs (0.20% of one each)" in line
    # 1.94 CPUs busy, 0.4 of them the instances: the rest is other processes.
    assert line.endswith("the host's 2 CPUs are the limit, 1.54 of them busy with other "
                         "processes than the instances")


def test_saturated_cpus_are_no_limit_when_every_instance_answered():
    s = dataclasses.replace(step(200, 10, 8000.0, 7400.0), http_wait=90.0, http_slowest=18.9,
                            cpus=2, host_busy=100.0, instances_cpu=0.42)
    line = density_results.http_line(
        density_results.summarize(density.Outcome("v", True, [s], "max", 0.0)))
    assert line is not None and "limit" not in line
    assert line.endswith("the host's 2 CPUs were saturated, 1.58 of them busy with other "
                         "processes than the instances")


def test_cpus_with_room_are_not_called_the_limit():
    line = density_results.http_line(summary(host_busy=40.0, instances_cpu=0.4))
    assert line is not None and "limit" not in line and line.endswith("40% busy")
    # An old run without the check's figures says nothing of it.
    old = density_results.summarize(
        density.Outcome("c", False, [step(2, 1, 10.0, 5.0)], "max", 0.0))
    assert density_results.http_line(old) is None


def test_a_budget_that_ends_it_says_what_the_next_step_needed(host):  # noqa: F811
    outcome = density.study(FakeTarget(host), "net",
                            settings(max=50, singles=2, batch=3, budget="1G"), False, None)
    assert outcome.stopped == "budget"
    assert outcome.detail == ("8 instances took 800 MiB; 3 more at 100.0 MiB each would take "
                              "1,100 MiB, over the budget of 1,024 MiB (1G); 50 at that "
                              "cost would need 5,000 MiB")
    # Stored and read back with the outcome.
    assert density_results.summarize(outcome).detail == outcome.detail


def curve_outcome():
    page = density.PAGE_MIB
    steps = [dataclasses.replace(step(1, 1, 50.0, 40.0), ksm_curve=[[0.0, 0], [5.0, 0]]),
             dataclasses.replace(step(11, 10, 400.0, 300.0),
                                 ksm_curve=[[20.0, 0], [30.0, int(50 / page)],
                                            [40.0, int(100 / page)], [50.0, int(100 / page)]])]
    return density.Outcome("vm:tcg", True, steps, "max", 0.0)


def test_density_show_prints_the_stored_merge_curve(tmp_path):
    from vmtax.results.store import Store
    from vmtax.studies.plan import TargetSpec
    from vmtax.results import study_records as records
    store = Store(tmp_path)
    outcome = curve_outcome()
    run_id = store.new_run(density.stored_plan(density.WORKLOAD,
                                               {"vm:tcg": TargetSpec("vm:tcg", "vm")}),
                           {"kernel": "6.1"}, "0")
    for i, s in enumerate(outcome.steps):
        store.add_rep(run_id, target="vm:tcg", workload=density.WORKLOAD,
                      params=density_results.params(True), phase=records.STEP, idx=i, status="ok",
                      argv=["density"], started=0.0, stdout=density_results.json_step(s),
                      metrics=density_results.step_metrics(s))
    study = density_results.stored_study(store.load_run(run_id, with_output=True))
    assert study.curves == [density_results.ksm_curve_line(outcome)]


def test_ksm_merge_curve_in_one_line():
    line = density_results.ksm_curve_line(curve_outcome(), width=11)
    assert line == ("KSM merge curve, vm:tcg: ▁▁▁▁▁▁▅▅███ 0 → 100 MiB saved from 0 to 50 s "
                    "of the study (11 instances; within 10% of the end by 40 s)")
    off = dataclasses.replace(curve_outcome(), ksm=False)
    assert density_results.ksm_curve_line(off) is None


def test_a_steps_curve_is_stored_as_a_few_readings_first_and_last_kept():
    curve = [[float(t), t * 10] for t in range(100)]
    points = density_results.curve_points(curve, most=5)
    assert [t for t, _ in points] == [0.0, 25.0, 50.0, 74.0, 99.0]   # evenly spread
    assert points[-1][1] == round(990 * density.PAGE_MIB, 2)
    assert density_results.curve_points([[1.0, 3]], most=5) == [
        (1.0, round(3 * density.PAGE_MIB, 2))]
    assert density_results.curve_points([]) == []


def test_the_ksm_curve_figure_from_a_stored_run():
    from vmtax.report import plots
    from vmtax.results import study_records as records
    from vmtax.results.store import Rep, Run
    reps = [Rep(id=i, run_id="r", target="vm:tcg", workload="density",
                params=density_results.params(True), phase="step", idx=i, status="ok", error=None,
                exit_code=None, host_elapsed=None, guest_elapsed=None, started=0.0, argv=[],
                metrics=density_results.step_metrics(s))
            for i, s in enumerate(curve_outcome().steps)]
    run = Run(id="r", created=0.0, finished=None, status="done", plan={}, host={},
              version="0", targets={}, reps=reps)
    readings = records.ksm_readings(run)
    assert [(r.instances, r.seconds) for r in readings] == [
        (1.0, 0.0), (1.0, 5.0), (11.0, 20.0), (11.0, 30.0), (11.0, 40.0), (11.0, 50.0)]
    assert readings[-1].saved == pytest.approx(100, abs=0.01)
    [chart] = plots.density_ksm(readings, {})
    assert chart.slug == "density-ksm-curve"
    assert plots.render(chart, "png").startswith(b"\x89PNG")
    from vmtax.analysis.model import study_records
    assert "density-ksm-curve" in [c.slug for c in plots.run_charts(run, {},
                                                                     study_records(run))]


def test_a_steps_line_has_the_slowest_answer_and_the_cpu_per_instance():
    from vmtax.cli.density import _step_line
    s = dataclasses.replace(step(200, 10, 8000.0, 7400.0), http_wait=90.0, http_slowest=61.5,
                            host_busy=97.0, instances_cpu=0.4)
    line = _step_line("vm:tcg", True, s)
    assert "200/200 answer HTTP (the slowest after 61.5 s of 90)" in line
    assert line.endswith("idle, host CPUs 97% busy, the instances 40% of one core "
                         "(0.20% each)")


def test_pages_ksm_merged_with_ksm_off_are_a_warning():
    s = dataclasses.replace(step(10, 5, 900.0, 700.0), merged=160.0)
    summary = density_results.summarize(density.Outcome("vm:tcg", False, [s], "max", 0.0))
    assert summary.warning is not None
    assert summary.warning.startswith("KSM had merged 160 MiB of these instances although")
    clean = dataclasses.replace(s, merged=0.0)
    assert density_results.summarize(
        density.Outcome("vm:tcg", False, [clean], "max", 0.0)).warning is None
    assert density.merging_pages(2 ** 22 + 1) == 0   # no such process
