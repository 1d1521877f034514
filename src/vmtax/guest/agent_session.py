"""Jobs in a booted vmtax guest, over its agent's channel, whatever started its QEMU (vmtax
itself, vmtax.targets.vm; or libvirt): the scratch disk it mounts, waiting for its agent's
READY, the session that runs its jobs, and `AgentGuest`, what both kinds of instance share.

A job that outlives its timeout and the host's margin means a hung guest: the guest is
killed (the `kill` its owner gives) and the job fails with what its console said last. A
job SIGKILLed inside the guest, not by the agent's timeout, is told apart: the guest
kernel's OOM killer says so on the console.
"""

from __future__ import annotations

import abc
import os
import re
import select
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from vmtax.core.errors import TargetError, VmtaxError
from vmtax.core.instance import Instance
from vmtax.core.types import Job, JobResult
from vmtax.guest.agent import Channel, encode_job, read_result
from vmtax.guest.qemu import parse_size
from vmtax.host import hugepages, machine, proc

if TYPE_CHECKING:
    from vmtax.host.journal import Journal
    from vmtax.host.network import Endpoint as NetEndpoint
    from vmtax.host.network import Network

# Host-side grace beyond a job's own timeout before the guest is declared hung: the agent
# kills the job at its timeout itself, this covers decoding and sending the output back.
HOST_MARGIN = 15.0
# The scratch disk's bus -> (its block device in the guest, the image's module phase loaded
# before it is mounted: guest.image.SCSI_MODULES, NVME_MODULES).
DISK_BUSES = {"virtio-blk": ("/dev/vda", None), "virtio-scsi": ("/dev/sda", "scsi"),
              "nvme": ("/dev/nvme0n1", "nvme")}
# A module phase's drivers ($0), in the image's order; one that does not load (a CRC driver
# for an instruction the CPU model lacks) is skipped. No list: the kernel has them built in.
_LOAD_PHASE = ('[ -f "/vmtax/modules/$0.list" ] || exit 0; while read -r ko; do '
               '[ -d "/sys/module/${ko%.ko}" ] || insmod "/vmtax/modules/$ko" 2> /dev/null; '
               'done < "/vmtax/modules/$0.list"; exit 0')
SCRATCH = "/work"
# A job's exit status when SIGKILL ended it (128 + 9): the agent's watchdog on a timeout,
# else something inside the guest, most often its kernel's OOM killer.
KILLED = 137
# The kernel's line when its OOM killer ends a process (mm/oom_kill.c; "quiet" still prints
# it, at KERN_ERR): "Out of memory: Killed process 312 (sysbench) total-vm:...".
_OOM = re.compile(r"(?:Memory cgroup out|Out) of memory[^:\n]*: Killed process \d+ \([^)]*\)")
# What a guest's kernel prints when a CPU stopped making progress: RCU's stall detector
# (kernel/rcu/tree_stall.h) and the soft-lockup watchdog.
_STALL = re.compile(rb"rcu: INFO: rcu_\w+ (?:self-)?detected stalls?[^\n]*|"
                    rb"watchdog: BUG: soft lockup[^\n]*")


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def killed_by(console_log: Path, since: int) -> str:
    """Why a job inside the guest was killed (SIGKILL, not by vmtax's timeout), from what
    the guest's kernel printed on its console while the job ran."""
    try:
        with open(console_log, "rb") as f:
            f.seek(since)
            said = f.read().decode(errors="replace")
    except OSError:
        said = ""
    found = _OOM.search(said)
    if found:
        return f"killed by the guest's OOM killer (its memory ran out): {found[0]}"
    return "killed by SIGKILL inside the guest; its kernel said nothing of it on the console"


# Lines a guest's console prints on every boot, failed or not: quoted as the last words of a
# boot that timed out, they blamed the wrong thing (microvm's PCI line, with tb_size = 1
# making TCG too slow to reach the agent in 60 s).
BOOT_NOISE = re.compile(r"PCI: Fatal: No config space access function found"
                        r"|XSAVE consistency problem|Unhandled WRMSR")


def tail(path: Path, lines: int = 5) -> str:
    """The last lines of a log (a guest's console, a VMM's log) on one line, less those
    every boot prints (BOOT_NOISE)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    # Words, not a line's own whitespace: the kernel's RCU stall report has tabs, which a
    # one-line error showed as a literal "\t".
    said = [" ".join(line.split()) for line in text.strip().splitlines()
            if line.strip() and not BOOT_NOISE.search(line)]
    return " | ".join(said[-lines:])


def direct_io_works(directory: Path) -> bool:
    """cache=none opens the disk with O_DIRECT, which some filesystems (tmpfs) refuse."""
    probe = directory / ".direct-io-probe"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600)
    except OSError:
        return False
    os.close(fd)
    probe.unlink()
    return True


def make_scratch_disk(disk: Path, size: str, bytes_per_inode: int | None = None) -> None:
    """The guest's scratch disk: an ext4 image of size, with its inode tables and journal
    zeroed here, so no lazy-init thread runs in the guest while it is measured (fewer
    inodes, bytes_per_inode, make a large disk's tables quicker to zero)."""
    mkfs = shutil.which("mkfs.ext4")
    if mkfs is None:
        raise VmtaxError("mkfs.ext4 is not installed; install e2fsprogs")
    with open(disk, "wb") as f:
        f.truncate(parse_size(size))
    inodes = ["-i", str(bytes_per_inode)] if bytes_per_inode else []
    done = proc.run([mkfs, "-q", "-F", *inodes, "-E", "lazy_itable_init=0,lazy_journal_init=0",
                     str(disk)], timeout=120)
    if done.exit_code != 0:
        raise TargetError(f"mkfs.ext4 {disk} failed: {done.stderr.strip()[:300]}")


def await_ready(listener: socket.socket, deadline: float,
                check_running: Callable[[], None]) -> tuple[Channel, float]:
    """The agent's channel once QEMU has connected to listener and the agent said READY,
    and the guest's uptime then; check_running raises EOFError once QEMU is gone.
    TimeoutError past deadline."""
    while True:
        ready, _, _ = select.select([listener], [], [],
                                    max(0.0, min(deadline - time.monotonic(), 0.2)))
        if ready:
            sock, _ = listener.accept()
            break
        check_running()
        if time.monotonic() >= deadline:
            raise TimeoutError("nothing connected to the agent's socket")
    channel = Channel(sock, check_running)
    try:
        while not (line := channel.readline(deadline)).startswith(b"READY"):
            pass
    except BaseException:
        sock.close()
        raise
    return channel, float(line.split()[2])


def run_job(channel: Channel, job_id: int, job: Job, console_log: Path, host_margin: float,
            kill: Callable[[], None]) -> JobResult:
    """Run job as job_id over the agent's channel; a guest that does not answer in time, or
    dies, is killed and the job fails saying so. Never raises for a failing command."""
    console_at = file_size(console_log)   # what the guest's kernel says from here
    start = time.perf_counter()
    try:
        channel.send(encode_job(job_id, job))
        result = read_result(channel, job_id, time.monotonic() + job.timeout + host_margin)
    except (TimeoutError, EOFError, OSError) as exc:
        elapsed = time.perf_counter() - start
        hung = isinstance(exc, TimeoutError)
        console = tail(console_log)
        kill()
        why = ("the guest did not answer within the job's timeout + "
               f"{host_margin:g} s and was stopped" if hung else f"the guest died ({exc})")
        return JobResult(None, "", why + (f"; console: {console}" if console else ""),
                         elapsed, timed_out=hung)
    elapsed = time.perf_counter() - start
    stderr = result.stderr.decode(errors="replace")
    if result.exit_code == KILLED and not result.timed_out:
        # Last: a failure is reported by its last line of stderr.
        stderr = f"{stderr.rstrip()}\n{killed_by(console_log, console_at)}"
    return JobResult(None if result.timed_out else result.exit_code,
                     result.stdout.decode(errors="replace"), stderr, elapsed,
                     guest_elapsed=result.elapsed_ns / 1e9, timed_out=result.timed_out)


class AgentSession:
    """The jobs of one booted guest: `channel` to its agent, `console_log` what its kernel
    prints, `kill` ends the guest when it hangs."""

    def __init__(self, name: str, channel: Channel, console_log: Path,
                 kill: Callable[[], None], host_margin: float = HOST_MARGIN):
        self.name = name
        self.channel = channel
        self.console_log = console_log
        self.kill = kill
        self.host_margin = host_margin
        self._job_ids = 0

    def run(self, job: Job) -> JobResult:
        self._job_ids += 1
        return run_job(self.channel, self._job_ids, job, self.console_log, self.host_margin,
                       self.kill)

    def must(self, job: Job, what: str) -> JobResult:
        result = self.run(job)
        if result.ok:
            return result
        said = (result.stderr.strip() or result.stdout.strip())[-300:]
        if result.exit_code is not None:
            raise TargetError(f"{self.name}: {what} failed: {said}")
        # No exit status: the job outlived its timeout, or the guest stopped answering.
        console = tail(self.console_log)
        raise JobUnanswered(f"{self.name}: {what} failed: "
                            + (said or f"it did not finish within {job.timeout:g} s")
                            + (f"; console: {console}" if console else ""))

    def setup(self, address: tuple[str, str] | None, disk_bus: str = "virtio-blk",
              trees: tuple[tuple[str, str], ...] = ()) -> float:
        """After READY: mount the scratch disk at SCRATCH (the first disk on disk_bus, its
        drivers loaded first), the read-only trees ((disk serial, mountpoint)), bring up the
        network (address: (CIDR, gateway)), and measure what a job costs the host beyond
        the guest's own timing (channel, agent), which is taken off before the guest clock
        is checked against the host's."""
        device, phase = DISK_BUSES[disk_bus]
        if phase is not None:
            self.must(Job(["/bin/sh", "-c", _LOAD_PHASE, phase], timeout=60),
                      f"loading the guest's {disk_bus} drivers")
        self.must(Job(["/bin/sh", "/vmtax/disk", device, SCRATCH], timeout=60),
                  "mounting the scratch disk in the guest")
        for serial, mountpoint in trees:
            self.must(Job(["/bin/sh", "/vmtax/disk", f"serial:{serial}", mountpoint, "ro"],
                          timeout=60), f"mounting {mountpoint} in the guest")
        if address is not None:
            self.must(Job(["/bin/sh", "/vmtax/net", *address], timeout=60),
                      "bringing up the guest's network")
        trivial = [self.run(Job(["true"], timeout=30)) for _ in range(3)]
        return sorted(r.host_elapsed - (r.guest_elapsed or 0) for r in trivial)[1]

    def spawn(self, job: Job) -> int:
        """Start job in the background in the guest (its own process group, output to a log
        in /tmp); returns its guest pid."""
        started = self.must(Job(["/bin/sh", "/vmtax/spawn", f"/tmp/spawn-{self._job_ids}.log",
                                 *job.argv], env=job.env, timeout=job.timeout,
                                in_scratch=job.in_scratch), f"starting {job.argv[0]}")
        return int(started.stdout.split()[0])

    def wait_listening(self, port: int, timeout: float) -> bool:
        """Whether something in the guest listens on TCP port within timeout."""
        return self.run(Job(["/bin/sh", "-c", f"until netstat -ltn | grep -q ':{port:d} '; "
                            "do usleep 20000; done"], timeout=timeout)).ok

    def signal_group(self, guest_pid: int, signal: str = "TERM") -> None:
        self.run(Job(["kill", f"-{signal}", f"-{guest_pid:d}"], timeout=30))


class JobUnanswered(TargetError):
    """A job that had to succeed gave no exit status: it outlived its timeout, or the
    guest stopped answering or died."""


class GuestLost(TargetError):
    """The guest's QEMU exited, closed the agent's channel, or (a nested KVM guest) its
    kernel stalled or it stayed silent past its boot timeout, before the agent was
    READY."""


class KernelStalled(Exception):
    """The guest's kernel reported a stall on its console (the line is the message)."""


class StallWatch:
    """A check_running for await_ready that also raises KernelStalled once the console
    shows a stall; it reads only what the console gained since its last call."""

    def __init__(self, console_log: Path, check_running: Callable[[], None]):
        self.console_log = console_log
        self.check_running = check_running
        self.seen = 0
        self.partial = b""   # the console's last line, while the kernel is still writing it

    def __call__(self) -> None:
        self.check_running()
        try:
            with open(self.console_log, "rb") as f:
                f.seek(self.seen)
                said = f.read()
        except OSError:
            return
        self.seen += len(said)
        lines = self.partial + said
        head, _, self.partial = lines.rpartition(b"\n")
        if (found := _STALL.search(head)) is not None:
            raise KernelStalled(found[0].decode(errors="replace").strip())


class AgentGuest(Instance):
    """An instance whose jobs run over a vmtax guest agent, whatever started its VMM: what
    every guest shares (vmtax.guest.vmm_guest's, which vmtax starts itself: QEMU,
    Firecracker, Cloud Hypervisor; and a libvirt domain). `session` is set once the agent
    is READY; `what` names the instance in errors. Its kind gives it `journal` (what undoes
    its host changes), `opts` (its target's memory, hugepages, boot_timeout) and, on a
    bridge, `net`; what it makes of them on the host (the agent's listening socket, huge
    pages for its RAM, a tap) is made and released here."""
    what = "guest"
    journal: "Journal"
    opts: Any

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.session: AgentSession | None = None
        self.nested_kvm = False   # a KVM guest in a lab: set while it boots
        self.net: Network | None = None
        self.tap: NetEndpoint | None = None
        self.host_hugepages_granted: int | None = None
        self._listener: socket.socket | None = None
        self._reservation: hugepages.Reservation | None = None

    def _listen(self, path: Path) -> socket.socket:
        """The socket the agent's channel connects to, listening before the guest starts."""
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(1)
        return self._listener

    def _reserve_hugepages(self) -> Path | None:
        """Host huge pages for guest RAM, before its VMM starts; the hugetlbfs to put it on."""
        self._reservation = hugepages.reserve_guest_ram(
            self.journal, self.name, parse_size(self.opts.memory), self.opts.hugepages)
        if self._reservation is None:
            return None
        self.host_hugepages_granted = self._reservation.granted
        return self._reservation.mountpoint

    def _release(self) -> None:
        """Once its VMM is gone: close the agent's channel and socket, free its huge pages,
        take its tap off the bridge."""
        for sock in (self.session.channel.sock if self.session else None, self._listener):
            if sock is not None:
                sock.close()
        if self._reservation is not None:   # the VMM is gone: its pages are free again
            self._reservation.release()
        if self.tap is not None and self.net is not None:
            self.net.detach(self.tap)
        self.session = self._listener = self._reservation = self.tap = None
        self.address = self.client_preexec = None

    @abc.abstractmethod
    def _start(self) -> None:
        """Boot the guest to agent READY and set `session`; what it makes is undone by
        stop(), also when it fails half-way."""

    def start(self) -> None:
        """Instance.start; in a lab, a guest lost while it boots is booted once more,
        saying so: a KVM nested under TCG's emulated AMD-V now and then loses an L2 guest
        early in its boot (CI runs' labs: the kernel's last line, then its QEMU gone; or
        its kernel's RCU stall, then nothing until the boot timed out at 300 s), which says
        nothing of the guest or of vmtax. So is a KVM guest whose setup after READY (its
        disks, its network) gets no answer (a CI run's lab: mounting the scratch disk
        outlived its 60 s). No number is measured while booting or setting up."""
        try:
            super().start()
        except (GuestLost, JobUnanswered) as exc:
            if not machine.lab() or (isinstance(exc, JobUnanswered) and not self.nested_kvm):
                raise
            print(f"vmtax: {exc}; booting it once more (in a lab)", file=sys.stderr)
            super().start()

    def _attach_tap(self, net: "Network | None") -> "NetEndpoint":
        """A tap on net for the guest's NIC, where host-side clients reach it."""
        if net is None:
            raise VmtaxError(f"{self.name}: a bridge network needs a vmtax network")
        tap = net.attach_tap()
        self.address, self.client_preexec = tap.address, net.client_preexec()
        return tap

    @abc.abstractmethod
    def _check_running(self) -> None:
        """Raise EOFError once its QEMU is gone."""

    @abc.abstractmethod
    def _boot_failure(self, exc: BaseException) -> str:
        """Why the boot failed (exc: what waiting for READY raised), in one line."""

    def _not_ready(self, exc: BaseException, exited: str | None, timeout: float) -> str:
        """What kept the agent from READY: its QEMU's exit (exited), a stall its kernel
        reported, or the boot's timeout."""
        if exited is not None:
            return exited
        if isinstance(exc, KernelStalled):
            return "its kernel stalled"
        # Slow is not stuck: a busy host, or a TCG guest made slower (tb_size, icount).
        return (f"no agent READY within {timeout:g} s; a guest this slow may only need "
                f"more time: boot_timeout = {2 * timeout:g} in the target's options")

    def _await_agent(self, listener: socket.socket, start: float, deadline: float,
                     console_log: Path, kvm: bool, host_margin: float = HOST_MARGIN
                     ) -> AgentSession:
        """Once QEMU started at `start` (monotonic): wait for the agent's READY, then set
        boot_seconds, guest_boot_seconds (the guest's own uptime: boot_seconds minus it is
        QEMU's share) and the session. A KVM guest (kvm) in a lab is given up as soon as
        its kernel reports a stall: a TCG guest's may be a slow host it outlives."""
        self.nested_kvm = kvm and bool(machine.lab())
        check = StallWatch(console_log, self._check_running) if self.nested_kvm \
            else self._check_running
        try:
            channel, self.guest_boot_seconds = await_ready(listener, deadline, check)
        except (EOFError, KernelStalled) as exc:
            raise GuestLost(self._boot_failure(exc)) from None
        except TimeoutError as exc:
            # A nested KVM guest silent past its boot timeout is lost, not slow: in one lab
            # a vm:kvm gave no READY within 300 s while three other L2s were READY in
            # 24-75 s. Elsewhere, slow is not stuck (the error says to give it more time).
            raise (GuestLost if self.nested_kvm else TargetError)(
                self._boot_failure(exc)) from None
        except OSError as exc:
            raise TargetError(self._boot_failure(exc)) from None
        channel.check = self._check_running   # jobs' stalls are theirs to report
        self.boot_seconds = time.monotonic() - start
        self.session = AgentSession(self.name, channel, console_log, self.kill, host_margin)
        return self.session

    @abc.abstractmethod
    def kill(self) -> None:
        """End the guest at once (a hung one)."""

    def _need_session(self) -> AgentSession:
        if self.session is None or not self.alive():
            raise TargetError(f"{self.name}: the {self.what} is not running; prepare it again")
        return self.session

    def run(self, job: Job) -> JobResult:
        return self._need_session().run(job)

    def spawn(self, job: Job) -> int:
        return self._need_session().spawn(job)

    def wait_listening(self, port: int, timeout: float) -> bool:
        return self._need_session().wait_listening(port, timeout)

    def signal_group(self, guest_pid: int, signal: str = "TERM") -> None:
        if self.alive() and self.session is not None:
            self.session.signal_group(guest_pid, signal)

    def start_with(self, job: Job | None) -> AgentGuest:
        """Start it running job in the background (a factory's copy of a target); stopped
        again when job cannot start."""
        self.start()
        if job is not None:
            try:
                self.spawn(job)
            except BaseException:
                self.stop()
                raise
        return self
