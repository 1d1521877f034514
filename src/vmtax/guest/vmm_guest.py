"""A guest whose VMM process vmtax starts itself, and everything it owns: the life every such
VMM (QEMU, Firecracker, Cloud Hypervisor) shares, so that a VMM supplies only how it is
started and driven (`VmmGuest`'s abstract methods: its command line, its API).

What a guest owns is journaled the moment before it exists and undone by `stop()`, or by
the journal after Ctrl-C or kill -9: a run directory in /tmp (UNIX socket paths are limited
to ~107 bytes: the agent's and the VMM's sockets, its console and logs), the scratch disk's
directory under the work dir (a real disk), host huge pages for guest RAM, a tap on a vmtax
network, and the VMM's process. The host listens for the agent before the VMM starts: the
VMM connects to that socket as a virtio-serial port's backend (QEMU), or the guest does
over vsock (Firecracker and Cloud Hypervisor proxy the guest's connection to it), so
nothing the agent says is lost and kernel messages never mix with the protocol.

A boot counts only once the agent is READY (vmtax.guest.agent_session): whatever the VMM's
exit status says, a guest that never reached its agent failed its boot (Firecracker exits
0 after its guest triple-faulted).

May import vmtax.core, vmtax.host and vmtax.guest's agent modules; nothing of a VMM.
"""

from __future__ import annotations

import abc
import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

from vmtax.core.errors import TargetError
from vmtax.core.types import Job
from vmtax.guest.agent_session import (
    HOST_MARGIN,
    AgentGuest,
    direct_io_works,
    make_scratch_disk,
    tail,
)
from vmtax.guest.qemu import parse_size
from vmtax.host import machine, proc
from vmtax.host.journal import Journal

if TYPE_CHECKING:
    from vmtax.host.network import Endpoint as NetEndpoint
    from vmtax.host.network import Network


class GuestOptions(Protocol):
    """What a guest reads of its target's options; the rest reaches its VMM's launch."""
    @property
    def memory(self) -> str: ...
    @property
    def disk_size(self) -> str: ...
    @property
    def boot_timeout(self) -> float: ...
    @property
    def hugepages(self) -> str | None: ...     # host huge pages backing its RAM ("2M", "1G")
    @property
    def guest_hugepages(self) -> int: ...      # 2 MiB pages its kernel reserves at boot
    @property
    def pin(self) -> list[int] | None: ...     # host CPU of each vCPU's thread


@dataclass(frozen=True)
class GuestFiles:
    """What a VMM's launch is given, made and journaled by the guest: where its files go,
    where the host listens for the agent, and the guest's devices."""
    run_dir: Path                 # the VMM's sockets, config and logs
    console_log: Path             # the guest's serial console
    agent_socket: Path            # the host listens here for the agent's channel
    disk: Path                    # the scratch disk (ext4)
    direct_io: bool               # the disk's directory takes O_DIRECT
    mem_path: Path | None         # a hugetlbfs for guest RAM (hugepages), else None
    network: str                  # "none" | "bridge" | "user" (QEMU only)
    tap: NetEndpoint | None       # the guest's NIC on a vmtax network ("bridge")


class VmmGuest(AgentGuest):
    """One guest booted by a VMM that vmtax starts; `start()` boots it to agent READY, sets
    it up (scratch disk, trees, network) and pins its vCPUs."""
    # The VMM, as messages name it, and its log's label in a failed boot's message.
    vmm_name: ClassVar[str] = "the VMM"
    log_label: ClassVar[str] = "vmm"

    def __init__(self, name: str, opts: GuestOptions, journal: Journal, work_dir: Path,
                 network: str = "none", net: Network | None = None):
        super().__init__(name)
        self.opts = opts
        self.guest_memory = parse_size(opts.memory)
        self.journal = journal
        self.work_dir = Path(work_dir)
        self.network = network          # "none" | "bridge" (then on `net`) | "user"
        self.net = net
        self.files: GuestFiles | None = None
        self.job_overhead: float | None = None
        self.boot_cpu_seconds: float | None = None
        self.guest_hugepages_granted: int | None = None
        self.vcpu_affinity: list[list[int]] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._tokens: list[int] = []
        self._dirs: list[Path] = []

    # -- what a VMM supplies -------------------------------------------------------------

    def _agent_socket(self, run_dir: Path) -> Path:
        """Where the host listens for the agent's channel (the VMM or the guest connects)."""
        return run_dir / "agent.sock"

    @abc.abstractmethod
    def _launch(self, files: GuestFiles) -> list[str]:
        """The VMM's argv for a guest of these files (a config file it reads may be written
        into files.run_dir first). Called once per boot; raises VmtaxError or TargetError
        for a configuration the VMM cannot run."""

    def _preexec(self, files: GuestFiles) -> Callable[[], None] | None:
        """What the VMM's process does before exec: by default, enter the guest network's
        namespace, where it finds its tap by name."""
        return self.net.preexec() if files.tap is not None and self.net is not None else None

    def _started(self, files: GuestFiles) -> None:
        """Once the VMM's process exists, before the agent is awaited (QEMU: its QMP)."""

    @abc.abstractmethod
    def under_kvm(self) -> bool:
        """Whether its vCPUs run under KVM (a nested lab gives such a guest up at a stall)."""

    @abc.abstractmethod
    def _vcpu_threads(self) -> list[int]:
        """Host thread ids of its vCPUs, in vCPU order; the VMM runs."""

    @abc.abstractmethod
    def _pause(self) -> None:
        """Stop its vCPUs (the VMM's API)."""

    @abc.abstractmethod
    def _resume(self) -> None:
        """Undo _pause()."""

    def _quit(self) -> None:
        """Ask the VMM to exit (its API) before it is killed; by default it is only killed."""

    def _stdout(self, files: GuestFiles) -> Path:
        """Where the VMM's standard output goes (a VMM whose serial console is its stdout:
        the console's log); its standard error goes to vmm.log."""
        return files.run_dir / "vmm.log"

    def _logs(self, files: GuestFiles) -> list[Path]:
        """The VMM's logs, whose last lines a failed boot's message quotes."""
        return [files.run_dir / "vmm.log"]

    def _boot_hints(self) -> list[str]:
        """What the user may try after a failed boot, beyond the kernel's messages."""
        return []

    # -- lifecycle -----------------------------------------------------------------------

    def _make_dir(self, parent: Path, prefix: str) -> Path:
        """A directory of this guest's, journaled before it is made: a kill between the
        two leaves nothing behind."""
        path, token = self.journal.make_dir(parent, prefix)
        self._tokens.append(token)
        self._dirs.append(path)
        return path

    def _start(self) -> None:
        run_dir = self._make_dir(Path(tempfile.gettempdir()), "vmtax-vm-")
        disk_dir = self._make_dir(self.work_dir, "vm-")
        mem_path = self._reserve_hugepages()
        if self.network == "bridge":
            self.tap = self._attach_tap(self.net)
        self.files = files = GuestFiles(
            run_dir=run_dir, console_log=run_dir / "console.log",
            agent_socket=self._agent_socket(run_dir), disk=disk_dir / "scratch.img",
            direct_io=direct_io_works(disk_dir), mem_path=mem_path, network=self.network,
            tap=self.tap)
        argv = self._launch(files)
        make_scratch_disk(files.disk, self.opts.disk_size)
        listener = self._listen(files.agent_socket)
        start = time.monotonic()
        with open(run_dir / "vmm.log", "ab") as log, open(files.console_log, "ab"), \
                open(self._stdout(files), "ab") as out:
            self._proc = proc.spawn(argv, preexec=self._preexec(files),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=log)
        self._tokens.append(self.journal.process(self._proc.pid))
        self._started(files)
        deadline = start + machine.lab_scaled(self.opts.boot_timeout)
        session = self._await_agent(listener, start, deadline, files.console_log,
                                    self.under_kvm(), HOST_MARGIN)
        # What the boot cost the VMM in CPU: comparable where wall time is shared (make bench).
        self.boot_cpu_seconds = proc.cpu_seconds(self._proc.pid)
        if self.opts.pin is not None:
            self._pin(self.opts.pin)
        self.job_overhead = session.setup(*self._setup_args())
        self._check_guest_hugepages()

    def _setup_args(self) -> tuple[Any, ...]:
        """AgentSession.setup's arguments: (address, disk bus, trees)."""
        address = (self.tap.cidr, self.tap.gateway) if self.tap is not None else None
        return (address,)

    def _check_guest_hugepages(self) -> None:
        """What the guest kernel really reserved (it grants fewer when memory is short)."""
        # A lab's guest answered `cat` later than 30 s at host load ~100.
        result = self.run(Job(["cat", "/proc/meminfo"], timeout=machine.lab_scaled(30)))
        found = re.search(r"^HugePages_Total:\s+(\d+)$", result.stdout, re.MULTILINE)
        if not result.ok or not found:
            why = ("timed out" if result.timed_out else
                   (result.stderr.strip() or f"exit status {result.exit_code}")[-200:])
            raise TargetError(f"{self.name}: no HugePages_Total in the guest's /proc/meminfo"
                              + ("" if result.ok else f" (cat: {why})"))
        self.guest_hugepages_granted = int(found[1])
        wanted = self.opts.guest_hugepages
        if self.guest_hugepages_granted < wanted:
            raise TargetError(f"{self.name}: the guest kernel reserved only "
                              f"{self.guest_hugepages_granted} of guest_hugepages = {wanted} "
                              f"2 MiB pages; give it more memory than {self.opts.memory}")

    def _pin(self, cpus: list[int]) -> None:
        """vCPU i's thread on host CPU cpus[i]; the VMM's other threads off those CPUs."""
        threads = self.vcpu_threads()
        if len(set(threads)) != len(threads):
            raise TargetError(f"{self.name}: {self.vmm_name} runs several vCPUs in one "
                              "thread (single-threaded TCG): they cannot be pinned apart")
        if len(threads) != len(cpus):
            raise TargetError(f"{self.name}: {self.vmm_name} has {len(threads)} vCPU "
                              f"threads for {len(cpus)} CPUs of pin")
        for tid, cpu in zip(threads, cpus):
            os.sched_setaffinity(tid, {cpu})
        # The main loop and I/O threads; threads the VMM starts later inherit the main
        # thread's affinity. With no CPU left over they stay where they are.
        rest = os.sched_getaffinity(0) - set(cpus)
        assert self._proc is not None   # vcpu_threads() found the guest alive
        if rest:
            for task in os.listdir(f"/proc/{self._proc.pid}/task"):
                if int(task) not in threads:
                    with contextlib.suppress(ProcessLookupError):   # a thread that just ended
                        os.sched_setaffinity(int(task), rest)
        self.vcpu_affinity = [sorted(os.sched_getaffinity(tid)) for tid in threads]

    def _check_running(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise EOFError(f"{self.vmm_name} exited")

    def _boot_failure(self, exc: BaseException) -> str:
        assert self.files is not None   # set before the VMM starts
        if isinstance(exc, EOFError) and self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):   # its channel went first
                self._proc.wait(2)
        code = self._proc.poll() if self._proc else None
        # Its exit status is no verdict on the boot (Firecracker exits 0 after a triple
        # fault): it is said, and the boot failed all the same.
        exited = None if code is None else f"{self.vmm_name} exited with status {code}"
        what = self._not_ready(exc, exited, machine.lab_scaled(self.opts.boot_timeout))
        said = " | ".join(filter(None, (tail(log, 3) for log in self._logs(self.files))))
        console = tail(self.files.console_log)
        # The kernel boots with `quiet`.
        hints = [] if console else ['kernel_args = "loglevel=7" shows the kernel\'s messages']
        hints += self._boot_hints()
        return (f"{self.name}: guest failed to boot ({what}; {exc})"
                + (f"; {self.log_label}: {said}" if said else "")
                + (f"; console: {console}" if console else "; console: empty")
                + "".join(f"; {hint}" for hint in hints))

    # -- reaching its servers --

    def reach(self, port: int) -> tuple[str, int]:
        """Where a host-side client finds the guest's TCP port: its own address on a bridge."""
        if self.network == "bridge" and self.address is not None:
            return self.address, port
        raise TargetError(f"{self.name}: the guest has no network (network = "
                          f"\"{self.network}\")")

    def unreach(self, host_port: int) -> None:
        """Undo what reach() set up for host_port (nothing on a bridge)."""

    # -- state --

    def host_pids(self) -> list[int]:
        return [self._proc.pid] if self.alive() and self._proc else []

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def vcpu_threads(self) -> list[int]:
        """Host thread ids of the guest's vCPUs, in vCPU order (for pinning)."""
        if not self.alive():
            raise TargetError(f"{self.name}: the guest is not running")
        return self._vcpu_threads()

    def pause(self) -> None:
        # A stopped guest costs no host CPU while other targets are measured (an idle TCG
        # guest takes 7-13% of a core); best effort: a hiccup must not end the plan.
        if self.alive():
            with contextlib.suppress(Exception):
                self._pause()

    def resume(self) -> None:
        if self.alive():
            try:
                self._resume()
            except Exception:   # a guest that cannot be resumed is as good as hung
                self.kill()

    def kill(self) -> None:
        # Only while the VMM runs: once reaped, its pid (= its group id) may be reused.
        if self._proc is not None and self._proc.poll() is None:
            proc.kill_group(self._proc)

    def _close(self) -> None:
        """Close what the VMM's API kept open (before its files go)."""

    def stop(self) -> None:
        if self.alive():
            try:
                self._quit()
                assert self._proc is not None
                self._proc.wait(timeout=QUIT_TIMEOUT)
            except Exception:   # a hung or half-started VMM is killed below either way
                pass
        self.kill()
        self._close()
        self._release()
        for directory in self._dirs:
            shutil.rmtree(directory, ignore_errors=True)
        for token in self._tokens:
            self.journal.forget(token)
        self._proc = None
        self._tokens, self._dirs = [], []


# How long a VMM asked to quit may take before it is killed.
QUIT_TIMEOUT = 5.0


def thread_ids(pid: int, name: re.Pattern[str], proc_root: Path = Path("/proc")) -> list[int]:
    """The ids of pid's threads whose name (comm) matches name, ordered by the number the
    pattern's first group captures: a VMM that names its vCPU threads ("fc_vcpu 0",
    "vcpu1") gives them in vCPU order."""
    found = []
    for task in (proc_root / str(pid) / "task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
        except OSError:   # a thread that just ended
            continue
        if (match := name.fullmatch(comm)) is not None:
            found.append((int(match[1]), int(task.name)))
    return [tid for _, tid in sorted(found)]
