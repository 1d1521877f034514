"""QEMU's command line for one guest, from a resolved configuration: machine, accelerator,
memory (huge pages), the PVH kernel and initramfs, the console, agent, disk and network
devices, and QMP. Pure functions of the configuration (plus host facts), so the whole KVM
path is tested from argv on a host where KVM cannot run.
"""

from __future__ import annotations

import functools
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vmtax.core.errors import VmtaxError
from vmtax.guest.image import AGENT_PORT
from vmtax.host import machine as host
from vmtax.host import proc
from vmtax.host.trees import SERIAL as TREE_SERIAL

if TYPE_CHECKING:
    from vmtax.host.network import Endpoint as NetEndpoint

_SIZE = re.compile(r"(\d+)([KMGT]?)(?:i?B)?", re.IGNORECASE)


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


def resolve_accel(accel: str, asked: tuple[str, str] = ("--accel kvm", "--accel tcg or auto")
                  ) -> str:
    """"auto" | "kvm" | "tcg" -> the accelerator to use, "kvm" only when KVM really runs guests.
    asked: what the user typed to ask for KVM, and what to type instead, for the error."""
    if accel == "tcg":
        return "tcg"
    if accel not in ("auto", "kvm"):
        raise VmtaxError(f"unknown accel {accel!r}: use auto, kvm or tcg")
    from vmtax.host import kvm  # probing runs a tiny vCPU: only when asked
    status = kvm.probe()
    if status.usable:
        return "kvm"
    if accel == "kvm":
        raise VmtaxError(f"{asked[0]}: {status.reason}; use {asked[1]}")
    return "tcg"


def find_qemu(qemu: str) -> str:
    found = shutil.which(qemu)
    if found is None:
        raise VmtaxError(f"QEMU binary {qemu!r} not found; install qemu-system-x86 "
                         "(apt-get install qemu-system-x86) or pass the path of a QEMU build")
    return found


@functools.cache
def qemu_properties(qemu: str, option: str, name: str) -> frozenset[str]:
    """The properties this QEMU's device or machine `name` takes (`-device NAME,help`,
    `-machine NAME,help`: option "-device" or "-machine"); none when QEMU cannot be asked
    or lacks it."""
    try:
        out = proc.run([find_qemu(qemu), option, f"{name},help"], timeout=30).stdout
    except (VmtaxError, OSError):
        return frozenset()
    return frozenset(re.findall(r"^\s+([\w-]+)=", out, re.MULTILINE))


@functools.cache
def io_uring_problem(qemu: str) -> str | None:
    """Why QEMU cannot do a disk's I/O with io_uring here (None: it can): the kernel has
    it disabled, or this QEMU was built without liburing."""
    try:
        disabled = Path("/proc/sys/kernel/io_uring_disabled").read_text().strip()
    except OSError:
        disabled = "0"
    if disabled == "2":
        return "the kernel has io_uring disabled (kernel.io_uring_disabled = 2)"
    try:
        binary = find_qemu(qemu)
        libraries = proc.run(["ldd", binary], timeout=30).stdout
    except (VmtaxError, OSError):
        return None   # a QEMU that cannot be found is reported by its own check
    if "liburing" not in libraries:
        return f"{binary} is built without io_uring (no liburing)"
    return None


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
    disk_aio: str | None = None  # "native" | "io_uring"; None: QEMU's thread pool
    iothread: bool = False       # the scratch disk on an I/O thread of its own
    disk_bus: str = "virtio-blk"  # the scratch disk's: "virtio-blk" | "virtio-scsi" | "nvme"
    tcg_thread: str = "multi"    # TCG: one thread per vCPU, or "single" for all
    tb_size: int | None = None   # TCG: translation cache in MiB (None: QEMU's default)
    vhost: bool = False          # bridge network: vhost-net in the host kernel
    icount: str | None = None   # TCG only: guest time from the instruction count
    hugepages: str | None = None   # host huge page size backing guest RAM ("2M", "1G")
    mem_path: Path | None = None   # the hugetlbfs directory QEMU puts guest RAM in
    # "user": a virtio-net NIC on QEMU's user-mode network; "bridge": one on `tap`, a tap
    # device on a vmtax network's bridge (QEMU then starts inside that network's namespace).
    network: str = "none"
    tap: NetEndpoint | None = None
    # Read-only disks: (ext4 image, where the guest mounts it), the i-th with serial
    # vmtax.host.trees.SERIAL.format(i) (vmtax.host.trees).
    trees: tuple[tuple[Path, str], ...] = ()


MACHINES = {
    # No option ROMs: the PVH kernel is entered directly. (rtc=off would cost two 1 s waits:
    # the kernel retries reading a missing CMOS clock.)
    "microvm": "microvm,x-option-roms=off",
    "q35": "q35",
}


# The vsock port of the agent's channel, for a VMM without virtio-serial: the guest connects
# to the host there (vmtax.vsock= on the kernel's command line; the guest's /init).
AGENT_VSOCK_PORT = 1024


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
# Under TCG only:
#   noreplace-smp     a 1-vCPU guest's kernel rewrites each of its thousands of LOCK prefixes
#                     on its own code, one text_poke each (an address-space switch, and TCG
#                     retranslates): 0.1 s of CPU per boot. The prefixes stay; an atomic
#                     instruction is then what it is with several vCPUs.
TCG_BOOT_SPEEDUPS = ("noreplace-smp",)
# QEMU's local APIC timer ticks at 1 GHz, TCG's and KVM's alike (QEMU >= 4.1, Linux's KVM):
# a kernel that takes lapic_timer_period= (bus cycles per tick) need not calibrate it. Given
# under TCG only, where calibrating costs 0.1 s: a nested lab's KVM guest with it hung at
# boot in CI (RCU stalls; the cause is not proven), and under KVM calibrating is cheap.
APIC_BUS_HZ = 1_000_000_000


# A KVM guest nested in vmtax's lab: its vCPUs are threads of a TCG guest, which a busy host
# leaves unscheduled for seconds at a time, and TCG's emulated AMD-V has no pause filter
# (QEMU's TCG_SVM_FEATURES: NPT, VGIF, SVME_ADDR_CHK), so the lab's KVM cannot tell a vCPU
# that spins on another (an IPI, stop_machine) and lets it spin out its slice. The kernel's
# RCU stall report (21 s) then came while 2-vCPU guests booted, and vmtax gave each up; with
# the report at its latest they booted (the fault census, docs/lab.md). Before the user's.
NESTED_KVM_ARGS = ("rcupdate.rcu_cpu_stall_timeout=300",)


def kernel_cmdline(machine: str, tsc_khz: int | None, hz: int | None = None,
                   guest_hugepages: int = 0, extra: str | None = None, *, tcg: bool = False,
                   params: tuple[str, ...] = ()) -> str:
    """The guest kernel's command line on a QEMU machine; tcg: the guest runs under TCG;
    params: the boot parameters the kernel takes beyond upstream's (Kernel.params). The
    Debian kernel's TSC calibration hung microvm boots on a busy host (HOST-NOTES): there
    the kernel is told the TSC's rate."""
    return guest_cmdline(transport(machine), tsc_khz, hz, guest_hugepages, extra, tcg=tcg,
                         params=params, early_tsc=machine == "microvm")


def guest_cmdline(bus: str, tsc_khz: int | None, hz: int | None = None,
                  guest_hugepages: int = 0, extra: str | None = None, *, tcg: bool = False,
                  params: tuple[str, ...] = (), early_tsc: bool = False,
                  vsock: bool = False) -> str:
    """The guest kernel's command line for virtio devices on bus ("mmio", "pci"); early_tsc:
    tell the kernel the TSC's rate (tsc_early_khz); vsock: the agent's channel is vsock
    (AGENT_VSOCK_PORT), not a virtio-serial port."""
    args = ["console=ttyS0", "quiet", "panic=-1", f"vmtax.bus={bus}",
            *([f"vmtax.vsock={AGENT_VSOCK_PORT}"] if vsock else ()),
            *BOOT_SPEEDUPS, *(TCG_BOOT_SPEEDUPS if tcg else ())]
    if tcg and hz and "lapic_timer_period" in params:
        args.append(f"lapic_timer_period={APIC_BUS_HZ // hz}")
    if tsc_khz:
        if hz:   # the delay loop counts TSC cycles: TSC cycles per tick
            args.append(f"lpj={tsc_khz * 1000 // hz}")
        if early_tsc:
            args.append(f"tsc_early_khz={tsc_khz}")
    if guest_hugepages:
        # Reserved at boot, before guest memory fragments; the default size on x86 is 2 MiB.
        args.append(f"hugepages={guest_hugepages}")
    if not tcg and host.lab():
        args += NESTED_KVM_ARGS
    if extra:
        args.append(extra.strip())
    return " ".join(args)


def _opt(path: Path) -> str:
    """A path inside a QEMU option string, where a comma must be doubled."""
    return str(path).replace(",", ",,")


def _accel_args(cfg: VmConfig) -> list[str]:
    if cfg.accel == "kvm":
        return ["-accel", "kvm"]
    tb_size = f",tb-size={cfg.tb_size}" if cfg.tb_size else ""
    if cfg.icount:   # icount needs single-threaded TCG
        return ["-accel", f"tcg{tb_size}", "-icount", cfg.icount]
    return ["-accel", f"tcg,thread={cfg.tcg_thread}{tb_size}"]


RAM_ID = "ram"
IOTHREAD = "iothread0"
NETDEV = "net0"
# QEMU's user-mode network: the guest's address and its gateway (slirp's defaults).
USER_NET_GUEST, USER_NET_GATEWAY = "10.0.2.15/24", "10.0.2.2"


def _machine_args(cfg: VmConfig) -> list[str]:
    # memory-backend= (QEMU >= 5.0) works on microvm and q35 alike, without a NUMA node.
    machine = MACHINES[cfg.machine] + (f",memory-backend={RAM_ID}" if cfg.hugepages else "")
    if cfg.disk_bus == "nvme" and transport(cfg.machine) == "mmio":
        machine += ",pcie=on"   # microvm's PCIe bus, for the NVMe controller alone
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
        args += ["-object", f"iothread,id={IOTHREAD}"] if cfg.iothread else []
        args += ["-drive", f"if=none,id=scratch,format=raw,file={_opt(cfg.disk)},"
                 f"cache={cfg.disk_cache}" + (f",aio={cfg.disk_aio}" if cfg.disk_aio else ""),
                 *_scratch_device_args(cfg, suffix)]
    for i, (tree_image, _) in enumerate(cfg.trees):
        args += ["-drive", f"if=none,id=tree{i},format=raw,file={_opt(tree_image)},"
                 "readonly=on", "-device",
                 f"virtio-blk-{suffix},drive=tree{i},serial={TREE_SERIAL.format(i)}"]
    if cfg.network == "user":
        # Ports are forwarded to the guest on demand (QMP hostfwd_add), when a server starts.
        args += ["-netdev", f"user,id={NETDEV}", "-device", f"virtio-net-{suffix},netdev={NETDEV}"]
    elif cfg.network == "bridge":
        if cfg.tap is None:
            raise VmtaxError('network = "bridge" without a tap device')
        args += cfg.tap.qemu_args(transport(cfg.machine), NETDEV, vhost=cfg.vhost)
    return args


DISK_BUSES = ("virtio-blk", "virtio-scsi", "nvme")


def _scratch_device_args(cfg: VmConfig, suffix: str) -> list[str]:
    """The scratch disk's device on its bus (the drive "scratch" holds the image)."""
    iothread = f",iothread={IOTHREAD}" if cfg.iothread else ""
    if cfg.disk_bus == "virtio-blk":
        return ["-device", f"virtio-blk-{suffix},drive=scratch{iothread}"]
    if cfg.disk_bus == "virtio-scsi":   # the guest's first SCSI disk: /dev/sda
        return ["-device", f"virtio-scsi-{suffix},id=scsi0{iothread}",
                "-device", "scsi-hd,drive=scratch,bus=scsi0.0"]
    if cfg.disk_bus == "nvme":   # a PCI device: on microvm, on the PCIe bus it then has
        # Its first namespace: /dev/nvme0n1. QEMU's NVMe controller needs a serial.
        return ["-device", f"nvme,drive=scratch,serial=vmtax-scratch{iothread}"]
    raise VmtaxError(f"unknown disk_bus {cfg.disk_bus!r}: use {', '.join(DISK_BUSES)}")


def qemu_argv(cfg: VmConfig) -> list[str]:
    """QEMU's exact argv for cfg; one helper per concern so memory backends (huge pages) and
    CPU placement can be added to theirs without touching the rest."""
    return [cfg.qemu, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            *_accel_args(cfg), *_machine_args(cfg), *_memory_args(cfg), *_boot_args(cfg),
            *_device_args(cfg), "-qmp", f"unix:{_opt(cfg.qmp_socket)},server=on,wait=off"]
