"""The runner end to end on the native target with tiny test workloads (real processes)."""

import dataclasses
import signal
import sys
from typing import Literal

import pytest

from vmtax.core import plugin
from vmtax.core import target as targets
from vmtax.core.errors import ParseError, VmtaxError
from vmtax.core.types import Job, Metric, MetricSpec
from vmtax.core.workload import Workload
from vmtax.host import proc
from vmtax.results.store import Store
from vmtax.studies import plan as plan_mod
from vmtax.studies.repetitions import rep_key
from vmtax.studies.runner import Runner, schedule


class EchoOptions(plugin.Options):
    value: int = plugin.option(5, "What it prints")
    mode: Literal["ok", "fail", "garbage", "hang", "huge"] = plugin.option(
        "ok", "How it behaves")


class Echo(Workload):
    """Prints `value`; `mode` makes it fail, print garbage or hang."""
    name = "echo-test"
    Options = EchoOptions
    metrics = (MetricSpec("value", "u", True, primary=True),)

    def run_job(self):
        code = {"ok": f"print({self.params['value']})", "fail": "import sys; sys.exit(3)",
                "garbage": "print('no number here')", "hang": "import time; time.sleep(30)",
                "huge": "print('9' * 5000)"}
        return Job([sys.executable, "-c", code[self.params["mode"]]], timeout=2)

    def parse(self, stdout):
        if "no number" in stdout:
            raise ParseError("no number")
        # 5,000 digits: int() raises ValueError, not ParseError.
        return [self.metric("value", int(stdout))]


@pytest.fixture(autouse=True)
def echo_workload(monkeypatch):
    monkeypatch.setitem(plugin.registry()["workload"], "echo-test", Echo)


def make_plan(**params):
    return plan_mod.Plan(targets=plan_mod.target_specs(["native"], {}),
                         workloads=[plan_mod.WorkloadSpec("echo-test", params)],
                         runs=3, warmup=1, time=None)


def test_warmups_are_marked_and_every_rep_stored(tmp_path):
    store = Store(tmp_path)
    run_id = Runner(make_plan(value=7), store).execute()
    run = store.load_run(run_id)
    assert run.status == "done"
    assert [(r.phase, r.idx, r.status) for r in run.reps] == [
        ("warmup", 0, "ok"), ("measure", 1, "ok"), ("measure", 2, "ok"), ("measure", 3, "ok")]
    assert all(r.metrics == [Metric("value", 7.0, "u", True)] for r in run.reps)
    assert run.targets["native"]["kind"] == "native"
    assert not list(tmp_path.glob(".work-*")), "work dir left behind"
    # Identical values: nothing to flag but their length (a python -c lasts ~30 ms).
    assert store.flags(run_id) == [("native", "echo-test", {}, "value", "too short")]


def test_sanity_flags_are_stored(tmp_path, monkeypatch):
    values = iter([100, 100, 150, 60])   # warm-up, then a noisy spread
    monkeypatch.setattr(Echo, "run_job", lambda self: Job(
        [sys.executable, "-c", f"print({next(values)})"], timeout=5))
    store = Store(tmp_path)
    run_id = Runner(make_plan(), store).execute()
    assert store.flags(run_id) == [("native", "echo-test", {}, "value", "noisy"),
                                   ("native", "echo-test", {}, "value", "too short")]


@pytest.mark.parametrize("mode, status, error", [
    ("fail", "failed", "exit status 3"),
    ("garbage", "failed", "unparseable output: no number"),
    ("hang", "timeout", "timed out after 2 s"),
    # Any exception of a parser, not only ParseError, fails the repetition, not the plan.
    ("huge", "failed", "unparseable output: Exceeds the limit"),
])
def test_failures_are_stored_with_raw_output_and_the_plan_goes_on(tmp_path, mode, status, error):
    store = Store(tmp_path)
    p = make_plan(mode=mode)
    p.runs, p.warmup = 1, 0
    p.workloads.append(plan_mod.WorkloadSpec("echo-test", {"value": 1}))
    run = store.load_run(Runner(p, store).execute(), with_output=True)
    first, second = run.reps
    assert (first.status, first.metrics) == (status, [])
    assert first.error.startswith(error)
    if mode == "garbage":
        assert first.stdout == "no number here\n"
    assert second.status == "ok"


def test_the_event_sink_hears_each_record_as_stored_and_skipped_reps_are_not_run(tmp_path):
    """The Runner's extension points the fleet builds on: its host task streams every
    record to the driver, and a re-queued cell skips what the head already has."""
    heard = []
    store = Store(tmp_path)
    elsewhere = Store(tmp_path / "elsewhere")
    warmup = elsewhere.load_run(Runner(make_plan(value=7), elsewhere).execute()).reps[0]
    skip = {rep_key(vars(warmup))}
    run_id = Runner(make_plan(value=7), store, events=lambda kind, record: heard.append(
        (kind, record)), skip=skip).execute()
    run = store.load_run(run_id)
    assert [(r.phase, r.idx) for r in run.reps] == [("measure", 1), ("measure", 2),
                                                     ("measure", 3)]
    kinds = [k for k, _ in heard]
    assert kinds[:2] == ["run", "target"] and kinds.count("rep") == 3
    assert heard[0][1]["local_run"] == run_id and heard[0][1]["fingerprint"] == run.host
    reps = [r for k, r in heard if k == "rep"]
    assert [rep_key(r) for r in reps] == [rep_key(vars(r)) for r in run.reps]
    assert reps[-1]["metrics"] == [Metric("value", 7.0, "u", True)]


def test_interrupt_keeps_committed_reps_and_cleans_up(tmp_path):
    class StopAfter:
        def __init__(self):
            self.steps = 0
        def start(self, total): pass
        def advance(self): pass
        def warn(self, text): pass
        def step(self, text):
            self.steps += 1
            if self.steps == 4:   # preparing native, warm-up, run 1, then Ctrl-C
                raise KeyboardInterrupt

    store = Store(tmp_path)
    runner = Runner(make_plan(), store, StopAfter())
    with pytest.raises(KeyboardInterrupt):
        runner.execute()
    run = store.load_run(runner.run_id)
    assert run.status == "interrupted"
    assert [(r.phase, r.idx) for r in run.reps] == [("warmup", 0), ("measure", 1)]
    assert not list(tmp_path.glob(".work-*"))

    # Resuming runs only what is missing.
    resumed = Runner(plan_mod.Plan.from_dict(run.plan), store, resume=run.id).execute()
    run = store.load_run(resumed)
    assert resumed == runner.run_id and run.status == "done"
    assert sorted((r.phase, r.idx) for r in run.reps) == [
        ("measure", 1), ("measure", 2), ("measure", 3), ("warmup", 0)]


def test_a_stop_whose_keyboardinterrupt_was_dropped_still_stops_the_plan(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setattr(proc, "_stop_signal", None)
    values = iter(range(100))

    def job(self):
        if next(values) == 2:   # during run 1: a signal whose exception Python dropped
            with pytest.raises(KeyboardInterrupt):
                proc.stop_on_signal(signal.SIGTERM, None)
        return Job([sys.executable, "-c", "print(1)"], timeout=5)
    monkeypatch.setattr(Echo, "run_job", job)
    store = Store(tmp_path)
    runner = Runner(make_plan(), store)
    with pytest.raises(KeyboardInterrupt):
        runner.execute()
    run = store.load_run(runner.run_id)
    assert run.status == "interrupted"
    assert [(r.phase, r.idx) for r in run.reps] == [("warmup", 0), ("measure", 1)]


def test_a_run_another_live_process_executes_cannot_be_resumed(tmp_path):
    store = Store(tmp_path)
    run_id = Runner(make_plan(), store).execute()
    other = proc.spawn(["sleep", "30"])     # stands for the vmtax executing it
    with store.db:
        store.db.execute("UPDATE runs SET status = 'running', pid = ?, pid_start = ?",
                         (other.pid, proc.process_start_time(other.pid)))
    with pytest.raises(VmtaxError, match=rf"^run {run_id} is in progress \(PID {other.pid}\)$"):
        Runner(make_plan(), store, resume=run_id[:10]).execute()
    assert len(store.load_run(run_id).reps) == 4 and not list(tmp_path.glob(".work-*"))
    proc.kill_group(other)
    # Once it is gone the run is resumable again (nothing left to do here).
    assert Runner(make_plan(), Store(tmp_path), resume=run_id).execute() == run_id
    assert Store(tmp_path).load_run(run_id).status == "done"


def test_stopped_exit_code_follows_the_signal(monkeypatch):
    monkeypatch.setattr(proc, "_stop_signal", None)
    assert proc.stopped_exit_code() == 130      # a KeyboardInterrupt no handler saw
    for sig, code in [(signal.SIGINT, 130), (signal.SIGTERM, 143)]:
        with pytest.raises(KeyboardInterrupt):
            proc.stop_on_signal(sig, None)
        assert proc.stopped_exit_code() == code


def test_schedule_interleaves_targets_and_marks_first_reps_as_warmup():
    p = plan_mod.from_names(["native", "container"], ["cpu"], runs=2, warmup=1)
    units = schedule(p)
    per_target = {n: [(u.phase, u.idx) for u in units if u.target == n]
                  for n in ("native", "container")}
    assert per_target["native"] == [("warmup", 0), ("measure", 1), ("measure", 2)]
    assert per_target["container"] == per_target["native"]
    order = [u.target for u in units]
    assert order != sorted(order, key=["native", "container"].index), "not interleaved"
    p.interleave = False
    assert [u.target for u in schedule(p)] == ["native"] * 3 + ["container"] * 3


def test_a_guest_time_is_kept_only_from_a_target_with_a_clock_of_its_own(tmp_path,
                                                                      monkeypatch):
    native = targets.get("native")
    real_run = native.run
    monkeypatch.setattr(native, "run", lambda self, job: dataclasses.replace(
        real_run(self, job), guest_elapsed=0.5))
    store = Store(tmp_path)
    run = store.load_run(Runner(make_plan(), store).execute())
    assert {r.guest_elapsed for r in run.reps} == {None}
    monkeypatch.setattr(native, "guest_clock", True)
    run = store.load_run(Runner(make_plan(), store).execute())
    assert {r.guest_elapsed for r in run.reps} == {0.5}


# -- collectors record their own target's measured repetitions only ---------------------------

class Windows(plugin.Options):
    pass


def test_a_collector_records_only_its_own_targets_measured_repetitions(tmp_path, monkeypatch):
    """A B B A order: a collector started at A's first repetition used to record until the
    end of the cell, B's repetitions included. The subject says what its target declares
    (a VMM as its first process), whatever the target's kind."""
    from vmtax.core.collector import Collector
    from vmtax.targets.native import NativeTarget
    log: list[tuple[str, str]] = []
    vmm: dict[str, bool] = {}
    monkeypatch.setattr(NativeTarget, "vmm_process", True)

    class Witness(Collector):
        name = "witness-test"
        Options = Windows
        metrics = (MetricSpec("events", "n", False),)

        def start(self, subject):
            self.subject = subject.name
            log.append((self.subject, "start"))
            vmm[subject.name] = subject.vmm_process

        def pause(self):
            log.append((self.subject, "pause"))

        def resume(self):
            log.append((self.subject, "resume"))

        def stop(self):
            log.append((self.subject, "stop"))
            return [self.metric("events", 1)]

        def abort(self):
            pass

    monkeypatch.setitem(plugin.registry().setdefault("collector", {}), "witness-test",
                        Witness)
    real_measure = Runner._measure

    def measure(self, name, workload, job, phase, idx, parse, **kw):
        log.append((name, f"{phase} {idx}"))
        return real_measure(self, name, workload, job, phase, idx, parse, **kw)
    monkeypatch.setattr(Runner, "_measure", measure)
    plan = dataclasses.replace(make_plan(), runs=2, warmup=0, collect=["witness-test"],
                               targets=[plan_mod.TargetSpec("native", "native", {}),
                                        plan_mod.TargetSpec("b", "native", {})])
    Runner(plan, Store(tmp_path)).execute()
    recording: set[str] = set()
    for target, event in log:
        if event in ("start", "resume"):
            recording.add(target)
        elif event in ("pause", "stop"):
            recording.discard(target)
        elif event.startswith("measure"):
            # while a target is measured, only its own collector records
            assert recording == {target}, log
        else:
            assert not recording, log
    assert [e for t, e in log if t == "native"][-2:] == ["pause", "stop"], log
    assert vmm == {"native": True, "b": True}


def test_runs_auto_measures_until_precise_or_max_runs():
    """Precision, the Runner's default repetition policy with --runs auto: rounds across
    the targets still imprecise, order reversed each round, a broken target left out, each
    stopping at max_runs attempts."""
    import itertools
    from types import SimpleNamespace

    from vmtax.studies.repetitions import Cell, Precision

    plan = SimpleNamespace(runs=3, ci_target=0.02)
    noisy = itertools.cycle([140.0, 60.0])
    order = []

    def measure(name, why):
        assert why == "adaptive"
        order.append(name)
        cell.attempts[name] += 1
        value = 100.0 if name == "steady" else next(noisy)
        cell.values[name].append(value)
        return value

    cell = Cell(None, ["noisy", "steady", "down"],
                {"noisy": [100.0, 150.0, 50.0], "steady": [100.0] * 5, "down": []},
                {"noisy": 3, "steady": 5, "down": 0}, {"down": "hung"}, measure)
    Precision(plan, 8).more(cell)
    # Round 1 reversed (steady, noisy); then steady is precise, noisy runs to max_runs.
    assert order == ["steady", "noisy", "noisy", "noisy", "noisy", "noisy"]
    assert cell.attempts == {"noisy": 8, "steady": 6, "down": 0}


def test_a_target_that_cannot_be_prepared_fails_its_cells_and_the_run_goes_on(tmp_path,
                                                                               monkeypatch):
    """Found in the lab: vm:kvm's guest could not be booted even after its retry (its nested
    kernel stalled twice), and the whole run ended with nothing stored. Its cells now fail
    with the reason, and the other targets' are measured and stored."""
    from vmtax.core.errors import TargetError
    from vmtax.targets.native import NativeTarget

    real_prepare = NativeTarget.prepare

    def prepare(self):
        if self.name == "lost":
            raise TargetError("lost: its kernel stalled while booting, twice")
        real_prepare(self)
    monkeypatch.setattr(NativeTarget, "prepare", prepare)
    plan = dataclasses.replace(make_plan(), runs=2, warmup=0,
                               targets=[plan_mod.TargetSpec("native", "native", {}),
                                        plan_mod.TargetSpec("lost", "native", {})])
    store = Store(tmp_path)
    run = store.load_run(Runner(plan, store).execute())
    assert run.status == "done"
    by_target = {t: [r for r in run.reps if r.target == t and r.phase == "measure"]
                 for t in ("native", "lost")}
    assert [r.status for r in by_target["native"]] == ["ok", "ok"]
    assert [r.status for r in by_target["lost"]] == ["failed", "failed"]
    assert by_target["lost"][0].error == ("target lost could not be prepared: lost: its kernel "
                                          "stalled while booting, twice")
    # With no target left to measure, the run is not started: the error is the user's.
    plan = dataclasses.replace(plan, targets=[plan_mod.TargetSpec("lost", "native", {})],
                               baseline="lost")
    with pytest.raises(TargetError, match="stalled while booting"):
        Runner(plan, Store(tmp_path / "none")).execute()
