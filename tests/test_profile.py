"""The profile collector: perf script's output read into folded stacks per thread class
(a captured fixture and small hand-made ones), and its lifecycle against a fake `perf` on
PATH (the process boundary): the control FIFO's enable and ack, SIGINT at stop, the
journal, abort."""

import dataclasses
import json
from collections import Counter
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import wait_for

from vmtax.collectors.profile import (
    OTHER,
    Profile,
    Profiler,
    Sample,
    launcher_names,
    own_samples,
    parse_script,
    qemu_class,
    runs_launcher,
)
from vmtax.collectors import profile
from vmtax.core import plugin
from vmtax.core.collector import CollectorError, Subject
from vmtax.core.errors import ParseError
from vmtax.host import machine
from vmtax.host.journal import Journal
from vmtax.host.proc import running

FIXTURES = Path(__file__).parent / "fixtures" / "profile"


def _native_fixture():
    return parse_script((FIXTURES / "native-sysbench.txt").read_text())


def test_the_captured_script_gives_samples_call_chains_and_the_process_tree():
    script = _native_fixture()
    assert len(script.samples) == 33
    assert {s.comm for s in script.samples} == {"sysbench"}
    assert script.parent[23064] == 23008 and script.exec_name[23064] == "sysbench"
    deep = max(script.samples, key=lambda s: len(s.frames))
    assert len(deep.frames) > 10 and deep.frames[0][1] == "[kernel.kallsyms]"
    # an inlined frame takes the DSO of the function it was inlined into
    assert all(dso != "inlined" for s in script.samples for _, dso in s.frames)


def test_the_bare_host_keeps_its_jobs_and_leaves_out_vmtax_and_container_jobs():
    script = _native_fixture()
    native = own_samples(script, Subject(kind="native", name="native"), {23008}, {"runsc"})
    assert len(native) == 33
    # the same jobs seen from a container's collector: none ran a runtime
    container = own_samples(script, Subject(kind="container", name="container:runsc"),
                            {23008}, {"runsc"})
    assert container == []


def test_a_job_whose_root_ran_the_runtime_is_the_containers():
    text = textwrap.dedent("""\
        vmtax 10/10 PERF_RECORD_FORK(20:20):(10:10)
        runsc 20/20 PERF_RECORD_COMM exec: runsc:20/20
        runsc 20/20 PERF_RECORD_FORK(21:21):(20:20)
        exe 21/21 PERF_RECORD_COMM exec: exe:21/21
        exe 21/22 1000000
        \t  1 syscall.Syscall (/tmp/runsc)
        \t  2 gvisor.dev/gvisor/pkg/sentry/kernel.(*Task).run (/tmp/runsc)

        exe 21/23 1000000
        \t  1 finish_task_switch ([kernel.kallsyms])

        exe 21/21 PERF_RECORD_FORK(24:24):(21:21)
        exe 24/24 1000000
        \t  1 [unknown] ([unknown])

        vmtax 10/10 PERF_RECORD_FORK(40:40):(10:10)
        perf 40/40 PERF_RECORD_COMM exec: perf:40/40
        perf 40/40 1000000
        \t  1 perf_session__process_events (/usr/bin/perf)

        vmtax 50/50 1000000
        \t  1 copy_process ([kernel.kallsyms])

        vmtax 10/10 PERF_RECORD_FORK(30:30):(10:10)
        sysbench 30/30 PERF_RECORD_COMM exec: sysbench:30/30
        sysbench 30/30 1000000
        \t  1 [unknown] (/usr/bin/sysbench)

        vmtax 10/10 1000000
        \t  1 PyEval_EvalFrame (/usr/bin/python3)
        """)
    script = parse_script(text)
    runsc = own_samples(script, Subject(kind="container", name="container:runsc"), {10},
                        {"runsc"})
    # a sentry's thread in the host kernel alone is the sentry's too; what it started runs
    # the sandboxed program
    assert [(cls, s.tid) for cls, s in runsc] == [("sentry", 22), ("sentry", 23),
                                                  ("sandboxed program", 24)]
    # vmtax's own perf (another collector's perf script) and a fork are left out
    native = own_samples(script, Subject(kind="native", name="native"), {10},
                         {"runsc", "runsc-ptrace", "crun"}, "vmtax")
    assert [(cls, s.pid) for cls, s in native] == [("sysbench", 30)]


def test_runtime_binaries_match_their_runtimes_and_variants():
    assert runs_launcher("runsc", {"runsc-ptrace"})
    assert runs_launcher("crun", {"crun"})
    assert not runs_launcher("runc", {"crun"})
    assert not runs_launcher("", {"crun"})
    assert launcher_names(Subject(kind="container", name="container:runsc")) == {"runsc"}
    assert "runsc" in launcher_names(Subject(kind="native", name="native"))


def test_a_guests_long_lived_threads_are_attached_and_others_all(tmp_path, monkeypatch):
    for pid, tid in ((100, 100), (100, 101), (100, 102), (200, 200), (200, 201)):
        (tmp_path / str(pid) / "task" / str(tid)).mkdir(parents=True)
    monkeypatch.setattr(Profiler, "proc_root", tmp_path)
    assert Profiler._threads([100, 999], vcpus=[101]) == [100, 101]
    assert Profiler._threads([200], vcpus=[]) == [200, 201]


def test_qemu_threads_are_classed_by_vcpu_main_and_io():
    def sample(tid, comm):
        return Sample(comm, 100, tid, 1, [])
    assert qemu_class(sample(101, "CPU 0/TCG"), 100, {101}) == "vcpu"
    assert qemu_class(sample(100, "qemu-system-x86"), 100, {101}) == "main"
    assert qemu_class(sample(105, "qemu-system-x86"), 100, {101}) == "io"


def test_stacks_are_folded_root_first_and_cut_at_the_root_side():
    profile = Profile()
    frames = [("leaf", "a.so"), ("[unknown]", "b.so"), ("mid", "a.so"), ("root", "a.so")]
    profile.add("c", Sample("prog", 1, 1, 2_000_000, frames), depth=3)
    assert list(profile.stacks) == [("c", "prog;…;mid;[b.so];leaf")]
    assert profile.functions[("c", "leaf", "a.so")] == 1
    assert profile.period_ns == 2_000_000 and profile.unresolved == 0


def test_text_without_samples_is_a_parse_error():
    with pytest.raises(ParseError):
        parse_script("Error: something\nnothing here\n")
    assert parse_script("").samples == []


# A stand-in for perf: logs each call; `record` opens the control FIFO, answers "enable"
# with "ack", writes perf.data, waits for SIGINT and re-raises it as perf record does;
# `script` prints $FAKE_PERF_SCRIPT once perf.data is complete.
FAKE_PERF = textwrap.dedent("""\
    #!{python}
    import json, os, signal, sys, time
    with open(os.environ["FAKE_PERF_LOG"], "a") as log:
        log.write(json.dumps({{"argv": sys.argv[1:], "pid": os.getpid()}}) + "\\n")
    args = sys.argv[1:]
    if args == ["version"]:
        print("perf version 6.1.fake")
    elif args[0] == "record":
        if os.environ.get("FAKE_PERF_FAIL"):
            sys.exit("Error: perf_event_paranoid setting is 4")
        time.sleep(float(os.environ.get("FAKE_PERF_SLOW", "0")))   # a perf slow to start
        control, ack = args[args.index("--control") + 1].removeprefix("fifo:").split(",")
        out = args[args.index("-o") + 1]
        stopped = []
        signal.signal(signal.SIGINT, lambda *_: stopped.append(1))
        c = os.open(control, os.O_RDONLY | os.O_NONBLOCK)
        with open(ack, "w") as a:
            open(out, "w").write("PERFILE2")
            while not stopped:
                try:
                    commands = os.read(c, 100).decode().split()
                except BlockingIOError:
                    commands = []
                for command in commands:
                    with open(os.environ["FAKE_PERF_LOG"], "a") as log:
                        log.write(json.dumps({{"command": command}}) + "\\n")
                    a.write("ack\\n")
                    a.flush()
                time.sleep(0.01)
        open(out, "a").write(" complete")
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    elif args[0] == "script":
        if not open(args[args.index("-i") + 1]).read().endswith("complete"):
            sys.exit("perf.data is incomplete")
        sys.stdout.write(open(os.environ["FAKE_PERF_SCRIPT"]).read())
    elif args[0] == "buildid-list":
        print("0123456789abcdef0123456789abcdef76543210 /usr/bin/sysbench")
    else:
        sys.exit("unexpected arguments")
    """)


@pytest.fixture
def fake_perf(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    perf = bin_dir / "perf"
    perf.write_text(FAKE_PERF.format(python=sys.executable))
    perf.chmod(0o755)
    log = tmp_path / "perf.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_PERF_LOG", str(log))
    monkeypatch.setenv("FAKE_PERF_SCRIPT", str(FIXTURES / "native-sysbench.txt"))

    def calls():
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return calls


@pytest.fixture
def make(tmp_path):
    journal = Journal(tmp_path / "journal-dir")
    journal.dir.mkdir(exist_ok=True)
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    def make(**params):
        return Profiler(plugin.build(Profiler.Options, params, "profile"), journal=journal,
                        scratch=scratch)
    make.journal = journal
    return make


def test_records_the_subjects_processes_and_stores_capped_folded_stacks(fake_perf, make):
    server = subprocess.Popen(["sleep", "60"])
    try:
        collector = make(stacks=2, functions=3)
        collector.start(Subject(kind="container", name="container:runc", pids=[server.pid]))
        record = fake_perf()[0]
        assert record["argv"][:6] == ["record", "-e", "cpu-clock", "-F", "499",
                                      "--call-graph"]
        assert record["argv"][-3:] == ["--no-no-inherit", "-t", str(server.pid)]
        assert len(make.journal.entries) == 1
        metrics = collector.stop()
    finally:
        server.kill()
        server.wait()
    assert make.journal.entries == {}
    assert [c["argv"][0] for c in fake_perf() if "argv" in c] == ["record", "script",
                                                                   "buildid-list"]
    # sysbench's unresolved samples, and no debug symbols of its build-id installed
    assert [(m.dimensions, m.value) for m in metrics if m.name == "debug symbols"] == [
        ({"dso": "sysbench"}, 0.0)]
    stacks = [m for m in metrics if m.name == "stack samples"]
    assert len(stacks) == 3 and stacks[-1].dimensions == {"class": OTHER, "stack": OTHER}
    assert sum(m.value for m in stacks) == 33
    assert len([m for m in metrics if m.name == "function samples"]) == 3
    by_name = {m.name: m.value for m in metrics if not m.dimensions}
    assert by_name["sampled cpu"] == pytest.approx(33 * 0.010101010, rel=0.01)
    assert 0 < by_name["unresolved share"] < 100
    assert by_name["profile cpu"] >= 0 and "profile overhead" in by_name


def test_the_bare_host_is_recorded_through_vmtax_itself(fake_perf, make):
    collector = make()
    collector.start(Subject(kind="native", name="native"))
    argv = fake_perf()[0]["argv"]
    assert argv[-2] == "-t" and str(os.getpid()) in argv[-1].split(",")
    metrics = collector.stop()
    assert [m.value for m in metrics if m.name == "class samples"] == [33]


def test_a_perf_that_cannot_record_is_a_collector_error_with_its_message(
        fake_perf, make, monkeypatch):
    monkeypatch.setenv("FAKE_PERF_FAIL", "1")
    collector = make()
    with pytest.raises(CollectorError, match="perf_event_paranoid setting is 4"):
        collector.start(Subject(kind="native", name="native"))
    collector.abort()
    assert make.journal.entries == {}


@pytest.mark.parametrize("lab", [False, True])
def test_perf_is_given_longer_to_start_in_a_lab(fake_perf, make, monkeypatch, lab):
    """In the lab perf took over 20 s to start on Firecracker's process (TCG under load)."""
    monkeypatch.setattr(profile, "START_TIMEOUT", 0.6)
    monkeypatch.setenv("FAKE_PERF_SLOW", "1.5")
    if lab:
        monkeypatch.setenv(machine.LAB_ENV, machine.LAB_LABEL)   # given 5 x 0.6 s
    collector = make()
    try:
        if lab:
            collector.start(Subject(kind="native", name="native"))
        else:
            with pytest.raises(CollectorError, match="did not answer within 0.6 s"):
                collector.start(Subject(kind="native", name="native"))
    finally:
        collector.abort()


def test_abort_kills_perf_and_empties_the_journal(fake_perf, make):
    collector = make()
    collector.start(Subject(kind="native", name="native"))
    pid = fake_perf()[0]["pid"]
    entry = next(iter(make.journal.entries.values()))
    collector.abort()
    collector.abort()   # twice is fine
    assert make.journal.entries == {}
    assert wait_for(lambda: not running(pid, entry["start"]), 5)


def test_unavailable_without_perf_or_for_a_remote_subject(monkeypatch, tmp_path):
    assert "nothing of ssh runs on this host" in Profiler.unavailable(
        Subject(kind="ssh", name="ssh"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    why = Profiler.unavailable(Subject(kind="native", name="native"))
    assert why.startswith("perf is not installed")
    assert Profiler.doctor() == (False, f"cannot profile: {why}")


def test_unavailable_without_permission(fake_perf, monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr("vmtax.collectors.profile.PARANOID", tmp_path / "paranoid")
    (tmp_path / "paranoid").write_text("2\n")
    assert "perf_event_paranoid=0 (now 2)" in Profiler.unavailable(
        Subject(kind="native", name="native"))


def test_pause_and_resume_disable_and_enable_perfs_events(fake_perf, make):
    collector = make()
    collector.start(Subject(kind="native", name="native"))
    collector.pause()
    collector.resume()
    collector.pause()
    collector.stop()
    assert [c["command"] for c in fake_perf() if "command" in c] == [
        "enable", "disable", "enable", "disable"]


def test_a_perf_gone_at_a_pause_fails_the_stop_in_one_line(fake_perf, make):
    collector = make()
    collector.start(Subject(kind="native", name="native"))
    os.kill(fake_perf()[0]["pid"], signal.SIGKILL)
    assert wait_for(lambda: collector._perf.poll() is not None, 5)
    collector.pause()      # never raises
    with pytest.raises(CollectorError, match=r"^profile: .*(ended \(exit code -9\)|Broken pipe)"):
        collector.stop()
    assert make.journal.entries == {}


def test_sigint_reaches_perf_at_stop(fake_perf, make):
    collector = make()
    collector.start(Subject(kind="native", name="native"))
    collector.stop()
    assert collector._perf.returncode in (-signal.SIGINT, 128 + signal.SIGINT)


def test_a_captured_tcg_guest_is_classed_by_its_vcpu_threads():
    script = parse_script((FIXTURES / "qemu-tcg.txt").read_text())
    guest = Subject(kind="vm", name="vm:tcg", pids=[2967], vcpu_threads=[2979, 2980],
                    vmm_process=True)
    kept = own_samples(script, guest, {2967}, set())
    assert Counter(cls for cls, _ in kept) == {"vcpu": 143, "main": 7}
    # Of a subject that is no VMM, the threads are its processes' own, whatever their ids.
    other = dataclasses.replace(guest, vmm_process=False)
    assert "vcpu" not in {cls for cls, _ in own_samples(script, other, {2967}, set())}
    profile = Profile()
    for cls, sample in kept:
        profile.add(cls, sample, depth=32)
    leaves = {function for (_, function, _) in profile.functions}
    # TCG's generated code is anonymous memory; Debian's QEMU is stripped, so only its
    # exported symbols (softfloat, tcg_gen_code, ...) have names
    assert {"[perf-PID.map]", "[qemu-system-x86_64]", "tcg_gen_code"} <= leaves


def test_captured_runsc_and_bare_host_jobs_are_told_apart():
    script = parse_script((FIXTURES / "runsc-and-native.txt").read_text())
    runsc = own_samples(script, Subject(kind="container", name="container:runsc"), {4154},
                        {"runsc"}, "vmtax")
    classes = Counter(cls for cls, _ in runsc)
    assert classes["sentry"] == 14 and "sysbench" not in classes and "addr2line" not in classes
    native = own_samples(script, Subject(kind="native", name="native"), {4154},
                         {"runsc", "runc", "crun"}, "vmtax")
    assert Counter(cls for cls, _ in native) == {"sysbench": 60}


def test_a_profiles_breakdowns_stay_out_of_the_run_summary():
    """Stacks and functions are shown by `vmtax profile`; `show --all` and the report's
    tables summarize the collector's totals only (a real run had ~1,200 stack rows)."""
    from vmtax.analysis.summary import summarize_run
    from vmtax.core.types import Metric
    from vmtax.results.store import Rep, Run

    def rep(i, phase, metrics):
        return Rep(id=i, run_id="r", target="native", workload="cpu", params={}, phase=phase,
                   idx=i, status="ok", error=None, exit_code=0, host_elapsed=1.0,
                   guest_elapsed=None, started=float(i), argv=[], metrics=metrics)

    run = Run(id="r", created=0.0, finished=1.0, status="done", plan={}, host={},
              version="0", targets={"native": {"kind": "native", "fingerprint": {}}},
              reps=[rep(0, "measure", [Metric("events/s", 100.0, "events/s", True)]),
                    rep(1, "collect", [
                        Metric("stack samples", 40, "samples", False,
                               {"class": "cpu", "stack": "sysbench;main;cpu_execute"}),
                        Metric("function samples", 40, "samples", False,
                               {"class": "cpu", "function": "cpu_execute", "dso": "sysbench"}),
                        Metric("class samples", 40, "samples", False, {"class": "cpu"}),
                        Metric("unresolved share", 95.9, "%", False),
                        Metric("profile overhead", 4.1, "%", False)])])
    metrics = {row.metric for row in summarize_run(run).rows}
    assert metrics == {"events/s"}
    # issue 36: class samples were listed as results ("native: failed ×0" where native has
    # no vCPU thread), the unresolved share and the profiler's overhead drawn as ratios to
    # native. They are bookkeeping, which the collector's manifest declares.
    from vmtax.collectors.profile import Profiler
    assert {s.name for s in Profiler.metrics if s.bookkeeping} == {
        "sampled cpu", "unresolved share", "profile cpu", "profile overhead", "debug symbols"}
    assert all(s.breakdown or s.bookkeeping for s in Profiler.metrics)
