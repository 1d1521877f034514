"""A QEMU guest as a target: the plan's jobs run in one guest (a
vmtax.targets.vm_instance.VmInstance) booted from these options; the target chooses the
guest's configuration, schedules jobs and servers on it, and describes it. The factory
(vmtax.studies.factory) makes more guests of the same configuration through
`make_instance`, each on a tap of a vmtax network.

Huge pages, E5's two sides: `hugepages` backs guest RAM with host huge pages (a hugetlbfs
file, reserved by vmtax.host.hugepages before QEMU starts), `guest_hugepages` has the guest kernel
reserve 2 MiB pages at boot for the workload (sysbench --memory-hugetlb allocates them with
shmget(SHM_HUGETLB), which needs no hugetlbfs mount in the guest). What was granted on
each side is in the fingerprint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, cast

from vmtax.core import plugin
from vmtax.core.errors import TargetError, VmtaxError
from vmtax.core.option_types import (
    GuestKernel,
    HostCpus,
    NonEmpty,
    Program,
    Programs,
    Seconds,
    Size,
    cpulist,
)
from vmtax.core.target import SERVES, Feature, TargetContext
from vmtax.core.types import Endpoint, Job
from vmtax.guest.image import GuestImage
from vmtax.guest.qemu import (
    VmConfig,
    find_qemu,
    host_tsc_khz,
    io_uring_problem,
    kernel_cmdline,
    parse_size,
    qemu_properties,
    resolve_accel,
)
from vmtax.host import hugepages, machine, trees
from vmtax.targets.guest_target import GuestTarget
from vmtax.targets.vm_instance import VmInstance

# --- options that depend on each other ----------------------------------------------------

# What a guest needs beside the huge pages it reserves: kernel, the initramfs rootfs (held
# in RAM), sysbench's own buffers when it does not use huge pages.
GUEST_MIN_FREE = 256 << 20
# A pin for the default two vCPUs, the knob `vmtax tune` tries: the first two usable CPUs.
PIN_CANDIDATE = cpulist(sorted(os.sched_getaffinity(0))[:2])


class VmOptions(plugin.Options):
    qemu: Program = plugin.option(
        "qemu-system-x86_64", "QEMU binary (any build); --qemu LABEL=PATH, repeated, "
        "measures several builds side by side as vm@LABEL", cli=True)
    accel: Literal["auto", "kvm", "tcg"] = plugin.option(
        "auto", "Acceleration; auto uses KVM only where it really runs a vCPU", cli=True)
    machine: Literal["microvm", "q35"] = plugin.option("microvm", "QEMU machine type", cli=True,
                                                      tune=("q35", "microvm"))
    vcpus: int = plugin.option(2, "Virtual CPUs", unit="vCPUs", ge=1, cli=True, tune=(1, 2, 4))
    memory: Size = plugin.option("1G", "Guest memory", unit="bytes", cli=True)
    cpu: NonEmpty | None = plugin.option(None, "QEMU CPU model; none: host under KVM, "
                                         "max under TCG", tune=("qemu64", "max"))
    kernel: GuestKernel = plugin.option(
        "debian", 'Guest kernel: "debian" (Debian\'s linux-image-amd64), "debian-rt" '
        '(linux-image-rt-amd64, PREEMPT_RT), "minimal" (built from linux-source with '
        "only what vmtax's guests use, all built in: the fastest boot) or a vmlinux/bzImage "
        "path", cli=True)
    disk_size: Size = plugin.option("4G", "Scratch disk (ext4, on disk_bus) for "
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
        None, "Back guest RAM with host huge pages of this size (reserved for the run)",
        tune=("2M",))
    guest_hugepages: int = plugin.option(0, "2 MiB huge pages the guest kernel reserves at "
                                         "boot", unit="pages", ge=0)
    pin: HostCpus | None = plugin.option(None, "Host CPU of each vCPU's thread, in vCPU "
                                         "order; none: the host scheduler decides",
                                         tune=(PIN_CANDIDATE,))
    # After vmtax's own, so one of them given again wins (e.g. "mitigations=off", or a
    # wrong tsc_early_khz for a deliberately skewed clock).
    kernel_args: NonEmpty | None = plugin.option(
        None, "Extra guest kernel arguments, after vmtax's own", cli=True,
        tune=("mitigations=off", "clocksource=tsc"),
        safety={"mitigations=off": "removes the guest kernel's protections against CPU "
                                   "side channels (Spectre, Meltdown, ...)"})
    network: Literal["auto", "none", "bridge", "user"] = plugin.option(
        "auto", "The guest's network for servers a host-side client reaches: bridge is a "
        "tap on a bridge in a namespace vmtax owns (needs root); user is QEMU's user-mode "
        "network (slirp: no root, but several times the CPU per byte, ~0.8 against "
        "~2.6 Gbit/s here); auto: bridge where it can be made, else user, and only for "
        "plans with client-server workloads", tune=("bridge", "user"))
    vhost: bool = plugin.option(False, "bridge network: vhost-net moves the NIC's data path "
                                "into the host kernel (needs /dev/vhost-net)", tune=(True,))
    disk_cache: Literal["auto", "none", "writeback", "writethrough", "directsync",
                        "unsafe"] = plugin.option(
        "auto", "The scratch disk's host cache mode; auto: none (O_DIRECT) where the work "
        "directory's filesystem allows it, else writeback", tune=("writeback", "unsafe"),
        safety={"unsafe": "ignores the guest's flushes: a host crash loses what it wrote"})
    disk_aio: Literal["threads", "native", "io_uring"] = plugin.option(
        "threads", "How QEMU does the scratch disk's I/O: a thread pool, Linux AIO (needs "
        "O_DIRECT: disk_cache none or directsync) or io_uring", tune=("native", "io_uring"))
    iothread: bool = plugin.option(False, "The scratch disk served by an I/O thread of its "
                                   "own, not QEMU's main loop", tune=(True,))
    disk_bus: Literal["virtio-blk", "virtio-scsi", "nvme"] = plugin.option(
        "virtio-blk", "The scratch disk's bus: virtio-blk (/dev/vda), a disk on a virtio-scsi "
        "controller (/dev/sda, as many clouds give) or an emulated NVMe controller "
        "(/dev/nvme0n1; on microvm, on a PCIe bus added for it); not with the minimal "
        "kernel",
        tune=("virtio-scsi", "nvme"))
    tcg_thread: Literal["multi", "single"] = plugin.option(
        "multi", "TCG only: one host thread per vCPU (multi) or all vCPUs in one",
        tune=("single",))
    tb_size: int | None = plugin.option(None, "TCG only: translation cache size; none: "
                                        "QEMU's default (1 GiB)", unit="MiB", ge=1,
                                        tune=(64, 256))

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
        problems += self._tuning_problems()
        if self.pin is not None:
            if len(self.pin) != self.vcpus:
                problems.append(("pin", f"one host CPU per vCPU (vcpus = {self.vcpus})"))
            elif self.icount and self.vcpus > 1:
                problems.append(("pin", "no pinning of several vCPUs with icount (TCG then "
                                        "runs them all in one thread)"))
        return problems

    def _tuning_problems(self) -> list[tuple[str, str]]:
        problems = []
        if self.vhost and not machine.has_device("/dev/vhost-net"):
            problems.append(("vhost", "false: this host has no /dev/vhost-net (modprobe "
                                      "vhost_net)"))
        if self.vhost and self.network not in ("bridge", "auto"):
            problems.append(("vhost", "false with network = \"" + self.network + "\" "
                                      "(vhost-net serves a tap)"))
        # accel = "kvm" where KVM cannot run guests is refused where it was asked for.
        if self.iothread and self.accel != "kvm" and resolve_accel(self.accel) == "tcg":
            problems.append(("iothread", "false under TCG (an I/O thread needs ioeventfd, "
                                         "which only KVM gives)"))
        if self.disk_aio == "native" and self.disk_cache not in ("auto", "none", "directsync"):
            problems.append(("disk_aio", f'"threads" or "io_uring" with disk_cache = '
                                         f'"{self.disk_cache}" (Linux AIO needs O_DIRECT)'))
        if self.disk_bus != "virtio-blk" and self.kernel == "minimal":
            problems.append(("disk_bus", '"virtio-blk" with kernel = "minimal" (built '
                                         "without SCSI and NVMe drivers)"))
        if (self.disk_bus == "nvme" and self.machine == "microvm"
                and "pcie" not in qemu_properties(self.qemu, "-machine", "microvm")):
            problems.append(("disk_bus", f'"virtio-blk" or "virtio-scsi" on machine = '
                                         f'"microvm" ({self.qemu}\'s microvm has no PCIe bus '
                                         "for an NVMe controller; or machine = \"q35\")"))
        if (self.disk_bus == "nvme" and self.iothread
                and "iothread" not in qemu_properties(self.qemu, "-device", "nvme")):
            problems.append(("iothread", f"false with disk_bus = \"nvme\" ({self.qemu}'s "
                                         "NVMe controller takes no I/O thread)"))
        if self.disk_aio == "io_uring":
            why = io_uring_problem(self.qemu)
            if why:
                problems.append(("disk_aio", f'"threads" or "native": {why}'))
        return problems


# --- the target ---------------------------------------------------------------------------

def bridge_possible() -> str | None:
    """Why this process cannot put a guest on a tap of its own network (None: it can)."""
    if os.geteuid() != 0:
        return "making network namespaces and tap devices needs root"
    if not machine.has_device("/dev/net/tun"):
        return "/dev/net/tun is missing"
    return None


class VmTarget(GuestTarget):
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
    # QEMU marks guest RAM mergeable; the agent times each job by the guest's clock.
    ksm_mergeable = True
    guest_clock = True
    vmm_process = True
    # E4's instance (density, boot): the smallest guest vmtax makes that serves nginx. The
    # minimal kernel (everything built in, the fastest boot); 56 MiB, where nginx runs with
    # 13 MiB to spare (at 48 MiB the kernel panics unpacking the initramfs); a 16 MiB TCG
    # translation cache (QEMU's default reserves 1 GiB). The boot fills all 16 MiB, never
    # merged by KSM; 4 MiB would save 12 MiB of PSS per guest, but the boot then spends its
    # time translating again what the cache dropped: 10 guests took 128 s to start against
    # 13 s (measured here, 2 at a time). An idle guest costs ~0.2% of a host core either way.
    small_options = {"vcpus": 1, "memory": "56M", "disk_size": "64M", "kernel": "minimal",
                     "tb_size": 16}

    @classmethod
    def unavailable(cls) -> str | None:
        try:
            find_qemu(plugin.option_infos(VmOptions)["qemu"].default)
        except VmtaxError as exc:
            return str(exc)
        return None

    @classmethod
    def variants(cls) -> dict[str, str | None]:
        from vmtax.host import kvm  # probing runs a tiny vCPU: only when asked
        status = kvm.probe()
        return {"kvm": None if status.usable else status.reason, "tcg": None, "auto": None}

    @classmethod
    def host_hugepages(cls, options: plugin.Options) -> dict[str, int]:
        opts: VmOptions = options  # type: ignore[assignment]
        if opts.hugepages is None:
            return {}
        return {opts.hugepages: hugepages.pages_needed(parse_size(opts.memory), opts.hugepages)}

    @classmethod
    def refuses(cls, options: plugin.Options) -> dict[Feature, str]:
        opts: VmOptions = options  # type: ignore[assignment]
        return {SERVES: 'network = "none"'} if opts.network == "none" else {}

    @classmethod
    def workload_hugepages(cls, options: plugin.Options) -> int | None:
        return options.guest_hugepages  # type: ignore[attr-defined, no-any-return]

    def __init__(self, name: str, options: plugin.Options, ctx: TargetContext):
        super().__init__(name, options, ctx)
        self.opts: VmOptions = options  # type: ignore[assignment]
        # The guest the plan's jobs run in; a new one after each prepare().
        self.guest: VmInstance | None = None
        self._qemu_version: str | None = None
        self._network_warned = False
        # QEMU start to agent READY of every guest the plan booted (a hung one is replaced).
        self.boot_history: list[float] = []

    # -- configuration --

    def qemu_path(self) -> str:
        return self.opts.qemu

    def resolve(self, run_dir: Path, disk: Path | None, disk_cache: str,
                mem_path: Path | None = None, network: str = "none",
                tap: Any = None) -> VmConfig:
        # Cheap checks first: a missing QEMU should not wait for a kernel download.
        qemu = find_qemu(self.opts.qemu)
        accel = resolve_accel(self.opts.accel,
                              self.asked_for("accel", self.opts.accel, ["tcg", "auto"]))
        image = self.image()
        machine = self.opts.machine
        return VmConfig(
            qemu=qemu, accel=accel, machine=machine,
            cpu=self.opts.cpu or ("host" if accel == "kvm" else "max"),
            vcpus=self.opts.vcpus, memory=self.opts.memory,
            kernel=image.kernel(), initramfs=image.initramfs(),
            append=self._cmdline(image, accel),
            agent_socket=run_dir / "agent.sock", qmp_socket=run_dir / "qmp.sock",
            console_log=run_dir / "console.log", disk=disk,
            disk_cache=disk_cache if self.opts.disk_cache == "auto" else self.opts.disk_cache,
            disk_aio=None if self.opts.disk_aio == "threads" else self.opts.disk_aio,
            iothread=self.opts.iothread, disk_bus=self.opts.disk_bus,
            tcg_thread=self.opts.tcg_thread, tb_size=self.opts.tb_size, vhost=self.opts.vhost,
            icount=self.opts.icount if accel == "tcg" else None,
            hugepages=self.opts.hugepages, mem_path=mem_path, network=network, tap=tap,
            trees=tuple((trees.ext4_image(tree), str(tree)) for tree in self.ctx.trees))

    def _cmdline(self, image: GuestImage, accel: str) -> str:
        kernel = image.kernel_info()
        return kernel_cmdline(self.opts.machine, host_tsc_khz(), kernel.hz,
                              self.opts.guest_hugepages, self.opts.kernel_args,
                              tcg=accel == "tcg", params=kernel.params)

    def _network(self) -> str:
        """The network of the plan's guest: one only where a server needs it."""
        wanted = self.opts.network
        if wanted != "auto":
            return wanted
        if not self.ctx.serves:
            return "none"
        why_not = bridge_possible()
        if why_not is None:
            return "bridge"
        if not self._network_warned:
            self._network_warned = True
            self.warnings.append(f"user-mode network (slirp) instead of a bridge: {why_not}; "
                                 "its throughput and CPU cost are slirp's")
        return "user"

    def _new_guest(self, name: str, network: str, net: Any) -> VmInstance:
        return VmInstance(name, self.opts, self.resolve, self.ctx.journal,
                          Path(self.ctx.work_dir), network, net)

    # -- lifecycle --

    def prepare(self) -> None:
        self.cleanup()
        self._boot()

    # -- servers for host-side clients --

    def start_server(self, job: Job, port: int) -> Endpoint:
        guest = self._need_guest()
        if guest.network == "none":
            raise TargetError(f"{self.name}: the guest has no network (network = "
                              f"\"{self.opts.network}\"); give it network = \"bridge\" "
                              "or \"user\"")
        guest_pid = guest.spawn(job)
        address, host_port = guest.reach(port)
        return self._listening(guest, job, port, Endpoint(
            address, host_port, guest.host_pids(), handle=(guest_pid, host_port),
            client_preexec=guest.client_preexec, listening=True))

    def stop_server(self, endpoint: Endpoint) -> None:
        guest_pid, host_port = cast("tuple[int, int]", endpoint.handle)
        if self.guest is None or not self.guest.alive():
            return
        self.guest.signal_group(guest_pid)
        self.guest.unreach(host_port)

    def qmp(self, command: str, arguments: dict | None = None) -> Any:
        """Run one QMP command on the plan's guest and return its result."""
        return self._need_guest().qmp(command, arguments)

    # -- identity --

    def fingerprint(self) -> dict[str, Any]:
        guest = self.guest
        cfg = guest.config if guest else None
        image = self.image()
        accel = cfg.accel if cfg else resolve_accel(self.opts.accel)
        size = self.opts.hugepages
        host_pages: dict[str, Any] = {"size": None, "requested": 0, "granted": 0}
        if size:
            host_pages = {"size": size, "requested": hugepages.pages_needed(
                parse_size(self.opts.memory), size),
                "granted": guest.host_hugepages_granted if guest else None}
        return {
            "kind": self.kind,
            "kernel": self.opts.kernel,
            "qemu": find_qemu(self.opts.qemu),
            "qemu_version": self.qemu_version(),
            "accel": accel,
            "machine": self.opts.machine,
            "cpu": self.opts.cpu or ("host" if accel == "kvm" else "max"),
            "vcpus": self.opts.vcpus,
            "memory": self.opts.memory,
            "icount": cfg.icount if cfg else None,
            "job_overhead_s": guest.job_overhead if guest else None,
            # QEMU start to agent READY, as the host saw it, and the guest's uptime then.
            "boot_seconds": guest.boot_seconds if guest else None,
            "guest_boot_seconds": guest.guest_boot_seconds if guest else None,
            "boots_seconds": list(self.boot_history),
            "disk_cache": cfg.disk_cache if cfg else None,
            "disk_aio": self.opts.disk_aio, "iothread": self.opts.iothread,
            "disk_bus": self.opts.disk_bus,
            "tcg_thread": self.opts.tcg_thread if accel == "tcg" else None,
            "tb_size": self.opts.tb_size if accel == "tcg" else None, "vhost": self.opts.vhost,
            # Whether QEMU may back guest RAM with transparent huge pages (not under TCG:
            # vmtax.targets.vm_instance.qemu_preexec).
            "transparent_hugepages": accel != "tcg",
            "append": cfg.append if cfg else self._cmdline(image, accel),
            # Requested and granted on each side: E5's precondition, kept with the results.
            "host_hugepages": host_pages,
            "guest_hugepages": {"requested": self.opts.guest_hugepages,
                                "granted": guest.guest_hugepages_granted if guest else None},
            "pin": self.opts.pin,
            "network": cfg.network if cfg else self._network(),
            "vcpu_affinity": guest.vcpu_affinity if guest else None,
            **image.fingerprint(),
        }
