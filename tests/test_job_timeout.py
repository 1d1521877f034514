"""Each job's timeout follows what the plan expects of it (issue #16, defect 10), and a
plan can set it."""

import pytest

from vmtax.core.types import Job
from vmtax.results.store import Store
from vmtax.studies import estimate, planfile
from vmtax.studies.runner import Runner
from vmtax.workloads import sysbench
from vmtax.workloads.sysbench import Mutex

BIG_MUTEX = """
[targets.vm]
accel = "tcg"
[[workloads]]
name = "mutex"
params = { mutex-locks = 100000000 }
"""


def test_a_big_mutex_in_a_tcg_guest_is_estimated_and_given_time():
    plan = planfile.loads(BIG_MUTEX, "x.toml")
    workload = plan.workloads[0].make(plan.time)
    job = workload.run_job()
    assert job.timeout == sysbench.MUTEX_TIMEOUT       # the fixed limit it used to get
    # 10,000 times the default work: about 1,600 s at native speed, not the 1 s assumed.
    assert workload.run_seconds() == pytest.approx(
        Mutex.make({}).run_seconds() * 10_000)
    assert workload.run_seconds() > 1000
    assert estimate.estimate(plan).seconds > 6 * 1000
    timeout = estimate.job_timeout(workload, job, "measure", plan.timeout)
    assert timeout == pytest.approx(workload.run_seconds() * estimate.TIMEOUT_FACTOR
                                    + estimate.TIMEOUT_MARGIN)
    assert timeout > sysbench.MUTEX_TIMEOUT


def test_the_default_mutex_keeps_its_own_limit_and_time_bounded_runs_scale():
    mutex = Mutex.make({})
    assert estimate.job_timeout(mutex, mutex.run_job(), "measure", None) == \
        sysbench.MUTEX_TIMEOUT
    cpu = sysbench.Cpu.make({}, time=100)
    assert estimate.job_timeout(cpu, cpu.run_job(), "warmup", None) == 100 * 10 + 60


def test_prepare_jobs_follow_the_prepare_estimate_and_not_the_plan_setting():
    fileio = sysbench.Fileio.make({}, time=2)
    [prepare, *_] = fileio.prepare_jobs()
    derived = estimate.job_timeout(fileio, prepare, "prepare", 5.0)
    assert derived == max(prepare.timeout, fileio.prepare_seconds() * 10 + 60)
    assert estimate.job_timeout(fileio, fileio.run_job(), "measure", 5.0) == 5.0


def test_a_plan_sets_the_timeout():
    plan = planfile.loads("timeout = 90\n" + BIG_MUTEX, "x.toml")
    assert plan.timeout == 90.0
    workload = plan.workloads[0].make(plan.time)
    assert estimate.job_timeout(workload, Job(["x"]), "measure", plan.timeout) == 90.0
    assert planfile.loads('timeout = "none"\n' + BIG_MUTEX, "x.toml").timeout is None


@pytest.mark.parametrize("value, got", [("0", "0"), ("-3", "-3"), ('"1m"', '"1m"'),
                                        ("true", "true")])
def test_a_bad_timeout_is_one_line(value, got):
    with pytest.raises(planfile.PlanError) as caught:
        planfile.loads(f"timeout = {value}\n" + BIG_MUTEX, "x.toml")
    assert str(caught.value) == ("x.toml:1: timeout: expected a positive number of seconds, "
                                 f"at most 86400 (a day), got {got}")


@pytest.mark.live
def test_the_runner_stops_a_repetition_at_the_plans_timeout(tmp_path):
    plan = planfile.loads("""
        timeout = 1
        runs = 1
        warmup = 0
        [targets.native]
        [[workloads]]
        name = "mutex"
        params = { mutex-locks = 100000000, threads = 1 }
    """, "x.toml")
    store = Store(tmp_path)
    run = store.load_run(Runner(plan, store).execute())
    [rep] = run.reps
    assert rep.status == "timeout" and rep.error == "timed out after 1 s"
    assert rep.host_elapsed < 30
