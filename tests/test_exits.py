"""The exits collector against a fake `perf` on PATH (the process boundary): the argv it
runs, the SIGINT at stop, the report it parses, the journal, and every reason it gives for
not recording. Nothing here records real exits: /dev/kvm is kvm_pvm."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import wait_for

from vmtax.collectors import exits
from vmtax.collectors.exits import Exits
from vmtax.core import plugin
from vmtax.core.collector import CollectorError, Subject
from vmtax.host import kvm
from vmtax.host.journal import Journal
from vmtax.host.proc import running

FIXTURES = Path(__file__).parent / "fixtures" / "perf_kvm"

# A stand-in for perf: logs each call (argv, cwd) as a JSON line; `kvm stat record` writes a
# header to perf.data.guest, waits for SIGINT, completes the file and re-raises the signal
# as perf record does; `kvm stat report` prints $FAKE_PERF_REPORT on stderr, as perf does,
# once the file is complete.
FAKE_PERF = textwrap.dedent("""\
    #!{python}
    import json, os, signal, sys, time
    with open(os.environ["FAKE_PERF_LOG"], "a") as log:
        call = {{"argv": sys.argv[1:], "cwd": os.getcwd(), "pid": os.getpid()}}
        log.write(json.dumps(call) + "\\n")
    args = sys.argv[1:]
    if args == ["version"]:
        print("perf version 6.1.fake")
    elif args[:3] == ["kvm", "stat", "record"]:
        if os.environ.get("FAKE_PERF_FAIL"):
            print("Error: No permissions to read /sys/kernel/tracing/events/kvm/kvm_exit",
                  file=sys.stderr)
            sys.exit(255)
        stopped = []
        signal.signal(signal.SIGINT, lambda *_: stopped.append(1))
        with open("perf.data.guest", "w") as f:
            f.write("PERFILE2")
        while not stopped:
            time.sleep(0.01)
        with open("perf.data.guest", "a") as f:
            f.write(" complete")
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    elif args[:3] == ["kvm", "stat", "report"]:
        if not open("perf.data.guest").read().endswith("complete"):
            sys.exit("perf.data.guest is incomplete")
        sys.stderr.write(open(os.environ["FAKE_PERF_REPORT"]).read())
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
    monkeypatch.setenv("FAKE_PERF_REPORT", str(FIXTURES / "classic-vmx.txt"))

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
        return Exits(plugin.build(Exits.Options, params, "exits"), journal=journal,
                     scratch=scratch)
    make.journal = journal
    make.scratch = scratch
    return make


@pytest.fixture
def qemu():
    """A process standing in for the QEMU the collector is pointed at."""
    p = subprocess.Popen(["sleep", "60"])
    yield Subject(kind="vm", name="vm:kvm", vmm_process=True, pids=[p.pid])
    p.kill()
    p.wait()


def test_records_the_qemu_pid_and_parses_the_report_after_sigint(fake_perf, make, qemu):
    collector = make()
    collector.start(qemu)
    record = fake_perf()[0]
    assert record["argv"] == ["kvm", "stat", "record", "-p", str(qemu.pids[0])]
    assert record["cwd"] == str(make.scratch)
    # perf runs, and is journaled so that a killed vmtax does not leave it behind.
    assert [e["pid"] for e in make.journal.entries.values()] == [record["pid"]]
    metrics = collector.stop()
    report = fake_perf()[1]
    assert report["argv"] == ["kvm", "stat", "report", "--event=vmexit"]
    assert report["cwd"] == str(make.scratch)
    values = {m.key: m.value for m in metrics}
    assert values["exit share[event=vmexit,reason=EXTERNAL_INTERRUPT]"] == 4.11
    assert values["exits total[event=vmexit]"] == 10000
    assert make.journal.entries == {}
    assert collector.warnings == []


def test_every_event_kind_asked_is_reported(fake_perf, make, qemu, monkeypatch):
    monkeypatch.setenv("FAKE_PERF_REPORT", str(FIXTURES / "classic-ioport.txt"))
    collector = make(events=["vmexit", "ioport"])
    collector.start(qemu)
    collector.stop()
    assert [c["argv"][-1] for c in fake_perf()[1:]] == ["--event=vmexit", "--event=ioport"]


def test_a_perf_that_cannot_record_is_a_collector_error_with_its_message(
        fake_perf, make, qemu, monkeypatch):
    monkeypatch.setenv("FAKE_PERF_FAIL", "1")
    collector = make()
    with pytest.raises(CollectorError, match="exited at once: Error: No permissions"):
        collector.start(qemu)
    collector.abort()
    assert make.journal.entries == {}


def test_a_garbled_report_is_a_collector_error_naming_the_line(
        fake_perf, make, qemu, monkeypatch, tmp_path):
    garbled = tmp_path / "garbled.txt"
    garbled.write_text((FIXTURES / "classic-vmx.txt").read_text().replace("411", "4x1"))
    monkeypatch.setenv("FAKE_PERF_REPORT", str(garbled))
    collector = make()
    collector.start(qemu)
    with pytest.raises(CollectorError, match=r"line 13 'EXTERNAL_INTERRUPT +4x1"):
        collector.stop()
    assert make.journal.entries == {}


def test_abort_kills_perf_and_empties_the_journal(fake_perf, make, qemu):
    collector = make()
    collector.start(qemu)
    pid = fake_perf()[0]["pid"]
    start = next(iter(make.journal.entries.values()))["start"]
    collector.abort()
    collector.abort()   # twice is harmless
    assert wait_for(lambda: not running(pid, start), 5)
    assert make.journal.entries == {}


# -- why not ------------------------------------------------------------------------------

def _proc_with_fd(root: Path, pid: int, link: str) -> Path:
    fd = root / str(pid) / "fd"
    fd.mkdir(parents=True)
    os.symlink(link, fd / "3")
    return root


def test_unavailable_for_no_vm_and_for_a_tcg_guest(monkeypatch, tmp_path):
    assert Exits.unavailable(Subject(kind="container", name="container:runc", pids=[1])) == (
        "container:runc is no VM: exits are those of a KVM guest")
    monkeypatch.setattr(Exits, "proc_root", _proc_with_fd(tmp_path, 4242, "/dev/null"))
    monkeypatch.setattr(kvm, "probe", lambda: kvm.KvmStatus(False, kvm.PVM_REASON, "kvm_pvm"))
    why = Exits.unavailable(Subject(kind="vm", name="vm:tcg", vmm_process=True, pids=[4242]))
    assert why == ("vm:tcg runs under TCG, which has no VM exits (and KVM is unusable here: "
                   + kvm.PVM_REASON + ")")


def test_any_target_whose_first_process_is_a_vmm_is_recorded_not_only_vm(monkeypatch,
                                                                         tmp_path):
    """A libvirt domain's QEMU (and a microVM's VMM) holds a KVM VM as a vm target's does:
    the collector asks Subject.vmm_process, not the target's kind."""
    monkeypatch.setattr(Exits, "proc_root", _proc_with_fd(tmp_path, 4242, "anon_inode:kvm-vm"))
    monkeypatch.setattr(kvm, "probe", lambda: kvm.KvmStatus(True, "works", "kvm_amd"))
    monkeypatch.setattr(Exits, "tracefs", (tmp_path,))
    (tmp_path / "events" / "kvm" / "kvm_exit").mkdir(parents=True)
    monkeypatch.setattr(exits, "perf_problem", lambda: None)
    domain = Subject(kind="libvirt", name="libvirt-kvm", pids=[4242], vmm_process=True)
    assert Exits.unavailable(domain) is None
    assert Exits.unavailable(dataclasses.replace(domain, vmm_process=False)) == (
        "libvirt-kvm is no VM: exits are those of a KVM guest")


def test_unavailable_for_a_kvm_guest_on_kvm_pvm(monkeypatch, tmp_path):
    monkeypatch.setattr(Exits, "proc_root", _proc_with_fd(tmp_path, 4242, "anon_inode:kvm-vm"))
    monkeypatch.setattr(kvm, "probe", lambda: kvm.KvmStatus(False, kvm.PVM_REASON, "kvm_pvm"))
    guest = Subject(kind="vm", name="vm:kvm", vmm_process=True, pids=[4242])
    assert Exits.unavailable(guest) == kvm.PVM_REASON


@pytest.fixture
def kvm_guest(monkeypatch, tmp_path):
    monkeypatch.setattr(Exits, "proc_root", _proc_with_fd(tmp_path / "proc", 4242,
                                                          "anon_inode:kvm-vm"))
    monkeypatch.setattr(kvm, "probe", lambda: kvm.KvmStatus(True, "works", "kvm_intel"))
    tracing = tmp_path / "tracing"
    monkeypatch.setattr(Exits, "tracefs", (tracing,))
    return Subject(kind="vm", name="vm:kvm", vmm_process=True, pids=[4242]), tracing


def test_unavailable_without_perf(kvm_guest, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert Exits.unavailable(kvm_guest[0]) == (
        "perf is not installed: apt-get install linux-perf")


def test_unavailable_without_tracefs_or_tracepoint(kvm_guest, fake_perf):
    subject, tracing = kvm_guest
    assert Exits.unavailable(subject).startswith("tracefs is not mounted")
    (tracing / "events" / "sched").mkdir(parents=True)
    assert Exits.unavailable(subject).startswith("the host kernel has no kvm:kvm_exit tracepoint")
    (tracing / "events" / "kvm" / "kvm_exit").mkdir(parents=True)
    if os.geteuid() == 0:
        assert Exits.unavailable(subject) is None


def test_unavailable_without_permission(kvm_guest, fake_perf, monkeypatch):
    subject, tracing = kvm_guest
    (tracing / "events" / "kvm" / "kvm_exit").mkdir(parents=True)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    why = Exits.unavailable(subject)
    assert why is not None and why.startswith("no permission to record kvm tracepoints")


def test_doctor_line_says_why_not(monkeypatch):
    monkeypatch.setattr(kvm, "probe", lambda: kvm.KvmStatus(False, kvm.PVM_REASON, "kvm_pvm"))
    assert Exits.doctor() == (
        False, f"cannot record VM exits: no usable KVM ({kvm.PVM_REASON})")


def test_stop_when_perf_already_ended_warns(fake_perf, make, qemu):
    collector = make()
    collector.start(qemu)
    pid = fake_perf()[0]["pid"]
    os.kill(pid, signal.SIGINT)
    assert wait_for(lambda: collector._perf.poll() is not None, 10)
    collector.stop()
    assert collector.warnings and "ended before stop" in collector.warnings[0]


def test_per_vcpu_reports_each_vcpu_of_the_subject(fake_perf, make, qemu):
    collector = make(per_vcpu=True)
    collector.start(dataclasses.replace(qemu, vcpu_threads=[11, 12]))
    metrics = collector.stop()
    assert [c["argv"][3:] for c in fake_perf()[1:]] == [
        ["--event=vmexit"], ["--event=vmexit", "--vcpu=0"], ["--event=vmexit", "--vcpu=1"]]
    totals = {m.dimensions.get("vcpu"): m.value for m in metrics if m.name == "exits total"}
    assert totals == {None: 10000, "0": 10000, "1": 10000}
    declared = {s.name: s.dimensions for s in Exits.metrics}
    assert all(set(m.dimensions) <= set(declared[m.name]) for m in metrics)


def test_vmtax_doctor_has_the_exits_line(monkeypatch):
    from click.testing import CliRunner

    from vmtax.cli.main import cli
    from vmtax.host import doctor

    monkeypatch.setattr(doctor, "doctor", lambda: [])   # the other checks have their own tests
    monkeypatch.setattr(kvm, "probe", lambda: kvm.KvmStatus(False, kvm.PVM_REASON, "kvm_pvm"))
    res = CliRunner().invoke(cli, ["doctor", "--json"])
    assert res.exit_code == 0, res.output
    checks = json.loads(res.output)["checks"]
    assert {"name": "exits", "ok": False,
            "detail": f"cannot record VM exits: no usable KVM ({kvm.PVM_REASON})"} in checks
