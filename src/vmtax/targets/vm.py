"""A QEMU guest as a target: the plan's jobs run in one guest (a
vmtax.targets.vm_instance.VmInstance) booted from these options; the target chooses the
guest's QEMU configuration (machine, accelerator, CPU model, the scratch disk's cache, I/O
and bus, TCG's knobs) on top of what every VMM-backed target shares
(vmtax.targets.vmm_target: vCPUs, memory, kernel, huge pages, pinning, network), and
describes it. The factory (vmtax.studies.factory) makes more guests of the same
configuration through `make_instance`, each on a tap of a vmtax network.

Host huge pages back guest RAM through a hugetlbfs file QEMU maps (memory-backend-file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from vmtax.core import plugin
from vmtax.core.errors import VmtaxError
from vmtax.core.option_types import NonEmpty, Program, Size
from vmtax.core.target import TargetContext
from vmtax.guest.image import GuestImage
from vmtax.guest.qemu import (
    VmConfig,
    find_qemu,
    host_tsc_khz,
    io_uring_problem,
    kernel_cmdline,
    qemu_properties,
    resolve_accel,
)
from vmtax.host import binary, machine, trees
from vmtax.targets.vm_instance import VmInstance
from vmtax.targets.vmm_target import VmmOptions, VmmTarget, bridge_possible

# --- options ----------------------------------------------------------------------------

class VmOptions(VmmOptions):
    qemu: Program = plugin.option(
        "qemu-system-x86_64", "QEMU binary (any build); --qemu LABEL=PATH, repeated, "
        "measures several builds side by side as vm@LABEL", cli=True)
    accel: Literal["auto", "kvm", "tcg"] = plugin.option(
        "auto", "Acceleration; auto uses KVM only where it really runs a vCPU", cli=True)
    machine: Literal["microvm", "q35"] = plugin.option("microvm", "QEMU machine type", cli=True,
                                                      tune=("q35", "microvm"))
    cpu: NonEmpty | None = plugin.option(None, "QEMU CPU model; none: host under KVM, "
                                         "max under TCG", tune=("qemu64", "max"))
    disk_size: Size = plugin.option("4G", "Scratch disk (ext4, on disk_bus) for "
                                    "workloads that write files", unit="bytes")
    icount: NonEmpty | None = plugin.option(None, "TCG only: QEMU -icount (guest time "
                                            "from the instruction count)")
    # QEMU alone has a user-mode network: a wider choice than the base's, which pydantic
    # checks per model (mypy holds a field's type invariant across subclasses).
    network: Literal["auto", "none", "bridge", "user"] = plugin.option(  # type: ignore[assignment]
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
        problems = super().problems() + self._tuning_problems()
        if self.pin is not None and len(self.pin) == self.vcpus and self.icount \
                and self.vcpus > 1:
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

class VmTarget(VmmTarget):
    kind = "vm"
    name = "vm"
    description = ("A QEMU guest (KVM or TCG, any QEMU build) booting Debian's kernel "
                   "straight into a busybox agent that runs jobs over virtio-serial")
    Options = VmOptions
    variant_option = "accel"
    # QEMU, beside what building the guest's image takes.
    packages = ("qemu-system-x86", "qemu-utils", *VmmTarget.packages)
    # Boot to agent ready under TCG, then calibration (measured: 2-5 s here).
    startup_seconds = 5.0
    # QEMU marks guest RAM mergeable (MADV_MERGEABLE), so KSM can merge it.
    ksm_mergeable = True
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
        """The network of the plan's guest: one only where a server needs it; without
        root, QEMU's user-mode network, said once."""
        if self.opts.network != "auto" or not self.ctx.serves:
            return super()._network()
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

    def qmp(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        """Run one QMP command on the plan's guest and return its result."""
        return self._need_guest().qmp(command, arguments)

    # -- identity --

    def vmm_fingerprint(self) -> dict[str, Any]:
        guest = self.guest
        cfg = guest.config if guest else None
        accel = cfg.accel if cfg else resolve_accel(self.opts.accel)
        return {
            "qemu": find_qemu(self.opts.qemu),
            "qemu_version": self.qemu_version(),
            # A rebuild at the same path with the same version string is another QEMU.
            "qemu_sha256": binary.short_id(find_qemu(self.opts.qemu)),
            "accel": accel,
            "machine": self.opts.machine,
            "cpu": self.opts.cpu or ("host" if accel == "kvm" else "max"),
            "icount": cfg.icount if cfg else None,
            "disk_cache": cfg.disk_cache if cfg else None,
            "disk_aio": self.opts.disk_aio, "iothread": self.opts.iothread,
            "disk_bus": self.opts.disk_bus,
            "tcg_thread": self.opts.tcg_thread if accel == "tcg" else None,
            "tb_size": self.opts.tb_size if accel == "tcg" else None, "vhost": self.opts.vhost,
            # Whether QEMU may back guest RAM with transparent huge pages (not under TCG:
            # vmtax.targets.vm_instance.qemu_preexec).
            "transparent_hugepages": accel != "tcg",
            "append": cfg.append if cfg else self._cmdline(self.image(), accel),
        }
