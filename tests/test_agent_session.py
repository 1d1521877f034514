"""AgentSession's setup of a booted guest, whatever started its QEMU: which jobs it sends for
each scratch disk bus (the guest half of each is tested by the live tests)."""

import socket
import time
from pathlib import Path

import pytest

from vmtax.core.errors import TargetError
from vmtax.core.types import Job, JobResult
from vmtax.guest import agent_session
from vmtax.guest.agent_session import AgentSession


class Recorded(AgentSession):
    """The jobs setup sends, answered as a guest would (fail: the argv[0..2] that fails)."""

    def __init__(self, fail: tuple[str, ...] = ()):
        super().__init__("vm", channel=None, console_log=Path("/nonexistent"),
                         kill=lambda: None)
        self.jobs: list[Job] = []
        self.fail = fail

    def run(self, job: Job) -> JobResult:
        self.jobs.append(job)
        if tuple(job.argv[:len(self.fail)]) == self.fail and self.fail:
            return JobResult(1, "", "no block device /dev/sda\n", 0.01)
        return JobResult(0, "", "", 0.01, guest_elapsed=0.001)


@pytest.mark.parametrize("bus, phase, device", [
    ("virtio-blk", None, "/dev/vda"),
    ("virtio-scsi", "scsi", "/dev/sda"),
    ("nvme", "nvme", "/dev/nvme0n1"),
])
def test_the_scratch_disk_follows_its_bus(bus, phase, device):
    session = Recorded()
    overhead = session.setup(None, bus)
    argvs = [job.argv for job in session.jobs]
    mount = ["/bin/sh", "/vmtax/disk", device, agent_session.SCRATCH]
    if phase is None:
        assert argvs[0] == mount
    else:   # its drivers first, from the image's list of that phase
        assert argvs[0][:2] == ["/bin/sh", "-c"] and argvs[0][3:] == [phase]
        assert '"/vmtax/modules/$0.list"' in argvs[0][2]
        assert argvs[1] == mount
    assert argvs[-3:] == [["true"]] * 3
    assert overhead == pytest.approx(0.009)


def test_trees_are_mounted_read_only_by_serial_and_the_network_comes_up():
    session = Recorded()
    session.setup(("10.0.0.2/24", "10.0.0.1"), "virtio-blk",
                  (("vmtax-tree0", "/usr/src/a"), ("vmtax-tree1", "/b")))
    assert [job.argv for job in session.jobs[1:4]] == [
        ["/bin/sh", "/vmtax/disk", "serial:vmtax-tree0", "/usr/src/a", "ro"],
        ["/bin/sh", "/vmtax/disk", "serial:vmtax-tree1", "/b", "ro"],
        ["/bin/sh", "/vmtax/net", "10.0.0.2/24", "10.0.0.1"]]


def test_a_scratch_disk_that_never_appears_fails_in_one_line():
    session = Recorded(fail=("/bin/sh", "/vmtax/disk"))
    with pytest.raises(TargetError, match="^vm: mounting the scratch disk in the guest "
                                          "failed: no block device /dev/sda$"):
        session.setup(None, "virtio-scsi")


def test_a_setup_job_without_an_answer_says_its_timeout_and_the_console(tmp_path):
    """A CI run's lab printed "mounting the scratch disk in the guest failed: " and nothing
    more: the job had outlived its timeout, which gives no output."""
    console = tmp_path / "console.log"
    console.write_bytes(b"[  80.1] rcu: INFO: rcu_sched detected stalls on CPUs/tasks:\n"
                        b"[  80.1] rcu: \t0-...0: (1 GPs behind) idle=8e4\n")

    class Silent(Recorded):
        def run(self, job):
            self.jobs.append(job)
            return JobResult(None, "", "", 60.0, timed_out=True)

    session = Silent()
    session.console_log = console
    with pytest.raises(agent_session.JobUnanswered,
                       match=r"^vm: mounting the scratch disk in the guest failed: it did not "
                             r"finish within 60 s; console: .*rcu_sched detected stalls") as exc:
        session.setup(None, "virtio-blk")
    # Found by a user: the stall report's tab came out as a literal "\t" in the one line.
    assert str(exc.value).endswith("| [ 80.1] rcu: 0-...0: (1 GPs behind) idle=8e4")


class Booting(agent_session.AgentGuest):
    """A guest whose first boots are lost (its QEMU gone before READY)."""

    def __init__(self, lost: int, unanswered: int = 0, kvm: bool = True):
        super().__init__("kvm")
        self.lost, self.unanswered, self.kvm = lost, unanswered, kvm
        self.boots = self.stops = 0

    def _start(self):
        self.boots += 1
        self.nested_kvm = self.kvm and agent_session.machine.lab() is not None
        if self.boots <= self.lost:
            raise agent_session.GuestLost(f"kvm: guest failed to boot (boot {self.boots})")
        if self.boots <= self.unanswered:   # READY, then its setup got no answer
            raise agent_session.JobUnanswered(f"kvm: mounting failed (boot {self.boots})")

    def stop(self):
        self.stops += 1

    def _check_running(self):
        pass

    def _boot_failure(self, exc):
        return str(exc)

    def kill(self):
        pass

    def alive(self):
        return True

    def host_pids(self):
        return []


def test_a_guest_lost_while_booting_in_a_lab_is_booted_once_more(monkeypatch, capsys):
    monkeypatch.setenv("VMTAX_LAB", "nested KVM in a TCG lab, AMD-V emulated")
    guest = Booting(lost=1)
    guest.start()
    assert guest.boots == 2
    assert capsys.readouterr().err == ("vmtax: kvm: guest failed to boot (boot 1); booting it "
                                       "once more (in a lab)\n")
    # Once more only: a guest lost twice is an error.
    twice = Booting(lost=2)
    with pytest.raises(agent_session.GuestLost, match="boot 2"):
        twice.start()
    assert twice.boots == 2


def test_a_guest_lost_while_booting_on_a_real_host_is_an_error(monkeypatch, capsys):
    monkeypatch.delenv("VMTAX_LAB", raising=False)
    with pytest.raises(agent_session.GuestLost, match="boot 1"):
        Booting(lost=1).start()
    assert capsys.readouterr().err == ""


def test_a_stall_on_the_console_is_seen_once_its_line_is_whole(tmp_path):
    console = tmp_path / "console.log"
    console.write_bytes(b"[    0.1] PCI: Fatal: No config space access function found\n")
    calls = []
    watch = agent_session.StallWatch(console, lambda: calls.append(1))
    watch()
    with open(console, "ab") as f:
        f.write(b"[   21.5] rcu: INFO: rcu_sched detected st")
    watch()   # half a line: the kernel is still writing it
    with open(console, "ab") as f:
        f.write(b"alls on CPUs/tasks:\n[   21.5] rcu: \t1-...!: (0 ticks this GP)\n")
    with pytest.raises(agent_session.KernelStalled,
                       match=r"^rcu: INFO: rcu_sched detected stalls on CPUs/tasks:$"):
        watch()
    assert len(calls) == 3   # QEMU's own check still runs first, every time


def test_a_soft_lockup_is_a_stall_and_a_missing_console_is_none(tmp_path):
    watch = agent_session.StallWatch(tmp_path / "console.log", lambda: None)
    watch()
    (tmp_path / "console.log").write_bytes(
        b"watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [swapper/1:0]\n")
    with pytest.raises(agent_session.KernelStalled, match="CPU#1 stuck for 22s"):
        watch()


def in_lab(monkeypatch, lab: bool) -> None:
    if lab:
        monkeypatch.setenv("VMTAX_LAB", "nested KVM in a TCG lab, AMD-V emulated")
    else:
        monkeypatch.delenv("VMTAX_LAB", raising=False)


@pytest.mark.parametrize("lab, kvm, lost", [(True, True, True), (True, False, False),
                                            (False, True, False)])
def test_only_a_kvm_guest_in_a_lab_is_given_up_when_its_kernel_stalls(
        tmp_path, monkeypatch, lab, kvm, lost):
    in_lab(monkeypatch, lab)
    console = tmp_path / "console.log"
    console.write_bytes(b"rcu: INFO: rcu_preempt self-detected stall on CPU\n")
    guest = Booting(lost=0)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)   # no QEMU connects
    listener.bind(str(tmp_path / "agent.sock"))
    listener.listen(1)
    with pytest.raises(TargetError) as raised:
        guest._await_agent(listener, time.monotonic(), time.monotonic() + 0.5, console, kvm)
    assert isinstance(raised.value, agent_session.GuestLost) == lost


@pytest.mark.parametrize("lab, kvm, lost", [(True, True, True), (True, False, False),
                                            (False, True, False)])
def test_only_a_kvm_guest_in_a_lab_silent_past_its_boot_timeout_is_lost(
        tmp_path, monkeypatch, lab, kvm, lost):
    """A lab's vm:kvm gave no READY within 300 s, console empty, while three other L2s of
    the same lab were READY in 24-75 s, and its cells failed unretried. Lost, it is booted
    once more (start()); a TCG guest, or one on a host, may only be slow."""
    in_lab(monkeypatch, lab)
    console = tmp_path / "console.log"
    console.write_bytes(b"")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)   # no QEMU connects
    listener.bind(str(tmp_path / "agent.sock"))
    listener.listen(1)
    with pytest.raises(TargetError) as raised:
        Booting(lost=0)._await_agent(listener, time.monotonic(), time.monotonic() + 0.5,
                                     console, kvm)
    assert isinstance(raised.value, agent_session.GuestLost) == lost


@pytest.mark.parametrize("lab, kvm, again", [(True, True, True), (True, False, False),
                                             (False, True, False)])
def test_a_nested_kvm_guest_whose_setup_gets_no_answer_is_booted_once_more(
        monkeypatch, capsys, lab, kvm, again):
    in_lab(monkeypatch, lab)
    guest = Booting(lost=0, unanswered=1, kvm=kvm)
    if not again:
        with pytest.raises(agent_session.JobUnanswered, match="boot 1"):
            guest.start()
        return
    guest.start()
    assert guest.boots == 2
    assert "mounting failed (boot 1); booting it once more" in capsys.readouterr().err
    with pytest.raises(agent_session.JobUnanswered, match="boot 2"):
        Booting(lost=0, unanswered=2, kvm=kvm).start()   # once more only


def test_a_slow_boot_blames_no_line_every_boot_prints_and_says_how_to_wait_longer(tmp_path):
    """Issue 48.15: with tb_size = 1 a TCG guest failed "no agent READY within 60 s",
    quoting `PCI: Fatal: No config space access function found`, the first line of every
    microvm boot; it now quotes only what says something, and how to give more time."""
    console = tmp_path / "console.log"
    console.write_bytes(b"[    0.1] PCI: Fatal: No config space access function found\n")
    assert agent_session.tail(console) == ""
    with open(console, "ab") as f:
        f.write(b"[   41.2] virtio_blk virtio1: [vda] 8388608 512-byte logical blocks\n")
    # In words (a line's own whitespace, a tab of an RCU report, is one space).
    assert agent_session.tail(console) == (
        "[ 41.2] virtio_blk virtio1: [vda] 8388608 512-byte logical blocks")
    said = Booting(lost=0)._not_ready(TimeoutError(), None, 60)
    assert said == ("no agent READY within 60 s; a guest this slow may only need more time: "
                    "boot_timeout = 120 in the target's options")
