"""Firecracker as a target: the plan's jobs run in one microVM that Firecracker boots from
vmtax's guest image (its own kernel, the rootfs of the host's binaries), what serverless
platforms run functions in. Firecracker needs KVM; on a host without a usable one, `vmtax
lab` runs it in a nested KVM.

What Firecracker supplies to a guest's life (vmtax.guest.vmm_guest; the rest is
vmtax.targets.microvm_target's): its configuration file (`--config-file`: boot source,
machine config, drives, the tap, vsock; it boots at once), its API socket,
its vCPU threads ("fc_vcpu N") and its log. Its devices are virtio-mmio (it gives the
kernel their places itself, `virtio_mmio.device=`) and its serial console is its stdout.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal

from vmtax.core import plugin
from vmtax.core.option_types import NonEmpty
from vmtax.guest.qemu import parse_size
from vmtax.guest.vmm_guest import GuestFiles
from vmtax.helpers.vmm_build import CargoBuild
from vmtax.targets.microvm_target import (GUEST_CID, MicroVmGuest, MicroVmOptions,
                                          MicroVmTarget)

# Firecracker's machine-config: "vcpu_count: minimum 1, maximum 32 (either 1 or an even
# number)" (its swagger/firecracker.yaml).
MAX_VCPUS = 32
# Memory below which a guest of each kernel does not boot, measured here: Debian's kernel
# is a 66 MB ELF Firecracker loads into guest RAM, beside the initramfs and its unpacked
# rootfs; the minimal one is 18 MB.
MIN_MEMORY = {"minimal": 64 << 20}
MIN_MEMORY_OTHER = 192 << 20
# KVM's capability numbers (linux/kvm.h) Firecracker checks at start (its
# arch/x86_64/kvm.rs DEFAULT_CAPABILITIES), for a refusal that names them.
KVM_CAPS = {0: "KVM_CAP_IRQCHIP", 3: "KVM_CAP_USER_MEMORY", 4: "KVM_CAP_SET_TSS_ADDR",
            7: "KVM_CAP_EXT_CPUID", 14: "KVM_CAP_MP_STATE", 32: "KVM_CAP_IRQFD",
            33: "KVM_CAP_PIT2", 35: "KVM_CAP_PIT_STATE2", 36: "KVM_CAP_IOEVENTFD",
            39: "KVM_CAP_ADJUST_CLOCK", 41: "KVM_CAP_VCPU_EVENTS", 50: "KVM_CAP_DEBUGREGS",
            55: "KVM_CAP_XSAVE", 56: "KVM_CAP_XCRS"}
# Why a capability may be missing, where it is known: KVM reports XCRS only where the CPU
# has XSAVE (HOST-NOTES: an L1 of `-cpu qemu64,+svm,+npt`).
CAP_WHY = {56: "KVM reports it only on a CPU with XSAVE", 55: "the CPU has no XSAVE"}
_MISSING = re.compile(r"Missing KVM capabilities: \[?((?:0x[0-9a-f]+|\d+)(?:, *(?:0x[0-9a-f]+|"
                      r"\d+))*)\]?")


class FirecrackerOptions(MicroVmOptions):
    source_build = CargoBuild(name="firecracker", title="Firecracker", package="firecracker",
                              # Its default target is musl, which needs a toolchain rustup
                              # may lack; the gnu build has no default seccomp policy (empty).
                              target="x86_64-unknown-linux-gnu",
                              packages=("libclang-dev", "libseccomp-dev"))
    vmm: NonEmpty = plugin.option(
        "firecracker", "The Firecracker binary: a path, or a name on PATH; none found: the "
        "build of `source`, or vmtax's last build")
    vcpus: int = plugin.option(2, "Virtual CPUs (1 or an even number, Firecracker's rule)",
                               unit="vCPUs", ge=1, le=MAX_VCPUS, cli=True, tune=(1, 2, 4))
    hugepages: Literal["2M"] | None = plugin.option(
        None, "Back guest RAM with host 2 MiB huge pages (reserved for the run; Firecracker "
        "has no 1 GiB pages)", tune=("2M",))
    io_engine: Literal["Sync", "Async"] = plugin.option(
        "Sync", "How Firecracker does the scratch disk's I/O: blocking calls on its device "
        "thread, or io_uring (Async, host kernel >= 5.10.51)", tune=("Async",))
    cache_type: Literal["Unsafe", "Writeback"] = plugin.option(
        "Unsafe", "The scratch disk's flushes: Unsafe ignores the guest's (Firecracker's "
        "default), Writeback passes them to the host file", tune=("Writeback",),
        safety={"Unsafe": "ignores the guest's flushes: a host crash loses what it wrote"})

    def problems(self) -> list[tuple[str, str]]:
        problems = super().problems()
        if self.vcpus > 1 and self.vcpus % 2:
            problems.append(("vcpus", f"1 or an even number up to {MAX_VCPUS} "
                                      "(Firecracker's rule)"))
        memory = parse_size(self.memory)
        least = MIN_MEMORY.get(str(self.kernel), MIN_MEMORY_OTHER)
        if memory < least:
            problems.append(("memory", f"at least {least >> 20}M for kernel = "
                                       f'"{self.kernel}" (Firecracker loads the kernel and '
                                       "the initramfs into guest RAM)"))
        elif memory % (1 << 20):
            problems.append(("memory", "a whole number of MiB (Firecracker's mem_size_mib)"))
        return problems


class FirecrackerGuest(MicroVmGuest):
    vmm_name = "Firecracker"
    log_label = "firecracker"
    vcpu_thread = re.compile(r"fc_vcpu (\d+)")
    # Not paused: after Firecracker 1.16's PATCH /vm Paused then Resumed, the agent's vsock
    # connection hung for good (measured in the lab: the next job, 3 s before, got no answer
    # in 75 s); upstream's firecracker#6074 (the vsock device wedged after a bare resume,
    # from its EVENT_IDX support in 1.16.0) and #6100.
    pause_request = resume_request = None

    def _launch(self, files: GuestFiles) -> list[str]:
        target = self.target
        opts = target.opts
        image = target.image()
        trees = target.tree_images()
        drives = [{"drive_id": "scratch", "path_on_host": str(files.disk),
                   "is_root_device": False, "is_read_only": False,
                   "io_engine": opts.io_engine, "cache_type": opts.cache_type}]
        drives += [{"drive_id": f"tree{i}", "path_on_host": str(tree_image),
                    "is_root_device": False, "is_read_only": True}
                   for i, (_, tree_image) in enumerate(trees)]
        config: dict[str, Any] = {
            "boot-source": {"kernel_image_path": str(image.kernel()),
                            "initrd_path": str(image.initramfs()),
                            "boot_args": target.cmdline()},
            "machine-config": {"vcpu_count": opts.vcpus,
                               "mem_size_mib": parse_size(opts.memory) >> 20, "smt": False,
                               "huge_pages": opts.hugepages or "None"},
            "drives": drives,
            "vsock": {"guest_cid": GUEST_CID, "uds_path": str(self.vsock_socket(files))},
        }
        if files.tap is not None:
            config["network-interfaces"] = [{"iface_id": "eth0", "host_dev_name": files.tap.name,
                                             "guest_mac": files.tap.mac}]
        path = files.run_dir / "firecracker.json"
        path.write_text(json.dumps(config, indent=1))
        (files.run_dir / "firecracker.log").touch()
        self.sent = _without_paths(config)
        return [target.vmm_path(), "--config-file", str(path),
                "--api-sock", str(self.api_socket(files)),
                "--log-path", str(files.run_dir / "firecracker.log"), "--level", "Warning"]

    def _stdout(self, files: GuestFiles) -> Path:
        return files.console_log   # the guest's serial console

    def _logs(self, files: GuestFiles) -> list[Path]:
        return [files.run_dir / "firecracker.log", *super()._logs(files)]


def _without_paths(config: dict[str, Any]) -> dict[str, Any]:
    """The configuration as sent, less what changes at each boot (run paths, tap names)."""
    sent: dict[str, Any] = json.loads(json.dumps(config))
    sent["boot-source"].pop("kernel_image_path")
    sent["boot-source"].pop("initrd_path")
    for drive in sent["drives"]:
        drive.pop("path_on_host")
    sent["vsock"].pop("uds_path")
    for nic in sent.get("network-interfaces", []):
        nic.pop("host_dev_name")
        nic.pop("guest_mac")
    return sent


class FirecrackerTarget(MicroVmTarget):
    name = "firecracker"
    description = ("A Firecracker microVM (KVM) booting vmtax's guest kernel and image, its "
                   "agent over vsock: the sandbox serverless platforms run")
    Options = FirecrackerOptions
    guest_class = FirecrackerGuest
    bus = "mmio"
    source_build = Options.source_build
    # Firecracker maps guest RAM without MADV_MERGEABLE: KSM on leaves it as it is.
    ksm_mergeable = False
    # Its start, then the boot to agent READY (minimal kernel in a nested lab: ~10 s).
    startup_seconds = 10.0

    def tree_serial(self, index: int, image: Path) -> str:
        # Firecracker's virtio-blk id is the file's st_dev, st_rdev and st_ino, as decimal
        # text, cut to the 20 bytes of VIRTIO_BLK_ID_BYTES (its block/virtio/device.rs).
        st = os.stat(image)
        return f"{st.st_dev}{st.st_rdev}{st.st_ino}"[:20]

    def refusal(self, files: GuestFiles) -> str | None:
        for log in (files.run_dir / "firecracker.log", files.run_dir / "vmm.log"):
            try:
                found = _MISSING.search(log.read_text(errors="replace"))
            except OSError:
                continue
            if found:
                caps = [int(c, 0) for c in re.split(r", *", found[1])]
                named = ", ".join(KVM_CAPS.get(c, f"capability {c}")
                                  + (f" ({CAP_WHY[c]})" if c in CAP_WHY else "") for c in caps)
                return f"this host's KVM lacks {named}, which Firecracker needs"
        return None
