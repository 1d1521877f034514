"""One running QEMU guest and everything it owns.

A `VmInstance` is the process, its run directory (sockets, logs) and scratch disk, the
huge pages reserved for its RAM, its network interface, one QMP connection kept for its
lifetime, and the agent channel; each is journaled the moment it exists and undone by
`stop()`. The host listens on a UNIX socket before QEMU starts; QEMU connects to it as the
backend of a named virtio-serial port, so nothing the agent says is lost and kernel messages
never mix with the protocol (vmtax.guest.agent; they go to the serial console log).

Networks: "none"; "bridge", a tap on a vmtax network (vmtax.host.network) with the address that
network assigned, reached from the network's namespace; or "user", QEMU's user-mode network
(slirp), the fallback that needs no root, reached through ports forwarded on demand from the
host's loopback (`reach`), at several times the CPU cost per byte (see vmtax.host.network).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from vmtax.core.errors import TargetError
from vmtax.core.types import Job
from vmtax.guest.agent_session import (
    HOST_MARGIN,
    AgentGuest,
    direct_io_works,
    make_scratch_disk,
    tail,
)
from vmtax.guest.qemu import (
    NETDEV,
    USER_NET_GATEWAY,
    USER_NET_GUEST,
    VmConfig,
    parse_size,
    qemu_argv,
)
from vmtax.host import hugepages, machine, proc
from vmtax.host.journal import Journal
from vmtax.host.trees import SERIAL as TREE_SERIAL

if TYPE_CHECKING:
    from vmtax.host.network import Endpoint as NetEndpoint
    from vmtax.host.network import Network

QMP_TIMEOUT = 5.0


class GuestOptions(Protocol):
    """What an instance reads of its target's options (vmtax.targets.vm.VmOptions); the
    rest reaches it in the QEMU configuration (`Configure`)."""
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


# Builds the instance's QEMU configuration once its files exist:
# (run_dir, disk, disk_cache, mem_path, network, tap) -> VmConfig.
Configure = Callable[[Path, Path, str, "Path | None", str, "NetEndpoint | None"], VmConfig]


def _free_port() -> int:
    """A TCP port on loopback nobody listens on now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- QMP ----------------------------------------------------------------------------------

class _QmpLoop:
    """One event loop thread for every guest's QMP connection: vmtax is synchronous,
    qemu.qmp is asyncio, and a connection must outlive any one call."""
    _loop: asyncio.AbstractEventLoop | None = None
    _lock = threading.Lock()

    @classmethod
    def call(cls, coro: Any, timeout: float) -> Any:
        with cls._lock:
            if cls._loop is None:
                cls._loop = asyncio.new_event_loop()
                threading.Thread(target=cls._loop.run_forever, name="vmtax-qmp",
                                 daemon=True).start()
        future = asyncio.run_coroutine_threadsafe(coro, cls._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise


class QmpSession:
    """The one QMP connection of a guest, opened on first use and kept until close()."""

    def __init__(self, name: str, path: Path):
        self.name = name
        self.path = str(path)
        self._client: Any = None

    def execute(self, command: str, arguments: dict | None = None) -> Any:
        from qemu.qmp import QMPClient  # asyncio machinery: only once a guest runs

        async def connect() -> Any:   # made on the loop it will live on
            client = QMPClient(self.name)
            await asyncio.wait_for(client.connect(self.path), QMP_TIMEOUT)
            return client

        if self._client is None:
            self._client = _QmpLoop.call(connect(), QMP_TIMEOUT + 1)
        return _QmpLoop.call(asyncio.wait_for(self._client.execute(command, arguments),
                                              QMP_TIMEOUT), QMP_TIMEOUT + 1)

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):   # QEMU may be gone already
                _QmpLoop.call(client.disconnect(), QMP_TIMEOUT)


# --- the instance -------------------------------------------------------------------------

def qemu_preexec(cfg: VmConfig, in_network: Callable[[], None] | None
                 ) -> Callable[[], None] | None:
    """What QEMU's process does before exec: enter the guest network's namespace; under TCG,
    go without transparent huge pages. QEMU asks for them on guest RAM, so the host zeroes
    2 MiB wherever the guest first touches a byte: measured here, 0.1 s of CPU per boot
    (a third of QEMU's part of it) and memory the guest never uses. TCG reaches guest RAM
    through its own software TLB, so it loses little by them; KVM, whose guests map RAM
    through the host's page tables, keeps them."""
    steps = [step for step in (in_network, proc.no_transparent_hugepages
                               if cfg.accel == "tcg" else None) if step is not None]
    if not steps:
        return None

    def run_steps() -> None:
        for step in steps:
            step()
    return run_steps


class VmInstance(AgentGuest):
    """One guest booted from a VM target's options; `start()` boots it to agent READY."""

    def __init__(self, name: str, opts: GuestOptions, configure: Configure, journal: Journal,
                 work_dir: Path, network: str = "none", net: Network | None = None):
        super().__init__(name)
        self.opts = opts
        self.configure = configure
        self.journal = journal
        self.work_dir = Path(work_dir)
        self.network = network          # "none" | "user" | "bridge" (then on `net`)
        self.net = net
        self.config: VmConfig | None = None
        self.job_overhead: float | None = None
        self.boot_cpu_seconds: float | None = None
        self.host_hugepages_granted: int | None = None
        self.guest_hugepages_granted: int | None = None
        self.vcpu_affinity: list[list[int]] | None = None
        self.tap: NetEndpoint | None = None
        self._proc: subprocess.Popen | None = None
        self._listener: socket.socket | None = None
        self._qmp: QmpSession | None = None
        self._tokens: list[int] = []
        self._dirs: list[Path] = []
        self._reservation: hugepages.Reservation | None = None
        self._forwards: set[int] = set()

    # -- lifecycle --

    def _make_dir(self, parent: Path, prefix: str) -> Path:
        """A directory of this instance's, journaled before it is made: a kill between the
        two leaves nothing behind."""
        path, token = self.journal.make_dir(parent, prefix)
        self._tokens.append(token)
        self._dirs.append(path)
        return path

    def _start(self) -> None:
        # Sockets live in a short /tmp path (UNIX socket paths are limited to ~107 bytes);
        # the disk under the work dir, which is on a real disk.
        run_dir = self._make_dir(Path(tempfile.gettempdir()), "vmtax-vm-")
        disk_dir = self._make_dir(self.work_dir, "vm-")
        disk = disk_dir / "scratch.img"
        mem_path = self._reserve_hugepages()
        in_network = None
        if self.network == "bridge":
            self.tap = self._attach_tap(self.net)
            assert self.net is not None
            in_network = self.net.preexec()   # QEMU finds its tap by name, in the namespace
        self.config = cfg = self.configure(
            run_dir, disk, "none" if direct_io_works(disk_dir) else "writeback", mem_path,
            self.network, self.tap)
        preexec = qemu_preexec(cfg, in_network)
        make_scratch_disk(disk, self.opts.disk_size)

        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(cfg.agent_socket))
        self._listener.listen(1)
        qemu_log = open(run_dir / "qemu.log", "wb")
        start = time.monotonic()
        with qemu_log:
            self._proc = proc.spawn(qemu_argv(cfg), preexec=preexec, stdin=subprocess.DEVNULL,
                                    stdout=qemu_log, stderr=qemu_log)
        self._tokens.append(self.journal.process(self._proc.pid))
        self._qmp = QmpSession(self.name, cfg.qmp_socket)
        deadline = start + machine.lab_scaled(self.opts.boot_timeout)
        session = self._await_agent(self._listener, start, deadline, cfg.console_log,
                                    cfg.accel == "kvm", HOST_MARGIN)
        # What the boot cost QEMU in CPU: comparable where wall time is shared (make bench).
        self.boot_cpu_seconds = proc.cpu_seconds(self._proc.pid)
        if self.opts.pin is not None:
            self._pin(self.opts.pin)
        address = ((self.tap.cidr, self.tap.gateway) if self.tap is not None
                   else (USER_NET_GUEST, USER_NET_GATEWAY) if self.network == "user" else None)
        trees = tuple((TREE_SERIAL.format(i), mountpoint)
                      for i, (_, mountpoint) in enumerate(cfg.trees))
        self.job_overhead = session.setup(address, cfg.disk_bus, trees)
        self._check_guest_hugepages()

    def _reserve_hugepages(self) -> Path | None:
        """Host huge pages for guest RAM, before QEMU starts; the hugetlbfs to put it on."""
        self._reservation = hugepages.reserve_guest_ram(
            self.journal, self.name, parse_size(self.opts.memory), self.opts.hugepages)
        if self._reservation is None:
            return None
        self.host_hugepages_granted = self._reservation.granted
        return self._reservation.mountpoint

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
        """vCPU i's thread on host CPU cpus[i]; QEMU's other threads off those CPUs."""
        threads = self.vcpu_threads()
        if len(set(threads)) != len(threads):
            raise TargetError(f"{self.name}: QEMU runs several vCPUs in one thread "
                              "(single-threaded TCG): they cannot be pinned apart")
        for tid, cpu in zip(threads, cpus):
            os.sched_setaffinity(tid, {cpu})
        # The main loop and I/O threads; threads QEMU starts later inherit the main thread's
        # affinity. With no CPU left over they stay where they are.
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
            raise EOFError("QEMU exited")

    def _boot_failure(self, exc: BaseException) -> str:
        assert self.config is not None   # set before QEMU starts
        run_dir = self.config.console_log.parent
        if isinstance(exc, EOFError) and self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):   # its channel went first
                self._proc.wait(2)
        code = self._proc.poll() if self._proc else None
        what = self._not_ready(exc, None if code is None else f"QEMU exited with status {code}",
                               machine.lab_scaled(self.opts.boot_timeout))
        details = tail(run_dir / "qemu.log", 3)
        console = tail(self.config.console_log)
        hints = []
        if not console:   # the kernel boots with `quiet`
            hints.append('kernel_args = "loglevel=7" shows the kernel\'s messages')
        if self.config.icount and self.config.vcpus > 1:
            # Seen with QEMU 7.2 and Debian's 6.1 kernel: shift=0 hangs at "Booting SMP
            # configuration", shift=auto boots in 25 s instead of 3 s.
            hints.append("icount with several vCPUs can hang bringing up the second vCPU; "
                         "try vcpus = 1")
        return (f"{self.name}: guest failed to boot ({what}; {exc})"
                + (f"; qemu: {details}" if details else "")
                + (f"; console: {console}" if console else "; console: empty")
                + "".join(f"; {hint}" for hint in hints))

    # -- reaching its servers --

    def reach(self, port: int) -> tuple[str, int]:
        """Where a host-side client finds the guest's TCP port: the guest's own address on a
        bridge, or a port forwarded from the host's loopback on the user-mode network."""
        if self.network == "bridge" and self.address is not None:
            return self.address, port
        if self.network == "user":
            host_port = _free_port()
            self.qmp("human-monitor-command", {"command-line": (
                f"hostfwd_add {NETDEV} tcp:127.0.0.1:{host_port}-:{port:d}")})
            self._forwards.add(host_port)
            return "127.0.0.1", host_port
        raise TargetError(f"{self.name}: the guest has no network (network = "
                          f"\"{self.network}\")")

    def unreach(self, host_port: int) -> None:
        if host_port in self._forwards and self.alive():
            self._forwards.discard(host_port)
            with contextlib.suppress(Exception):   # gone with a guest that was restarted
                self.qmp("human-monitor-command", {"command-line": (
                    f"hostfwd_remove {NETDEV} tcp:127.0.0.1:{host_port:d}")})

    # -- state --

    def host_pids(self) -> list[int]:
        return [self._proc.pid] if self.alive() and self._proc else []

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def pause(self) -> None:
        # A stopped guest costs no host CPU while other targets are measured (an idle TCG
        # guest takes 7-13% of a core); best effort: a QMP hiccup must not end the plan.
        if self.alive():
            with contextlib.suppress(Exception):
                self.qmp("stop")

    def resume(self) -> None:
        if self.alive():
            try:
                self.qmp("cont")
            except Exception:   # a guest that cannot be resumed is as good as hung
                self.kill()

    def kill(self) -> None:
        # Only while QEMU runs: once reaped, its pid (= its group id) may be reused.
        if self._proc is not None and self._proc.poll() is None:
            proc.kill_group(self._proc)

    def stop(self) -> None:
        if self.alive():
            try:
                self.qmp("quit")
                assert self._proc is not None
                self._proc.wait(timeout=QMP_TIMEOUT)
            except Exception:   # a hung or half-started QEMU is killed below either way
                pass
        self.kill()
        if self._qmp is not None:
            self._qmp.close()
        for sock in (self.session.channel.sock if self.session else None, self._listener):
            if sock is not None:
                sock.close()
        if self._reservation is not None:   # QEMU is gone: its pages are free again
            self._reservation.release()
        if self.tap is not None and self.net is not None:
            self.net.detach(self.tap)
        for directory in self._dirs:
            shutil.rmtree(directory, ignore_errors=True)
        for token in self._tokens:
            self.journal.forget(token)
        self._proc = self.session = self._listener = self._qmp = None
        self._reservation = self.tap = None
        self._tokens, self._dirs, self._forwards = [], [], set()
        self.address = self.client_preexec = None

    # -- QMP --

    def qmp(self, command: str, arguments: dict | None = None) -> Any:
        """Run one QMP command on the running QEMU and return its result."""
        if self._qmp is None or not self.alive():
            raise TargetError(f"{self.name}: the guest is not running")
        return self._qmp.execute(command, arguments)

    def vcpu_threads(self) -> list[int]:
        """Host thread ids of the guest's vCPUs, in vCPU order (for pinning)."""
        if not self.alive():
            raise TargetError(f"{self.name}: the guest is not running")
        cpus = self.qmp("query-cpus-fast")
        return [c["thread-id"] for c in sorted(cpus, key=lambda c: c["cpu-index"])]
