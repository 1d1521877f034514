"""A QEMU guest: boots the vmtax guest image and runs jobs through the in-guest agent.

The host listens on a UNIX socket before QEMU starts; QEMU connects to it as the backend of a
named virtio-serial port, so nothing the agent says is lost and kernel messages never mix
with the protocol (they go to the serial console log). QMP is used to stop QEMU in order and
to find its vCPU threads, which are pinned to host CPUs when asked.

Huge pages, E5's two sides: `hugepages` backs guest RAM with host huge pages (a hugetlbfs
file, reserved by vmtax.hugepages before QEMU starts), `guest_hugepages` has the guest kernel
reserve 2 MiB pages at boot for the workload (sysbench --memory-hugetlb allocates them with
shmget(SHM_HUGETLB), which needs no hugetlbfs mount in the guest). What was granted on
each side is in the fingerprint.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import os
import re
import select
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, cast

from vmtax import host, hugepages, plugin, proc
from vmtax.errors import TargetError, VmtaxError
from vmtax.image import AGENT_PORT, GuestImage
from vmtax.option_types import (ExistingFile, HostCpus, NonEmpty, Program, Programs, Seconds,
                                Size)
from vmtax.targets.base import Target, TargetContext
from vmtax.types import Endpoint, Job, JobResult

# Host-side grace beyond a job's own timeout before the guest is declared hung: the agent
# kills the job at its timeout itself, this covers decoding and sending the output back.
HOST_MARGIN = 15.0
QMP_TIMEOUT = 5.0
DISK_DEVICE = "/dev/vda"
SCRATCH = "/work"
_SIZE = re.compile(r"(\d+)([KMGT]?)(?:i?B)?", re.IGNORECASE)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Tokens made only of these characters reach the guest shell unencoded: it never splits
# them (no whitespace) or expands them (no quotes, $, globs, backslashes).
_PLAIN = re.compile(r"[A-Za-z0-9_./=:,+-]+")


# --- host facts ---------------------------------------------------------------------------

@functools.cache
def host_tsc_khz() -> int | None:
    """Guests see the host TSC rate under TCG and KVM alike; telling the guest
    (tsc_early_khz) avoids its TSC calibration, which hangs microvm boots on a busy host."""
    return host.tsc_khz()


def parse_size(text: str) -> int:
    """"4G" -> bytes (binary units, as QEMU reads them)."""
    m = _SIZE.fullmatch(str(text).strip())
    if not m:
        raise VmtaxError(f"bad size {text!r}: use a number with an optional K, M, G or T suffix")
    return int(m.group(1)) << (10 * " KMGT".index(m.group(2).upper() or " "))


def resolve_accel(accel: str) -> str:
    """"auto" | "kvm" | "tcg" -> the accelerator to use, "kvm" only when KVM really runs guests."""
    if accel == "tcg":
        return "tcg"
    if accel not in ("auto", "kvm"):
        raise VmtaxError(f"unknown accel {accel!r}: use auto, kvm or tcg")
    from vmtax import kvm   # probing runs a tiny vCPU: only when asked
    status = kvm.probe()
    if status.usable:
        return "kvm"
    if accel == "kvm":
        raise VmtaxError(f"--accel kvm: {status.reason}; use --accel tcg or auto")
    return "tcg"


def find_qemu(qemu: str) -> str:
    found = shutil.which(qemu)
    if found is None:
        raise VmtaxError(f"QEMU binary {qemu!r} not found; install qemu-system-x86 "
                         "(apt-get install qemu-system-x86) or pass the path of a QEMU build")
    return found


# --- QEMU command line --------------------------------------------------------------------

@dataclass(frozen=True)
class VmConfig:
    """Everything that decides QEMU's command line, already resolved."""
    qemu: str
    accel: str                 # "kvm" | "tcg"
    machine: str               # "microvm" | "q35"
    cpu: str
    vcpus: int
    memory: str
    kernel: Path
    initramfs: Path
    append: str
    agent_socket: Path
    qmp_socket: Path
    console_log: Path
    disk: Path | None = None
    disk_cache: str = "none"
    icount: str | None = None   # TCG only: guest time from the instruction count
    hugepages: str | None = None   # host huge page size backing guest RAM ("2M", "1G")
    mem_path: Path | None = None   # the hugetlbfs directory QEMU puts guest RAM in
    network: str = "none"          # "user": a virtio-net NIC on QEMU's user-mode network


MACHINES = {
    # No option ROMs: the PVH kernel is entered directly. (rtc=off would cost two 1 s waits:
    # the kernel retries reading a missing CMOS clock.)
    "microvm": "microvm,x-option-roms=off",
    "q35": "q35",
}


def transport(machine: str) -> str:
    """How virtio devices attach: "mmio" on microvm, "pci" on q35."""
    return "mmio" if machine == "microvm" else "pci"


# Boot-time work these skip, measured under TCG on a 2-core host (each was 0.1-1 s):
#   tsc=reliable      without invariant-TSC CPUID bits (TCG's max CPU) the kernel distrusts the
#                     TSC and falls back to the jiffies clocksource: slow boot, 4 ms clock.
#   lpj=              skips the delay-loop calibration of every secondary CPU.
#   no_timer_check    skips the IO-APIC timer check, which waits for ticks.
#   cryptomgr.notests, initcall_blacklist=crypto_kdf108_init
#                     skip crypto self-tests (the KDF one runs even with notests).
#   rodata=off        skips write-protecting kernel data and the W+X page-table walk
#                     (no effect on workloads; the guest is disposable).
BOOT_SPEEDUPS = ("tsc=reliable", "no_timer_check", "cryptomgr.notests",
                 "initcall_blacklist=crypto_kdf108_init", "rodata=off")


def kernel_cmdline(machine: str, tsc_khz: int | None, hz: int | None = None,
                   guest_hugepages: int = 0, extra: str | None = None) -> str:
    args = ["console=ttyS0", "quiet", "panic=-1", f"vmtax.bus={transport(machine)}",
            *BOOT_SPEEDUPS]
    if tsc_khz:
        if hz:   # the delay loop counts TSC cycles: TSC cycles per tick
            args.append(f"lpj={tsc_khz * 1000 // hz}")
        if machine == "microvm":
            args.append(f"tsc_early_khz={tsc_khz}")
    if guest_hugepages:
        # Reserved at boot, before guest memory fragments; the default size on x86 is 2 MiB.
        args.append(f"hugepages={guest_hugepages}")
    if extra:
        args.append(extra.strip())
    return " ".join(args)


def _opt(path: Path) -> str:
    """A path inside a QEMU option string, where a comma must be doubled."""
    return str(path).replace(",", ",,")


def _accel_args(cfg: VmConfig) -> list[str]:
    if cfg.accel == "kvm":
        return ["-accel", "kvm"]
    if cfg.icount:   # icount needs single-threaded TCG
        return ["-accel", "tcg", "-icount", cfg.icount]
    return ["-accel", "tcg,thread=multi"]


RAM_ID = "ram"
NETDEV = "net0"
# QEMU's user-mode network: the guest's address and its gateway (slirp's defaults).
USER_NET_GUEST, USER_NET_GATEWAY = "10.0.2.15/24", "10.0.2.2"


def _machine_args(cfg: VmConfig) -> list[str]:
    # memory-backend= (QEMU >= 5.0) works on microvm and q35 alike, without a NUMA node.
    machine = MACHINES[cfg.machine] + (f",memory-backend={RAM_ID}" if cfg.hugepages else "")
    return ["-machine", machine, "-cpu", cfg.cpu, "-smp", str(cfg.vcpus)]


def _memory_args(cfg: VmConfig) -> list[str]:
    if not cfg.hugepages:
        return ["-m", cfg.memory]
    if cfg.mem_path is None:
        raise VmtaxError(f"hugepages = {cfg.hugepages} without a hugetlbfs for guest RAM")
    # prealloc: every page is taken at start, so a short pool fails QEMU at once instead of
    # killing the guest on a fault mid-run. share=off: nothing but QEMU maps guest RAM.
    return ["-m", cfg.memory, "-object",
            f"memory-backend-file,id={RAM_ID},size={cfg.memory},"
            f"mem-path={_opt(cfg.mem_path)},prealloc=on,share=off"]


def _boot_args(cfg: VmConfig) -> list[str]:
    return ["-kernel", str(cfg.kernel), "-initrd", str(cfg.initramfs), "-append", cfg.append]


def _device_args(cfg: VmConfig) -> list[str]:
    suffix = "device" if transport(cfg.machine) == "mmio" else "pci"
    args = ["-chardev", f"file,id=console,path={_opt(cfg.console_log)}",
            "-serial", "chardev:console",
            "-chardev", f"socket,id=agent,path={_opt(cfg.agent_socket)}",
            "-device", f"virtio-serial-{suffix},id=vser",
            "-device", f"virtserialport,bus=vser.0,chardev=agent,name={AGENT_PORT}"]
    if cfg.disk is not None:
        args += ["-drive", f"if=none,id=scratch,format=raw,file={_opt(cfg.disk)},"
                 f"cache={cfg.disk_cache}", "-device", f"virtio-blk-{suffix},drive=scratch"]
    if cfg.network == "user":
        # Ports are forwarded to the guest on demand (QMP hostfwd_add), when a server starts.
        args += ["-netdev", f"user,id={NETDEV}", "-device", f"virtio-net-{suffix},netdev={NETDEV}"]
    return args


def qemu_argv(cfg: VmConfig) -> list[str]:
    """QEMU's exact argv for cfg; one helper per concern so memory backends (huge pages) and
    CPU placement can be added to theirs without touching the rest."""
    return [cfg.qemu, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            *_accel_args(cfg), *_machine_args(cfg), *_memory_args(cfg), *_boot_args(cfg),
            *_device_args(cfg), "-qmp", f"unix:{_opt(cfg.qmp_socket)},server=on,wait=off"]


# --- agent protocol -----------------------------------------------------------------------

def encode_token(text: str) -> str:
    if _PLAIN.fullmatch(text):
        return "p:" + text
    return "b:" + base64.b64encode(text.encode()).decode()


def encode_job(job_id: int, job: Job) -> bytes:
    """One line: JOB <id> <timeout> <scratch> <n_env> <env tokens> <argv tokens>."""
    if not job.argv:
        raise VmtaxError("a job needs a command")
    for name in job.env:
        if not _ENV_NAME.fullmatch(name):
            raise VmtaxError(f"bad environment variable name {name!r}")
    tokens = [encode_token(f"{k}={v}") for k, v in job.env.items()]
    tokens += [encode_token(a) for a in job.argv]
    timeout = max(job.timeout, 0.001)
    return (f"JOB {job_id} {timeout:.3f} {int(job.in_scratch)} {len(job.env)} "
            + " ".join(tokens) + "\n").encode()


@dataclass
class AgentResult:
    exit_code: int
    timed_out: bool
    elapsed_ns: int
    stdout: bytes
    stderr: bytes


class Channel:
    """Buffered, deadline-bound reads from the agent socket. `check` is called while
    waiting, to give up early when QEMU is gone."""

    def __init__(self, sock: socket.socket, check: Callable[[], None] | None = None):
        self.sock = sock
        self.check = check
        self.buf = bytearray()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> None:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no answer from the guest agent")
            ready, _, _ = select.select([self.sock], [], [], min(remaining, 0.2))
            if ready:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise EOFError("the guest agent closed its channel")
                self.buf += data
                return
            if self.check is not None:
                self.check()

    def readline(self, deadline: float) -> bytes:
        while (end := self.buf.find(b"\n")) < 0:
            self._fill(deadline)
        line = bytes(self.buf[:end])
        del self.buf[:end + 1]
        return line

    def read_exact(self, n: int, deadline: float) -> bytes:
        while len(self.buf) < n:
            self._fill(deadline)
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data


def read_result(channel: Channel, job_id: int, deadline: float) -> AgentResult:
    """The agent's answer to job_id: a RESULT header, then exactly the announced bytes."""
    while True:
        line = channel.readline(deadline).decode(errors="replace")
        fields = line.split()
        if len(fields) != 7 or fields[0] != "RESULT":
            raise TargetError(f"guest agent protocol error: unexpected line {line[:200]!r}")
        rid, status, timed_out, elapsed, n_out, n_err = (int(f) for f in fields[1:])
        stdout = channel.read_exact(n_out, deadline)
        stderr = channel.read_exact(n_err, deadline)
        if rid == job_id:   # an older job's late answer is skipped whole
            return AgentResult(status, timed_out == 1, elapsed, stdout, stderr)


# --- options that depend on each other ----------------------------------------------------

# What a guest needs beside the huge pages it reserves: kernel, the initramfs rootfs (held
# in RAM), sysbench's own buffers when it does not use huge pages.
GUEST_MIN_FREE = 256 << 20


class VmOptions(plugin.Options):
    qemu: Program = plugin.option(
        "qemu-system-x86_64", "QEMU binary (any build); --qemu LABEL=PATH, repeated, "
        "measures several builds side by side as vm@LABEL", cli=True)
    accel: Literal["auto", "kvm", "tcg"] = plugin.option(
        "auto", "Acceleration; auto uses KVM only where it really runs a vCPU", cli=True)
    machine: Literal["microvm", "q35"] = plugin.option("microvm", "QEMU machine type", cli=True)
    vcpus: int = plugin.option(2, "Virtual CPUs", unit="vCPUs", ge=1, cli=True)
    memory: Size = plugin.option("1G", "Guest memory", unit="bytes", cli=True)
    cpu: NonEmpty | None = plugin.option(None, "QEMU CPU model; none: host under KVM, "
                                         "max under TCG")
    kernel: ExistingFile | None = plugin.option(
        None, "Guest kernel (vmlinux or bzImage); none: Debian's linux-image-amd64", cli=True)
    disk_size: Size = plugin.option("4G", "Scratch disk (ext4 on virtio-blk) for "
                                    "workloads that write files", unit="bytes")
    boot_timeout: Seconds = plugin.option(60.0, "Give up on a boot after this long",
                                          unit="s")
    binaries: Programs = plugin.option(
        [], "Host programs to carry into the guest beside those the workloads need")
    # TCG's -icount (e.g. "shift=0,sleep=off"): guest time then follows the instruction
    # count, not the host clock — a deliberately skewed guest clock.
    icount: NonEmpty | None = plugin.option(None, "TCG only: QEMU -icount (guest time "
                                            "from the instruction count)")
    hugepages: Literal["2M", "1G"] | None = plugin.option(
        None, "Back guest RAM with host huge pages of this size (reserved for the run)")
    guest_hugepages: int = plugin.option(0, "2 MiB huge pages the guest kernel reserves at "
                                         "boot", unit="pages", ge=0)
    pin: HostCpus | None = plugin.option(None, "Host CPU of each vCPU's thread, in vCPU "
                                         "order; none: the host scheduler decides")
    # After vmtax's own, so one of them given again wins (e.g. "mitigations=off", or a
    # wrong tsc_early_khz for a deliberately skewed clock).
    kernel_args: NonEmpty | None = plugin.option(
        None, "Extra guest kernel arguments, after vmtax's own", cli=True)
    network: Literal["auto", "none", "user"] = plugin.option(
        "auto", "The guest's network for servers a host-side client reaches: user is "
        "QEMU's user-mode network (slirp; simple, about 0.8 Gbit/s here); auto gives one "
        "only to guests of plans with client-server workloads")

    def problems(self) -> list[tuple[str, str]]:
        problems = []
        memory = parse_size(self.memory)
        host_memory = hugepages.meminfo().get("MemTotal", 0) << 10
        if host_memory and memory > host_memory:
            problems.append(("memory", "at most the host's memory "
                             f"({hugepages.human(host_memory)})"))
        size = self.hugepages
        if size is not None and memory % hugepages.SIZES[size]:
            problems.append(("memory", f"a whole number of {hugepages.label(size)} huge pages "
                                       f'(hugepages = "{size}")'))
        most = max(0, (memory - GUEST_MIN_FREE) // hugepages.GUEST_PAGE)
        if self.guest_hugepages > most:
            problems.append(("guest_hugepages", f"at most {most} 2 MiB pages, which leaves the "
                             f"guest {GUEST_MIN_FREE >> 20} MiB of its memory "
                             f"({self.memory}); or more memory"))
        if self.pin is not None:
            if len(self.pin) != self.vcpus:
                problems.append(("pin", f"one host CPU per vCPU (vcpus = {self.vcpus})"))
            elif self.icount and self.vcpus > 1:
                problems.append(("pin", "no pinning of several vCPUs with icount (TCG then "
                                        "runs them all in one thread)"))
        return problems


# --- the target ---------------------------------------------------------------------------

def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:]
                      if line.strip())


def _free_port() -> int:
    """A TCP port on loopback nobody listens on now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _direct_io_works(directory: Path) -> bool:
    """cache=none opens the disk with O_DIRECT, which some filesystems (tmpfs) refuse."""
    probe = directory / ".direct-io-probe"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600)
    except OSError:
        return False
    os.close(fd)
    probe.unlink()
    return True


@dataclass
class _Running:
    """What one boot created; cleanup tears it down."""
    proc: subprocess.Popen | None = None
    channel: Channel | None = None
    listener: socket.socket | None = None
    tokens: list[int] = field(default_factory=list)
    dirs: list[Path] = field(default_factory=list)
    reservation: hugepages.Reservation | None = None
    net_up: bool = False


class VmTarget(Target):
    kind = "vm"
    name = "vm"
    description = ("A QEMU guest (KVM or TCG, any QEMU build) booting Debian's kernel "
                   "straight into a busybox agent that runs jobs over virtio-serial")
    Options = VmOptions
    variant_option = "accel"
    # QEMU, and what building the guest's kernel, initramfs and scratch disk takes.
    packages = ("qemu-system-x86", "qemu-utils", "e2fsprogs", "kmod", "cpio", "xz-utils")
    # Boot to agent ready under TCG, then calibration (measured: 2-5 s here).
    startup_seconds = 5.0

    @classmethod
    def unavailable(cls) -> str | None:
        try:
            find_qemu(plugin.option_infos(VmOptions)["qemu"].default)
        except VmtaxError as exc:
            return str(exc)
        return None

    @classmethod
    def variants(cls) -> dict[str, str | None]:
        from vmtax import kvm   # probing runs a tiny vCPU: only when asked
        status = kvm.probe()
        return {"kvm": None if status.usable else status.reason, "tcg": None, "auto": None}

    @classmethod
    def host_hugepages(cls, options: plugin.Options) -> dict[str, int]:
        opts: VmOptions = options  # type: ignore[assignment]
        if opts.hugepages is None:
            return {}
        return {opts.hugepages: hugepages.pages_needed(parse_size(opts.memory), opts.hugepages)}

    @classmethod
    def workload_hugepages(cls, options: plugin.Options) -> int | None:
        return options.guest_hugepages  # type: ignore[attr-defined, no-any-return]

    def __init__(self, name: str, options: plugin.Options, ctx: TargetContext):
        super().__init__(name, options, ctx)
        self.opts: VmOptions = options  # type: ignore[assignment]
        self.boot_seconds: float | None = None
        self.guest_boot_seconds: float | None = None
        self.config: VmConfig | None = None
        self._run = _Running()
        self._job_ids = 0
        self._qemu_version: str | None = None
        self.host_margin = HOST_MARGIN
        self.job_overhead: float | None = None
        self.host_hugepages_granted: int | None = None
        self.guest_hugepages_granted: int | None = None
        self.vcpu_affinity: list[list[int]] | None = None

    # -- configuration --

    def image(self) -> GuestImage:
        """The shared image of this invocation, unless this target wants another kernel."""
        def same(a, b) -> bool:
            return (a is None) == (b is None) and (a is None or Path(a) == Path(b))

        image = self.ctx.image
        if image is None or not same(image.kernel_arg, self.opts.kernel):
            image = GuestImage([*self.ctx.binaries, *self.opts.binaries], self.opts.kernel)
            if self.ctx.image is None:
                self.ctx.image = image
        return image

    def resolve(self, run_dir: Path, disk: Path | None, disk_cache: str,
                mem_path: Path | None = None) -> VmConfig:
        # Cheap checks first: a missing QEMU should not wait for a kernel download.
        qemu = find_qemu(self.opts.qemu)
        accel = resolve_accel(self.opts.accel)
        image = self.image()
        machine = self.opts.machine
        return VmConfig(
            qemu=qemu, accel=accel, machine=machine,
            cpu=self.opts.cpu or ("host" if accel == "kvm" else "max"),
            vcpus=self.opts.vcpus, memory=self.opts.memory,
            kernel=image.kernel(), initramfs=image.initramfs(),
            append=self._cmdline(image),
            agent_socket=run_dir / "agent.sock", qmp_socket=run_dir / "qmp.sock",
            console_log=run_dir / "console.log", disk=disk, disk_cache=disk_cache,
            icount=self.opts.icount if accel == "tcg" else None,
            hugepages=self.opts.hugepages, mem_path=mem_path, network=self._network())

    def _cmdline(self, image: GuestImage) -> str:
        return kernel_cmdline(self.opts.machine, host_tsc_khz(), image.kernel_info().hz,
                              self.opts.guest_hugepages, self.opts.kernel_args)

    # -- lifecycle --

    def prepare(self) -> None:
        self.cleanup()
        try:
            self._boot()
        except BaseException:
            self.cleanup()
            raise

    def _track_dir(self, path: Path) -> Path:
        self._run.tokens.append(self.ctx.journal.add(type="rmtree", path=str(path)))
        self._run.dirs.append(path)
        return path

    def _boot(self) -> None:
        run = self._run
        # Sockets live in a short /tmp path (UNIX socket paths are limited to ~107 bytes);
        # the disk under the work dir, which is on a real disk.
        run_dir = self._track_dir(Path(tempfile.mkdtemp(prefix="vmtax-vm-")))
        disk_dir = self._track_dir(Path(tempfile.mkdtemp(prefix="vm-", dir=self.ctx.work_dir)))
        disk = disk_dir / "scratch.img"
        mem_path = self._reserve_hugepages()
        self.config = cfg = self.resolve(
            run_dir, disk, "none" if _direct_io_works(disk_dir) else "writeback", mem_path)
        mkfs = shutil.which("mkfs.ext4")
        if mkfs is None:
            raise VmtaxError("mkfs.ext4 is not installed; install e2fsprogs")
        with open(disk, "wb") as f:
            f.truncate(parse_size(self.opts.disk_size))
        # Inode tables and journal are zeroed here, so no lazy-init thread runs in the guest
        # while it is measured.
        done = proc.run([mkfs, "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0",
                         str(disk)], timeout=120)
        if done.exit_code != 0:
            raise TargetError(f"mkfs.ext4 {disk} failed: {done.stderr.strip()[:300]}")

        run.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        run.listener.bind(str(cfg.agent_socket))
        run.listener.listen(1)
        qemu_log = open(run_dir / "qemu.log", "wb")
        start = time.monotonic()
        with qemu_log:
            run.proc = proc.spawn(qemu_argv(cfg), stdin=subprocess.DEVNULL,
                                  stdout=qemu_log, stderr=qemu_log)
        run.tokens.append(self.ctx.journal.process(run.proc.pid))
        deadline = start + self.opts.boot_timeout
        try:
            sock = self._accept(deadline)
            run.channel = Channel(sock, self._check_running)
            while not (line := run.channel.readline(deadline)).startswith(b"READY"):
                pass
        except (TimeoutError, EOFError, OSError) as exc:
            raise TargetError(self._boot_failure(exc)) from None
        self.boot_seconds = time.monotonic() - start
        # The guest's own uptime at READY: boot_seconds minus this is QEMU's share.
        self.guest_boot_seconds = float(line.split()[2])
        if self.opts.pin is not None:
            self._pin(self.opts.pin)
        mounted = self.run(Job(["/bin/sh", "/vmtax/disk", DISK_DEVICE, SCRATCH], timeout=60))
        if not mounted.ok:
            raise TargetError(f"{self.name}: mounting the scratch disk in the guest failed: "
                              + (mounted.stderr.strip() or mounted.stdout.strip())[-300:])
        # What a job costs the host beyond the guest's own timing (channel, agent): taken
        # off before the guest clock is checked against the host's.
        trivial = [self.run(Job(["true"], timeout=30)) for _ in range(3)]
        self.job_overhead = sorted(r.host_elapsed - (r.guest_elapsed or 0) for r in trivial)[1]
        self._check_guest_hugepages()

    def _reserve_hugepages(self) -> Path | None:
        """Host huge pages for guest RAM, before QEMU starts; the hugetlbfs to put it on."""
        size = self.opts.hugepages
        if size is None:
            return None
        pages = hugepages.pages_needed(parse_size(self.opts.memory), size)
        problem = hugepages.capacity_problem({size: pages})
        if problem:
            raise VmtaxError(f"{self.name}: hugepages = {size}: {problem}")
        self._run.reservation = hugepages.pool(self.ctx.journal, size).reserve(pages)
        self.host_hugepages_granted = self._run.reservation.granted
        return self._run.reservation.mountpoint

    def _check_guest_hugepages(self) -> None:
        """What the guest kernel really reserved (it grants fewer when memory is short)."""
        result = self.run(Job(["cat", "/proc/meminfo"], timeout=30))
        found = re.search(r"^HugePages_Total:\s+(\d+)$", result.stdout, re.MULTILINE)
        if not result.ok or not found:
            raise TargetError(f"{self.name}: no HugePages_Total in the guest's /proc/meminfo")
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
        assert self._run.proc is not None   # vcpu_threads() found the guest alive
        if rest:
            for task in os.listdir(f"/proc/{self._run.proc.pid}/task"):
                if int(task) not in threads:
                    with contextlib.suppress(ProcessLookupError):   # a thread that just ended
                        os.sched_setaffinity(int(task), rest)
        self.vcpu_affinity = [sorted(os.sched_getaffinity(tid)) for tid in threads]

    def _accept(self, deadline: float) -> socket.socket:
        listener = self._run.listener
        assert listener is not None   # the boot opened it before starting QEMU
        while True:
            ready, _, _ = select.select([listener], [], [],
                                        max(0.0, min(deadline - time.monotonic(), 0.2)))
            if ready:
                sock, _ = listener.accept()
                return sock
            self._check_running()
            if time.monotonic() >= deadline:
                raise TimeoutError("QEMU did not connect to the agent socket")

    def _check_running(self) -> None:
        if self._run.proc is None or self._run.proc.poll() is not None:
            raise EOFError("QEMU exited")

    def _boot_failure(self, exc: BaseException) -> str:
        assert self.config is not None   # set before QEMU starts
        run_dir = self.config.console_log.parent
        code = self._run.proc.poll() if self._run.proc else None
        what = (f"QEMU exited with status {code}" if code is not None
                else f"no agent READY within {float(self.opts.boot_timeout):g} s")
        details = _tail(run_dir / "qemu.log", 3)
        console = _tail(self.config.console_log)
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

    def run(self, job: Job) -> JobResult:
        if not self.alive():
            raise TargetError(f"{self.name}: the guest is not running; prepare it again")
        assert self._run.channel is not None and self.config is not None   # it booted
        self._job_ids += 1
        start = time.perf_counter()
        try:
            self._run.channel.send(encode_job(self._job_ids, job))
            result = read_result(self._run.channel, self._job_ids,
                                 time.monotonic() + job.timeout + self.host_margin)
        except (TimeoutError, EOFError, OSError) as exc:
            elapsed = time.perf_counter() - start
            hung = isinstance(exc, TimeoutError)
            console = _tail(self.config.console_log)
            self._kill()
            why = ("the guest did not answer within the job's timeout + "
                   f"{self.host_margin:g} s and was stopped" if hung else f"the guest died ({exc})")
            return JobResult(None, "", why + (f"; console: {console}" if console else ""),
                             elapsed, timed_out=hung)
        elapsed = time.perf_counter() - start
        return JobResult(None if result.timed_out else result.exit_code,
                         result.stdout.decode(errors="replace"),
                         result.stderr.decode(errors="replace"), elapsed,
                         guest_elapsed=result.elapsed_ns / 1e9, timed_out=result.timed_out)

    def _network(self) -> str:
        if self.opts.network == "auto":
            return "user" if self.ctx.serves else "none"
        return self.opts.network

    # -- servers for host-side clients --

    def start_server(self, job: Job, port: int) -> Endpoint:
        if self.config is None or self.config.network == "none":
            raise TargetError(f"{self.name}: the guest has no network (network = "
                              f"\"{self.opts.network}\"); give it network = \"user\"")
        if not self._run.net_up:
            self._must(Job(["/bin/sh", "/vmtax/net", USER_NET_GUEST, USER_NET_GATEWAY],
                           timeout=60), "bringing up the guest's network")
            self._run.net_up = True
        host_port = _free_port()
        self.qmp("human-monitor-command", {"command-line": (
            f"hostfwd_add {NETDEV} tcp:127.0.0.1:{host_port}-:{port}")})
        started = self._must(Job(["/bin/sh", "/vmtax/spawn", f"/tmp/server-{port}.log",
                                  *job.argv], env=job.env, timeout=job.timeout,
                                 in_scratch=job.in_scratch), f"starting {job.argv[0]}")
        endpoint = Endpoint("127.0.0.1", host_port, self.host_pids(),
                            handle=(int(started.stdout.split()[0]), host_port))
        # QEMU accepts forwarded connections whether or not the guest listens: ask the
        # guest itself.
        listening = self.run(Job(["/bin/sh", "-c", f"until netstat -ltn | grep -q ':{port} '; "
                                  "do usleep 20000; done"], timeout=job.timeout))
        if not listening.ok:
            self.stop_server(endpoint)
            raise TargetError(f"{self.name}: {job.argv[0]} does not listen on port {port} "
                              f"in the guest after {job.timeout:g} s")
        return endpoint

    def stop_server(self, endpoint: Endpoint) -> None:
        guest_pid, host_port = cast("tuple[int, int]", endpoint.handle)
        if not self.alive():
            return
        self.run(Job(["kill", "-TERM", f"-{guest_pid}"], timeout=30))
        with contextlib.suppress(Exception):   # gone with a guest that was restarted
            self.qmp("human-monitor-command", {"command-line": (
                f"hostfwd_remove {NETDEV} tcp:127.0.0.1:{host_port}")})

    def _must(self, job: Job, what: str) -> JobResult:
        result = self.run(job)
        if not result.ok:
            raise TargetError(f"{self.name}: {what} failed: "
                              + (result.stderr.strip() or result.stdout.strip())[-300:])
        return result

    def cpus(self) -> set[int] | None:
        return set(self.opts.pin) if self.opts.pin else None

    def host_pids(self) -> list[int]:
        return [self._run.proc.pid] if self.alive() and self._run.proc else []

    def alive(self) -> bool:
        return self._run.proc is not None and self._run.proc.poll() is None

    def pause(self) -> None:
        # A stopped guest costs no host CPU while other targets are measured (an idle TCG
        # guest takes 7-13% of a core); best effort: a QMP hiccup must not end the plan.
        if self.alive():
            try:
                self.qmp("stop")
            except Exception:
                pass

    def resume(self) -> None:
        if self.alive():
            try:
                self.qmp("cont")
            except Exception:   # a guest that cannot be resumed is as good as hung
                self._kill()

    def _kill(self) -> None:
        # Only while QEMU runs: once reaped, its pid (= its group id) may be reused.
        if self._run.proc is not None and self._run.proc.poll() is None:
            proc.kill_group(self._run.proc)

    def cleanup(self) -> None:
        run = self._run
        if run.proc is not None and run.proc.poll() is None:
            try:
                self.qmp("quit")
                run.proc.wait(timeout=QMP_TIMEOUT)
            except Exception:   # a hung or half-started QEMU is killed below either way
                pass
        self._kill()
        for sock in (run.channel.sock if run.channel else None, run.listener):
            if sock is not None:
                sock.close()
        if run.reservation is not None:   # QEMU is gone: its pages are free again
            run.reservation.release()
        for directory in run.dirs:
            shutil.rmtree(directory, ignore_errors=True)
        for token in run.tokens:
            self.ctx.journal.forget(token)
        self._run = _Running()

    # -- QMP --

    def qmp(self, command: str, arguments: dict | None = None) -> Any:
        """Run one QMP command on the running QEMU and return its result."""
        from qemu.qmp import QMPClient

        if self.config is None:
            raise TargetError(f"{self.name}: the guest is not running")
        qmp_socket = str(self.config.qmp_socket)

        async def call() -> Any:
            client = QMPClient(self.name)
            await asyncio.wait_for(client.connect(qmp_socket), QMP_TIMEOUT)
            try:
                return await asyncio.wait_for(client.execute(command, arguments), QMP_TIMEOUT)
            finally:
                await client.disconnect()
        return asyncio.run(call())

    def vcpu_threads(self) -> list[int]:
        """Host thread ids of the guest's vCPUs, in vCPU order (for pinning)."""
        if not self.alive():
            raise TargetError(f"{self.name}: the guest is not running")
        cpus = self.qmp("query-cpus-fast")
        return [c["thread-id"] for c in sorted(cpus, key=lambda c: c["cpu-index"])]

    # -- identity --

    def qemu_version(self) -> str:
        if self._qemu_version is None:
            out = proc.run([find_qemu(self.opts.qemu), "--version"], timeout=30)
            self._qemu_version = (out.stdout.splitlines() or ["unknown"])[0].strip()
        return self._qemu_version

    def fingerprint(self) -> dict[str, Any]:
        cfg = self.config
        image = self.image()
        accel = cfg.accel if cfg else resolve_accel(self.opts.accel)
        size = self.opts.hugepages
        host_pages: dict[str, Any] = {"size": None, "requested": 0, "granted": 0}
        if size:
            host_pages = {"size": size, "requested": hugepages.pages_needed(
                parse_size(self.opts.memory), size), "granted": self.host_hugepages_granted}
        return {
            "kind": self.kind,
            "qemu": find_qemu(self.opts.qemu),
            "qemu_version": self.qemu_version(),
            "accel": accel,
            "machine": self.opts.machine,
            "cpu": self.opts.cpu or ("host" if accel == "kvm" else "max"),
            "vcpus": self.opts.vcpus,
            "memory": self.opts.memory,
            "icount": cfg.icount if cfg else None,
            "job_overhead_s": self.job_overhead,
            # QEMU start to agent READY, as the host saw it, and the guest's uptime then.
            "boot_seconds": self.boot_seconds,
            "guest_boot_seconds": self.guest_boot_seconds,
            "disk_cache": cfg.disk_cache if cfg else None,
            "append": cfg.append if cfg else self._cmdline(image),
            # Requested and granted on each side: E5's precondition, kept with the results.
            "host_hugepages": host_pages,
            "guest_hugepages": {"requested": self.opts.guest_hugepages,
                                "granted": self.guest_hugepages_granted},
            "pin": self.opts.pin,
            "network": cfg.network if cfg else self._network(),
            "vcpu_affinity": self.vcpu_affinity,
            **image.fingerprint(),
        }
