"""A minimal guest kernel built from Debian's linux-source: the fastest boot this host allows.

Debian's kernel boots a vmtax guest in ~1.6 s under TCG, most of it probing hardware and
initialising subsystems a guest of vmtax never uses, then loading the virtio modules.
`make tinyconfig` plus exactly what a vmtax guest needs, everything built in (no modules,
so the initramfs carries none and /init loads none), boots in well under that. What it
keeps: 64-bit SMP, PVH entry (QEMU boots the ELF directly), paravirt and KVM guest support,
ACPI and PCI (microvm finds its virtio-mmio devices through ACPI; q35 uses virtio-pci),
virtio mmio/pci with the console (the agent's port) and vsock (its channel under
Firecracker and Cloud Hypervisor), block (the scratch disk, ext4) and net
devices, the serial console, the initramfs (gzip or none), and what the agent, busybox and
the workloads use (proc, sysfs, devtmpfs, tmpfs, futex, epoll, timers, SysV IPC and
hugetlbfs for sysbench's --memory-hugetlb, real-time scheduling for cyclictest). What the
defaults bring that no guest uses and that costs boot time under TCG is switched off
(DISABLE): with it, a TCG boot to agent READY took ~0.2-0.5 s less on this host. Three
small edits to the source (SOURCE_EDITS) drop work that only TCG makes dear: poisoning freed
init memory, and calibrating the APIC timer and the CPU clock against the PIT.

The build (unpack ~1.3 GB of source, configure, `make vmlinux`) takes minutes; its result
is cached under the cache's kernels/ by the content hash of the source tarball and of the
configuration, and published by an atomic rename, like Debian's kernels (vmtax.guest.image).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.guest.kernel_cache import Kernel, build_lock, kernel_version, load_kernel, publish_dir
from vmtax.host import build_progress

FORMAT = "3"   # bump when the build or its layout changes, to invalidate caches
SOURCE_GLOB = "/usr/src/linux-source-*.tar.xz"
# Which linux-source to build from when several are installed: a version ("6.1", "6.12")
# or a tarball's path; unset, the newest installed.
SOURCE_ENV = "VMTAX_LINUX_SOURCE"
# Said when a build from it starts, after the tarball's name.
SOURCE_NOTE = f"; {SOURCE_ENV}=VERSION picks another source"
# Debian packages the build needs: `linux-source` is the release's own version (6.1 on
# Debian 12, 6.12 on Debian 13); any installed linux-source-X.Y works.
PACKAGES = ("linux-source", "build-essential", "flex", "bison", "bc", "libelf-dev",
            "xz-utils")
# On top of tinyconfig; each must be =y after olddefconfig, or the build stops and says
# which one was dropped (a missing dependency would otherwise drop it silently: without
# VIRTIO_MENU, VIRTIO_MMIO goes and the guest never finds its agent port).
CONFIG = (
    "64BIT", "SMP", "HYPERVISOR_GUEST", "PARAVIRT", "KVM_GUEST", "PVH", "ACPI", "PCI",
    "PCI_DIRECT", "VIRTIO_MENU", "VIRTIO", "VIRTIO_MMIO", "VIRTIO_MMIO_CMDLINE_DEVICES",
    "VIRTIO_PCI", "VIRTIO_CONSOLE", "VIRTIO_BLK", "NETDEVICES", "NET_CORE", "VIRTIO_NET",
    "NET", "INET", "UNIX", "PACKET", "BLOCK", "EXT4_FS", "TTY", "SERIAL_8250",
    "SERIAL_8250_CONSOLE", "PRINTK", "BINFMT_ELF", "BINFMT_SCRIPT", "BLK_DEV_INITRD",
    "RD_GZIP", "PROC_FS", "SYSFS", "DEVTMPFS", "TMPFS", "SHMEM", "FUTEX", "EPOLL",
    "SIGNALFD", "TIMERFD", "EVENTFD", "POSIX_TIMERS", "HIGH_RES_TIMERS", "HUGETLBFS",
    "MULTIUSER", "SYSVIPC", "FILE_LOCKING", "RTC_CLASS", "POSIX_MQUEUE", "PROC_SYSCTL",
    "UNIX98_PTYS", "NO_HZ_IDLE",
    # The agent's channel under a VMM without virtio-serial (Firecracker, Cloud Hypervisor).
    "VSOCKETS", "VIRTIO_VSOCKETS",
    # Cloud Hypervisor's virtio-pci devices signal by MSI-X only (no INTx): without it the
    # kernel hung at its first disk request, its console silent after "io scheduler kyber
    # registered" (in the lab).
    "PCI_MSI",
)
# What tinyconfig or the options above bring by default that a vmtax guest never uses, and
# that costs boot time under TCG (measured with initcall_debug, on a busy 2-core host):
# legacy BSD ptys register 512 devices (pty_init, 0.2-0.5 s); the i8042 controller, the
# keyboard, mouse and VT are probed or set up for hardware microvm lacks; IPv6 (inet6_init,
# ~30 ms; vmtax guests speak IPv4); ACPI's laptop drivers; Intel uncore/RAPL/C-state PMUs
# probed through MSRs TCG does not have. The guest is stopped through QMP (quit), not its
# power button, so ACPI_BUTTON and the input layer go too.
DISABLE = (
    "LEGACY_PTYS", "VT", "INPUT", "SERIO", "HID", "IPV6", "ACPI_AC", "ACPI_BATTERY",
    "ACPI_BUTTON", "ACPI_FAN", "ACPI_THERMAL", "ACPI_TABLE_UPGRADE", "PNP_DEBUG_MESSAGES",
    "PERF_EVENTS_INTEL_UNCORE", "PERF_EVENTS_INTEL_RAPL", "PERF_EVENTS_INTEL_CSTATE",
)
# One serial port (the console) instead of probing four.
SETTINGS = {"SERIAL_8250_NR_UARTS": "1", "SERIAL_8250_RUNTIME_UARTS": "1"}
# The guest's timer tick: cyclictest and the lpj= vmtax passes both depend on it.
HZ = 1000
# Edits to the source, each (file, text, replacement): boot-time work that TCG makes dear
# and no option turns off (measured by sampling the guest's instruction pointer through QMP
# during boots, on this 2-core host). An edit whose text a source version lacks is skipped:
# that version's guests boot as before. meta.json lists the edits made ("edits").
SOURCE_EDITS = {
    # Freed init memory is poisoned page by page. Under TCG every store to a page that held
    # executed, hence translated, code takes QEMU's self-modifying-code path: 0.1-0.25 s for
    # the kernel's ~750 KiB of init code. Unpoisoned, the pages are freed as they are.
    "no-init-poison": ("arch/x86/mm/init.c", "POISON_FREE_INITMEM, what);", "-1, what);"),
    # lapic_timer_period= on the command line (vmtax.guest.qemu gives QEMU's APIC bus rate):
    # the kernel then skips calibrating the APIC timer against the PIT, which takes 100 ticks
    # (0.1 s) and under TCG is off by a few per cent anyway.
    "lapic_timer_period": (
        "arch/x86/kernel/apic/apic.c", "unsigned int lapic_timer_period = 0;\n",
        "unsigned int lapic_timer_period = 0;\n\n"
        "static int __init lapic_timer_period_setup(char *arg)\n"
        "{\n\treturn kstrtouint(arg, 0, &lapic_timer_period);\n}\n"
        'early_param("lapic_timer_period", lapic_timer_period_setup);\n'),
    # With tsc_early_khz= given, the CPU's clock is taken to be the TSC's (a QEMU vCPU's are
    # one clock) instead of being measured against the PIT (up to 50 ms).
    "cpu_khz": ("arch/x86/kernel/tsc.c", "\t\tcpu_khz = x86_platform.calibrate_cpu();\n",
                "\t\tcpu_khz = tsc_early_khz ?: x86_platform.calibrate_cpu();\n"),
}
# The command-line parameters an edit adds (the kernel's meta.json "params").
EDIT_PARAMS = {"lapic_timer_period": "lapic_timer_period"}
BUILD_TIMEOUT = 3600.0
# The lines kbuild prints building vmlinux, the bar's total until a build here has counted
# them: 1,924 from linux-source-6.12 on Debian 12.
EXPECTED_STEPS = 1900


def config_lines() -> list[str]:
    """The configuration fragment merged onto tinyconfig (also what the cache key hashes)."""
    return [*(f"CONFIG_{name}=y" for name in CONFIG), f"CONFIG_HZ_{HZ}=y",
            *(f"# CONFIG_{name} is not set" for name in DISABLE),
            *(f"CONFIG_{name}={value}" for name, value in SETTINGS.items())]


def source_version(tarball: Path) -> tuple[int, ...]:
    """(6, 12) for linux-source-6.12.tar.xz: compared as numbers, 6.12 is newer than 6.1."""
    found = re.search(r"linux-source-([\d.]+?)\.tar", tarball.name)
    return tuple(int(n) for n in found[1].split(".")) if found else ()


def source_tarball() -> Path:
    """Debian's linux-source tarball: the one VMTAX_LINUX_SOURCE names, else the newest
    installed."""
    installed = sorted((Path(p) for p in glob.glob(SOURCE_GLOB)), key=source_version)
    wanted = os.environ.get(SOURCE_ENV, "").strip()
    if wanted:
        if "/" in wanted:
            if not Path(wanted).is_file():
                raise VmtaxError(f"{SOURCE_ENV}={wanted}: no such file")
            return Path(wanted)
        chosen = [p for p in installed if p.name == f"linux-source-{wanted}.tar.xz"]
        if not chosen:
            have = ", ".join(".".join(map(str, source_version(p))) for p in installed)
            raise VmtaxError(f"{SOURCE_ENV}={wanted}: linux-source-{wanted} is not installed "
                             f"(installed: {have or 'none'}); apt-get install "
                             f"linux-source-{wanted}")
        return chosen[0]
    if not installed:
        raise VmtaxError("kernel = \"minimal\" builds from Debian's linux-source, which is not "
                         f"installed; apt-get install {' '.join(PACKAGES)}")
    return installed[-1]


@functools.lru_cache(maxsize=4)
def _file_sha256(path: Path, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tarball_sha256(tarball: Path) -> str:
    """The source tarball's SHA-256 (computed once per file version)."""
    st = tarball.stat()
    return _file_sha256(tarball, st.st_size, st.st_mtime_ns)


def cache_key(tarball: Path) -> str:
    """Content hash of the source, the configuration and the source edits."""
    h = hashlib.sha256(f"{FORMAT}\0".encode())
    h.update(tarball_sha256(tarball).encode())
    h.update("\n".join(config_lines()).encode())
    h.update(json.dumps(SOURCE_EDITS, sort_keys=True).encode())
    return h.hexdigest()[:16]


def edit_source(tree: Path) -> list[str]:
    """Make SOURCE_EDITS in the unpacked tree; the names of those made (each text once)."""
    made = []
    for name, (rel, text, replacement) in SOURCE_EDITS.items():
        path = tree / rel
        if path.is_file() and (source := path.read_text()).count(text) == 1:
            path.write_text(source.replace(text, replacement))
            made.append(name)
    return made


def unpack_tinyconfig(tarball: Path, into: Path, build: build_progress.Build) -> Path:
    """Unpack the source into the directory `into` and `make tinyconfig`; the source tree.
    (The kernel tree of the compile workload starts the same way: vmtax.helpers.kernel_tree.)"""
    build.run(["tar", "-xf", str(tarball), "-C", str(into)], into, f"unpacking {tarball.name}",
              timeout=BUILD_TIMEOUT)
    tree = next(p for p in into.iterdir() if p.is_dir())
    build.run(["make", "tinyconfig"], tree, "make tinyconfig", timeout=600)
    return tree


def check_config(config: str) -> list[str]:
    """The wanted options a finished .config lacks (dropped by olddefconfig), the unwanted
    ones it still has (selected by another), and the settings it has otherwise."""
    found = dict(re.findall(r"^CONFIG_(\w+)=(.*)$", config, re.MULTILINE))
    return ([name for name in (*CONFIG, f"HZ_{HZ}") if found.get(name) != "y"]
            + [f"{name}=n" for name in DISABLE if name in found]
            + [f"{name}={value}" for name, value in SETTINGS.items()
               if found.get(name) != value])


def build(tarball: Path, dest: Path, jobs: int | None = None) -> None:
    """Unpack, configure and build vmlinux into dest (meta.json as vmtax.guest.image reads it)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        with build_progress.Build(f"minimal guest kernel from {tarball.name}",
                                  "minimal-kernel", SOURCE_NOTE) as progress:
            tree = unpack_tinyconfig(tarball, tmp, progress)
            edits = edit_source(tree)
            fragment = tree / "vmtax.config"
            fragment.write_text("\n".join(config_lines()) + "\n")
            # olddefconfig then resolves dependencies and drops what cannot be had (checked
            # below).
            progress.run(["scripts/kconfig/merge_config.sh", "-m", ".config", "vmtax.config"],
                         tree, "merging vmtax's configuration", timeout=600)
            progress.run(["make", "olddefconfig"], tree, "make olddefconfig", timeout=600)
            config = (tree / ".config").read_text()
            missing = check_config(config)
            if missing:
                raise VmtaxError(f"minimal kernel: {tarball.name} cannot have "
                                 + ", ".join(f"CONFIG_{m}" for m in missing))
            progress.run(["make", f"-j{jobs or os.cpu_count() or 1}", "vmlinux"], tree,
                         "make vmlinux", timeout=BUILD_TIMEOUT,
                         steps=build_progress.KBUILD_STEP,
                         key=f"minimal-kernel {tarball.name}", expected=EXPECTED_STEPS)
        data = (tree / "vmlinux").read_bytes()
        out = tmp / "out"
        out.mkdir()
        (out / "vmlinux").write_bytes(data)
        (out / "config").write_text(config)
        (out / "meta.json").write_text(json.dumps(
            {"path": "vmlinux", "version": kernel_version(data) or "unknown",
             "sha256": hashlib.sha256(data).hexdigest(), "modules": {}, "hz": HZ,
             "source": str(tarball), "config": config_lines(), "edits": edits,
             "params": [EDIT_PARAMS[e] for e in edits if e in EDIT_PARAMS]}, indent=1))
        shutil.rmtree(tree)   # ~1.5 GB of objects: only vmlinux and its config are kept
        publish_dir(out, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cached(cache: Path) -> Path | None:
    """The built kernel's directory in cache for the installed source, if it is built."""
    try:
        dest = cache / "kernels" / f"minimal-{cache_key(source_tarball())}"
    except VmtaxError:
        return None
    return dest if (dest / "meta.json").exists() else None


def minimal_kernel(cache: Path, jobs: int | None = None) -> Kernel:
    """The minimal kernel for the installed linux-source, built on first use (minutes)."""
    tarball = source_tarball()
    dest = cache / "kernels" / f"minimal-{cache_key(tarball)}"
    if not (dest / "meta.json").exists():
        with build_lock(dest):
            if not (dest / "meta.json").exists():   # another process may have built it
                build(tarball, dest, jobs)
    return load_kernel(dest)


def main() -> int:
    """Build it ahead of time (make test does, for its live tests); quiet when it is built."""
    try:
        minimal_kernel(paths.cache_dir())
    except VmtaxError as exc:
        print(f"vmtax: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":   # python -m vmtax.guest.minimal_kernel
    sys.exit(main())
