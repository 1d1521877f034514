"""One running QEMU guest: what QEMU supplies to a guest's life (vmtax.guest.vmm_guest),
its command line (vmtax.guest.qemu, from the target's resolved configuration), one QMP
connection kept for its lifetime (vCPU threads, pause and resume, quit), and QEMU's
user-mode network.

The host listens on a UNIX socket before QEMU starts; QEMU connects to it as the backend of
a named virtio-serial port (vmtax.guest.agent; kernel messages go to the serial console log).

Networks: "none"; "bridge", a tap on a vmtax network (vmtax.host.network) with the address that
network assigned, reached from the network's namespace; or "user", QEMU's user-mode network
(slirp), the fallback that needs no root, reached through ports forwarded on demand from the
host's loopback (`reach`), at several times the CPU cost per byte (see vmtax.host.network).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from vmtax.core.errors import TargetError
from vmtax.guest.qemu import NETDEV, USER_NET_GATEWAY, USER_NET_GUEST, VmConfig, qemu_argv
from vmtax.guest.vmm_guest import GuestFiles, GuestOptions, VmmGuest
from vmtax.host import proc
from vmtax.host.journal import Journal
from vmtax.host.trees import SERIAL as TREE_SERIAL

if TYPE_CHECKING:
    from vmtax.host.network import Endpoint as NetEndpoint
    from vmtax.host.network import Network

QMP_TIMEOUT = 5.0


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

    def execute(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
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


class VmInstance(VmmGuest):
    """One guest booted from a VM target's options; `start()` boots it to agent READY."""
    vmm_name = "QEMU"
    log_label = "qemu"

    def __init__(self, name: str, opts: GuestOptions, configure: Configure, journal: Journal,
                 work_dir: Path, network: str = "none", net: Network | None = None):
        super().__init__(name, opts, journal, work_dir, network, net)
        self.configure = configure
        self.config: VmConfig | None = None
        self._qmp: QmpSession | None = None
        self._forwards: set[int] = set()

    # -- what QEMU supplies --

    def _launch(self, files: GuestFiles) -> list[str]:
        self.config = self.configure(files.run_dir, files.disk,
                                     "none" if files.direct_io else "writeback",
                                     files.mem_path, files.network, files.tap)
        return qemu_argv(self.config)

    def _preexec(self, files: GuestFiles) -> Callable[[], None] | None:
        assert self.config is not None   # _launch made it
        return qemu_preexec(self.config, super()._preexec(files))

    def _started(self, files: GuestFiles) -> None:
        assert self.config is not None
        self._qmp = QmpSession(self.name, self.config.qmp_socket)

    def under_kvm(self) -> bool:
        return self.config is not None and self.config.accel == "kvm"

    def _setup_args(self) -> tuple[Any, ...]:
        assert self.config is not None
        address = (USER_NET_GUEST, USER_NET_GATEWAY) if self.network == "user" else None
        trees = tuple((TREE_SERIAL.format(i), mountpoint)
                      for i, (_, mountpoint) in enumerate(self.config.trees))
        return (super()._setup_args()[0] or address, self.config.disk_bus, trees)

    def _boot_hints(self) -> list[str]:
        if self.config is not None and self.config.icount and self.config.vcpus > 1:
            # Seen with QEMU 7.2 and Debian's 6.1 kernel: shift=0 hangs at "Booting SMP
            # configuration", shift=auto boots in 25 s instead of 3 s.
            return ["icount with several vCPUs can hang bringing up the second vCPU; "
                    "try vcpus = 1"]
        return []

    def _vcpu_threads(self) -> list[int]:
        cpus = self.qmp("query-cpus-fast")
        return [c["thread-id"] for c in sorted(cpus, key=lambda c: c["cpu-index"])]

    def _pause(self) -> None:
        self.qmp("stop")

    def _resume(self) -> None:
        self.qmp("cont")

    def _quit(self) -> None:
        self.qmp("quit")

    def _close(self) -> None:
        if self._qmp is not None:
            self._qmp.close()
        self._qmp = None
        self._forwards = set()

    # -- reaching its servers --

    def reach(self, port: int) -> tuple[str, int]:
        """A bridge's address, or a port forwarded from the host's loopback on the
        user-mode network."""
        if self.network == "user":
            host_port = _free_port()
            self.qmp("human-monitor-command", {"command-line": (
                f"hostfwd_add {NETDEV} tcp:127.0.0.1:{host_port}-:{port:d}")})
            self._forwards.add(host_port)
            return "127.0.0.1", host_port
        return super().reach(port)

    def unreach(self, host_port: int) -> None:
        if host_port in self._forwards and self.alive():
            self._forwards.discard(host_port)
            with contextlib.suppress(Exception):   # gone with a guest that was restarted
                self.qmp("human-monitor-command", {"command-line": (
                    f"hostfwd_remove {NETDEV} tcp:127.0.0.1:{host_port:d}")})

    # -- QMP --

    def qmp(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        """Run one QMP command on the running QEMU and return its result."""
        if self._qmp is None or not self.alive():
            raise TargetError(f"{self.name}: the guest is not running")
        return self._qmp.execute(command, arguments)
