"""One transient libvirt domain booted from vmtax's guest image, and everything it owns.

A `LibvirtInstance` is the domain (`virsh create`: transient, so destroying it leaves no
definition), a directory under /var/lib/libvirt/images where QEMU, run by libvirt as
libvirt-qemu, can read the copies of the kernel and initramfs and write the scratch disk,
huge pages reserved for its RAM, its tap on vmtax's bridge, and the agent's socket. Each is
journaled the moment before it exists and undone by `stop()`, or by the journal after
Ctrl-C or kill -9: QEMU's process first, then the domain, then the files.

The agent talks over the same virtio-serial port as under `vm`: the host listens on a UNIX
socket, QEMU connects to it (a channel of source mode "connect"). A tap of vmtax's bridge
lives in vmtax's network namespace, and libvirt opens taps by name in its own: the tap is
lent to the host's namespace while libvirt starts QEMU, then put back on the bridge (a tap
keeps working across namespaces; QEMU holds its file descriptor).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from vmtax.core.errors import TargetError, VmtaxError
from vmtax.guest.agent_session import AgentGuest, direct_io_works, make_scratch_disk, tail
from vmtax.host import machine, proc
from vmtax.host.journal import Journal
from vmtax.targets.libvirt.domain_xml import DomainSpec, domain_xml
from vmtax.targets.libvirt.nat import NatLease
from vmtax.targets.libvirt.virsh import (
    IMAGES,
    QEMU_LOGS,
    RUN_DIR,
    Virsh,
    hugetlbfs_hint,
    journal_domain,
    journal_host_tap,
    one_line,
)

if TYPE_CHECKING:
    from vmtax.host.network import Endpoint as NetEndpoint
    from vmtax.host.network import Network

# The domain's specification, from its files: (directory, disk, NIC) -> DomainSpec; the
# NIC is a tap on vmtax's bridge or a place on a libvirt NAT network.
Specify = Callable[[Path, "Path | None", "NetEndpoint | NatLease | None"], DomainSpec]
# Makes libvirt answer, told of the hugetlbfs mounts the domain's RAM goes on.
Connect = Callable[[tuple[Path, ...]], None]
# A place on the target's NAT network (which it starts with the first), once libvirt answers.
Lease = Callable[[], NatLease]


# libvirt's refusals -> the options (of the target's) whose value they are about.
_REFUSALS = (
    (re.compile(r"\bio\b|native I/O|aio|io_uring", re.I), ("disk_aio", "disk_cache")),
    (re.compile(r"cache mode|disk cache|\bcache\b", re.I), ("disk_cache",)),
    # An unknown machine type gets no PCI bus from libvirt 9.0's defaults.
    (re.compile(r"machine type|machine '|No PCI buses", re.I), ("machine",)),
    (re.compile(r"CPU model|\bcpu mode|host-passthrough|host-model|guest CPU", re.I), ("cpu",)),
    (re.compile(r"hugepage|hugetlbfs", re.I), ("hugepages",)),
    (re.compile(r"emulator|binary", re.I), ("emulator",)),
    (re.compile(r"vcpupin|cpuset|emulatorpin", re.I), ("pin",)),
    (re.compile(r"vcpu|maximum vcpus", re.I), ("vcpus",)),
    (re.compile(r"memory", re.I), ("memory",)),
    (re.compile(r"domain type|'kvm'|\bkvm\b", re.I), ("accel",)),
)


def refused_options(message: str) -> tuple[str, ...]:
    """The options a libvirt refusal is about (empty when it names none of them)."""
    for pattern, options in _REFUSALS:
        if pattern.search(message):
            return options
    return ()


class LibvirtInstance(AgentGuest):
    """One transient domain; `start()` boots it to agent READY."""
    what = "domain"

    def __init__(self, name: str, domain: str, opts: Any, specify: Specify,
                 connect: Connect, virsh: Virsh, journal: Journal, network: str = "none",
                 net: Network | None = None, lease: Lease | None = None):
        super().__init__(name)
        self.domain = domain
        self.opts = opts
        self.specify = specify
        self.connect = connect
        self.virsh = virsh
        self.journal = journal
        self.network = network            # "none" | "bridge" (a tap on `net`) | "nat"
        self.net = net
        self.lease = lease                 # with "nat"
        self.nat: NatLease | None = None
        self.spec: DomainSpec | None = None
        self.xml: str | None = None
        self.pid: int | None = None
        self.job_overhead: float | None = None
        self._dir: Path | None = None
        self._tokens: list[int] = []
        self._lent_tap: int | None = None

    # -- lifecycle --

    def _start(self) -> None:
        directory, token = self.journal.make_dir(IMAGES, f"{self.domain}-")
        self._tokens.append(token)
        self._dir = directory
        directory.chmod(0o711)   # libvirt-qemu opens the files inside by their names
        disk = directory / "scratch.img"
        self._make_disk(disk)
        pages = self._reserve_hugepages()
        if pages is not None:   # libvirt-qemu reaches the directory libvirt makes there
            pages.chmod(0o711)
        # After the pages: a libvirtd vmtax starts finds their hugetlbfs.
        self.connect((pages,) if pages is not None else ())
        if self.network == "bridge":
            self.tap = self._attach_tap(self.net)
        elif self.network == "nat":
            if self.lease is None:
                raise VmtaxError(f"{self.name}: a NAT network needs the target's network")
            self.nat = self.lease()
            self.address = self.nat.address   # the host reaches it on the network's bridge
        self.spec = spec = self.specify(directory, disk, self.tap or self.nat)
        self.xml = domain_xml(spec)
        xml_file = directory / "domain.xml"
        xml_file.write_text(self.xml)

        listener = self._listen(spec.agent_socket)
        if self.tap is not None:
            self._lend_tap(self.tap)
        start = time.monotonic()
        domain_token = journal_domain(self.journal, self.virsh.uri, self.domain)
        self._tokens.append(domain_token)
        done = self.virsh.call("create", str(xml_file))
        if done.timed_out or done.exit_code != 0:
            raise VmtaxError(self._refusal(done))
        self.pid = self._qemu_pid()
        if self.pid is not None:
            self.journal.update(domain_token, pid=self.pid,
                                start=proc.process_start_time(self.pid))
        if self.tap is not None:
            self._return_tap(self.tap)
        deadline = start + machine.lab_scaled(self.opts.boot_timeout)
        session = self._await_agent(listener, start, deadline, spec.console_log,
                                    spec.domain_type == "kvm")
        nic = self.tap or self.nat
        self.job_overhead = session.setup((nic.cidr, nic.gateway) if nic else None,
                                          spec.disk_bus)

    def _refusal(self, done: proc.Completed) -> str:
        if done.timed_out:
            return (f"{self.name}: libvirt at {self.virsh.uri} did not start the domain "
                    f"within {self.virsh.timeout:g} s")
        message = one_line(done.stderr or done.stdout)
        options = refused_options(message)
        named = (" (" + ", ".join(f"{o} = {getattr(self.opts, o, None)!r}" for o in options)
                 + ")") if options else ""
        hint = ("; " + hugetlbfs_hint(self.opts.hugepages)
                if "hugepages" in options and re.search("hugetlbfs", message, re.I) else "")
        return f"{self.name}: libvirt refused the domain{named}: {message}{hint}"

    def _make_disk(self, disk: Path) -> None:
        make_scratch_disk(disk, self.opts.disk_size)
        if self.opts.disk_cache in ("none", "directsync") and not direct_io_works(disk.parent):
            raise VmtaxError(f"{self.name}: disk_cache = {self.opts.disk_cache!r} opens the "
                             f"disk with O_DIRECT, which {disk.parent} refuses")

    def _lend_tap(self, tap: NetEndpoint) -> None:
        """Move the tap to the host's namespace, where libvirt opens it by name."""
        assert self.net is not None
        self._lent_tap = journal_host_tap(self.journal, tap.name)
        self._ip(["ip", "-n", self.net.name or "", "link", "set", tap.name, "netns", "1"])

    def _return_tap(self, tap: NetEndpoint) -> None:
        """Put the tap QEMU holds back on the bridge in vmtax's namespace."""
        assert self.net is not None and self._lent_tap is not None
        self._ip(["ip", "link", "set", tap.name, "netns", self.net.name or ""])
        self.journal.forget(self._lent_tap)
        self._lent_tap = None
        self._ip(["ip", "-n", self.net.name or "", "link", "set", tap.name, "master",
                  self.net.bridge, "up"])

    def _ip(self, argv: list[str]) -> None:
        done = proc.run(argv, timeout=30)
        if done.exit_code != 0:
            raise TargetError(f"{self.name}: {' '.join(argv)} failed: {done.stderr.strip()}")

    def _qemu_pid(self) -> int | None:
        """QEMU's pid, as libvirt writes it (root only)."""
        try:
            return int((RUN_DIR / "qemu" / f"{self.domain}.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _check_running(self) -> None:
        if not self.alive():
            raise EOFError("the domain's QEMU exited")

    def _boot_failure(self, exc: BaseException) -> str:
        assert self.spec is not None
        what = self._not_ready(exc, None if self.alive() else "its QEMU exited",
                               machine.lab_scaled(self.opts.boot_timeout))
        console = tail(self.spec.console_log)
        qemu_log = tail(QEMU_LOGS / f"{self.domain}.log", 3)
        return (f"{self.name}: domain {self.domain} failed to boot ({what}; {exc})"
                + (f"; qemu: {qemu_log}" if qemu_log else "")
                + (f"; console: {console}" if console else "; console: empty"))

    # -- state --

    def host_pids(self) -> list[int]:
        return [self.pid] if self.pid is not None and self.alive() else []

    def alive(self) -> bool:
        if self.pid is None:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def pause(self) -> None:
        # A suspended guest costs no host CPU while other targets are measured.
        if self.alive():
            self.virsh.call("suspend", self.domain)

    def resume(self) -> None:
        if self.alive() and self.virsh.call("resume", self.domain).exit_code != 0:
            self.kill()   # a guest that cannot be resumed is as good as hung

    def vcpu_threads(self) -> list[int]:
        """Host thread ids of the vCPUs, in vCPU order (QEMU's query-cpus-fast)."""
        out = self.virsh.must("qemu-monitor-command", self.domain,
                              '{"execute":"query-cpus-fast"}', what=self.name)
        cpus = json.loads(out)["return"]
        return [c["thread-id"] for c in sorted(cpus, key=lambda c: c["cpu-index"])]

    def kill(self) -> None:
        if self.alive():
            self.virsh.call("destroy", self.domain, timeout=30)
        if self.alive():
            assert self.pid is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, 9)

    def stop(self) -> None:
        self.kill()
        if self._lent_tap is not None:
            self.journal.undo(self._lent_tap)
        self._release()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        for token in reversed(self._tokens):   # the domain's: destroyed, its log removed
            self.journal.undo(token)
        self._dir = self.pid = self._lent_tap = self.nat = None
        self._tokens = []
