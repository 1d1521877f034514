"""Cloud Hypervisor as a target: the plan's jobs run in one guest that Cloud Hypervisor
boots from vmtax's guest image (its own kernel, the rootfs of the host's binaries); one of
the VMMs Kata Containers runs its sandboxes in. It needs KVM; on a host without a usable
one, `vmtax lab` runs it in a nested KVM.

What Cloud Hypervisor supplies to a guest's life (vmtax.guest.vmm_guest; the rest is
vmtax.targets.microvm_target's): its command line (it boots at once), its API socket
(pause, resume, shutdown), its vCPU threads ("vcpuN"). Its devices are virtio-pci; the
kernel must be an ELF with a PVH note (vmtax's are); the serial console goes to a file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from vmtax.core import plugin
from vmtax.core.option_types import NonEmpty
from vmtax.guest.qemu import parse_size
from vmtax.guest.vmm_guest import GuestFiles
from vmtax.helpers.vmm_build import CargoBuild
from vmtax.host.trees import SERIAL as TREE_SERIAL
from vmtax.targets.microvm_target import (GUEST_CID, MicroVmGuest, MicroVmOptions,
                                          MicroVmTarget)

# Its configuration's limit on x86_64 with KVM (vmm/src/config.rs MAX_SUPPORTED_CPUS).
MAX_VCPUS = 8192
# Memory below which a guest of each kernel does not boot (as Firecracker: the kernel and
# the initramfs are loaded into guest RAM).
MIN_MEMORY = {"minimal": 64 << 20}
MIN_MEMORY_OTHER = 192 << 20
# The disk I/O engines it tries, best first, and the (hidden) switches that skip one.
ENGINES = {"io_uring": "", "aio": ",_disable_io_uring=on",
           "sync": ",_disable_io_uring=on,_disable_aio=on"}


class CloudHypervisorOptions(MicroVmOptions):
    source_build = CargoBuild(name="cloud-hypervisor", title="Cloud Hypervisor",
                              package="cloud-hypervisor")
    vmm: NonEmpty = plugin.option(
        "cloud-hypervisor", "The Cloud Hypervisor binary: a path, or a name on PATH; none "
        "found: the build of `source`, or vmtax's last build")
    vcpus: int = plugin.option(2, "Virtual CPUs", unit="vCPUs", ge=1, le=MAX_VCPUS, cli=True,
                               tune=(1, 2, 4))
    io_engine: Literal["io_uring", "aio", "sync"] = plugin.option(
        "io_uring", "How Cloud Hypervisor does the scratch disk's I/O: io_uring (its default, "
        "where the host kernel has it), Linux AIO, or blocking calls", tune=("aio", "sync"))
    direct: bool = plugin.option(False, "Open the scratch disk with O_DIRECT, past the "
                                 "host's page cache", tune=(True,))
    mergeable: bool = plugin.option(
        False, "Mark guest RAM mergeable (MADV_MERGEABLE) so KSM can share its pages",
        tune=(True,))

    def problems(self) -> list[tuple[str, str]]:
        problems = super().problems()
        least = MIN_MEMORY.get(str(self.kernel), MIN_MEMORY_OTHER)
        if parse_size(self.memory) < least:
            problems.append(("memory", f"at least {least >> 20}M for kernel = "
                                       f'"{self.kernel}" (the kernel and the initramfs are '
                                       "loaded into guest RAM)"))
        return problems


class CloudHypervisorGuest(MicroVmGuest):
    vmm_name = "Cloud Hypervisor"
    log_label = "cloud-hypervisor"
    vcpu_thread = re.compile(r"vcpu(\d+)")
    pause_request = ("PUT", "/api/v1/vm.pause", None)
    resume_request = ("PUT", "/api/v1/vm.resume", None)

    def _launch(self, files: GuestFiles) -> list[str]:
        target = self.target
        opts = target.opts
        image = target.image()
        memory = f"size={parse_size(opts.memory) >> 20}M"
        if opts.hugepages:
            memory += f",hugepages=on,hugepage_size={opts.hugepages}"
        if opts.mergeable:
            memory += ",mergeable=on"
        # image_type=raw: with the type autodetected, Cloud Hypervisor refuses the guest's
        # writes to sector 0 (lest a guest write a qcow2 header into a raw image), and mkfs
        # and ext4's superblock are there (its device_manager.rs; seen: "I/O error, dev vda,
        # sector 0 op 0x1:(WRITE)", then the mount failed).
        disks = [f"path={files.disk},image_type=raw" + (",direct=on" if opts.direct else "")
                 + ENGINES[opts.io_engine]]
        disks += [f"path={tree_image},image_type=raw,readonly=on,"
                  f"serial={target.tree_serial(i, tree_image)}"
                  for i, (_, tree_image) in enumerate(target.tree_images())]
        argv = ["--api-socket", f"path={self.api_socket(files)}",
                "--cpus", f"boot={opts.vcpus}", "--memory", memory,
                "--kernel", str(image.kernel()), "--initramfs", str(image.initramfs()),
                "--cmdline", target.cmdline(), "--disk", *disks,
                "--vsock", f"cid={GUEST_CID},socket={self.vsock_socket(files)}",
                "--serial", f"file={files.console_log}", "--console", "off"]
        if files.tap is not None:
            argv += ["--net", f"tap={files.tap.name},mac={files.tap.mac}"]
        self.sent = _without_paths(argv, files)
        return [target.vmm_path(), *argv]

    def _quit(self) -> None:
        self._api(("PUT", "/api/v1/vmm.shutdown", None))


def _without_paths(argv: list[str], files: GuestFiles) -> list[str]:
    """Its arguments as sent, less what changes at each boot (the run directory, the tap)."""
    sent = [arg.replace(str(files.run_dir), "RUN").replace(str(files.disk), "DISK")
            for arg in argv]
    if files.tap is not None:
        sent = [arg.replace(files.tap.name, "TAP").replace(files.tap.mac, "MAC")
                for arg in sent]
    return sent


class CloudHypervisorTarget(MicroVmTarget):
    name = "cloud-hypervisor"
    description = ("A Cloud Hypervisor guest (KVM) booting vmtax's guest kernel and image, "
                   "its agent over vsock: the VMM Kata Containers can run sandboxes in")
    Options = CloudHypervisorOptions
    guest_class = CloudHypervisorGuest
    bus = "pci"
    source_build = Options.source_build
    # Guest RAM is marked mergeable only with mergeable = true (not by default).
    ksm_mergeable = False
    startup_seconds = 10.0

    def tree_serial(self, index: int, image: Path) -> str:
        return TREE_SERIAL.format(index)
