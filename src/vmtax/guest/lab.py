"""The lab: one TCG guest with emulated AMD-V (QEMU's SVM + NPT) that is a KVM host, in
which vmtax runs on the host's own files (`vmtax lab`).

Design: the host's root, read-only over 9p, under an overlay whose upper layer is an ext4
disk (a sparse file in the lab's share, gone with it), is the lab's root. So the lab runs
the very vmtax, venv, QEMU, perf and caches of the host without copying a byte, nothing it
writes reaches the host's files, and a lab ends without leaving anything but what it was
asked to hand back. A second,
writable 9p share (a journaled directory of the host's) carries the job in and the exit
status and the results database out. The kernel is Debian's guest kernel (vmtax's cache):
it has kvm_amd; its whole module tree sits beside it in the cache and is bound to
/lib/modules/VERSION in the lab, so modprobe (and the kernel's own module requests: tun,
bridge, vhost_net) work there as on any Debian host.

This module has both halves: the host's (the kernel and its modules, the initramfs, QEMU's
command line, the checks) and, run as `python -m vmtax.guest.lab JOB` by the lab's /init
after its chroot, the lab's: it runs the job's commands in turn (a session), each one's
stdout and stderr on a virtio console of its own (hvc0, hvc1: QEMU writes them to OUT_LOG
and ERR_LOG in the share), records where each one's output starts and ends and its exit
status (COMMANDS), and beats a heartbeat into the share every HEARTBEAT_EVERY seconds, so
the host can tell a lab that stopped (its kernel hung, its QEMU stopped) from a slow one.

Every run made in the lab records LABEL in its host facts (VMTAX_LAB, read by
vmtax.host.machine.fingerprint): numbers of a KVM nested under TCG keep the shape of the
tax, never hardware's figures.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import json
import os
import pty
import re
import select
import shlex
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypedDict

from vmtax.core.errors import VmtaxError
from vmtax.guest.image import (CpioEntry, _check, _download_deb, _insmod_order, _run_tool,
                               debian_kernel, extract_vmlinux, write_cpio)
from vmtax.guest.kernel_cache import build_lock, publish_dir
from vmtax.guest.qemu import BOOT_SPEEDUPS, _opt, find_qemu, host_tsc_khz
from vmtax.host import machine as host
from vmtax.host import proc
from vmtax.host.machine import LAB_ENV, LAB_LABEL

__all__ = ["LAB_ENV", "LAB_LABEL"]

FORMAT = "4"    # bump when the lab's kernel directory or initramfs layout changes
# The lab's CPU: QEMU's TCG emulates AMD-V; it has no VMX (Intel) emulation at all. Another
# model given (`vmtax lab --cpu`) gets SVM_FLAGS added.
CPU = "max,+svm,+npt"
SVM_FLAGS = ("+svm", "+npt")
# A Debian kernel package for the lab's own kernel (`vmtax lab --kernel`), fetched with apt.
KERNEL_PACKAGE = re.compile(r"linux-image-[0-9][a-z0-9.+~-]*")
# Loaded by the initramfs: enough to mount the host's root over 9p under an overlay.
EARLY_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay", "virtio_console",
                 "virtio_blk", "crc32c_generic", "ext4")
# The overlay's upper layer: an ext4 disk, a sparse file in the lab's share on the host.
# Not a tmpfs: what the lab writes (a native fileio's 2 GiB, its guests' scratch disks)
# would take the lab's RAM, and its native fileio would measure RAM, not a disk.
UPPER = "upper.img"
UPPER_BYTES_PER_INODE = 64 << 10
# Loaded in the lab before the command: KVM itself, then what vm targets may ask for.
KVM_MODULE = "kvm_amd"
OPTIONAL_MODULES = ("vhost_net", "vhost_vsock", "tun", "bridge", "veth")
# The devices some of them make, which vmtax's targets check for.
MODULE_DEVICES = {"vhost_net": "/dev/vhost-net", "vhost_vsock": "/dev/vhost-vsock",
                  "tun": "/dev/net/tun"}
KVM_DEVICES = ("/dev/kvm", "/dev/vhost-net", "/dev/vhost-vsock")
LIBVIRT_CAPABILITIES = "libvirt-qemu-capabilities"
LIBVIRT_CAPABILITIES_DIR = "/var/cache/libvirt/qemu/capabilities"
LIBVIRT_QEMU_CONF = "/etc/libvirt/qemu.conf"
HOST_TAG, LAB_TAG, CACHE_TAG = "host", "lab", "cache"
# Where the lab's writable share is mounted, inside the lab.
SHARE = "/vmtax-lab"
JOB, RC, RESULTS, PYTHON, TIMINGS = "job.json", "rc", "results", "python", "timings.json"
# What QEMU writes into the share: the lab's kernel console (ttyS0), and its commands'
# stdout (hvc0) and stderr (hvc1).
CONSOLE_LOG, OUT_LOG, ERR_LOG = "console.log", "out.log", "err.log"
# Per command of the job, as it starts and ends: its argv, the offsets of its output in
# OUT_LOG and ERR_LOG ([start, end]; end None while it runs) and its exit status.
COMMANDS = "commands.json"
# Written by the lab's own vmtax as it starts: the lab has booted (the host's watchdog).
STARTED = "started"
# The lab's uptime, written every HEARTBEAT_EVERY seconds from then on.
HEARTBEAT = "heartbeat"
HEARTBEAT_EVERY = 2.0
# Where the lab's studies make their work directories (a native fileio's files, guests'
# disks): the lab's own disk (the overlay's upper layer), never the share on the host's.
WORK = "/var/tmp/vmtax-lab"
# The lab's results directory: in the share, so each repetition is on the host's disk the
# moment it is stored (one writer, the lab's vmtax; the host reads it once the lab is gone).
LAB_RESULTS = f"{SHARE}/{RESULTS}"
# What QEMU, its 9p servers and TCG's translation cache take beside the lab's RAM.
QEMU_OVERHEAD = 512 << 20


@dataclass(frozen=True)
class LabKernel:
    vmlinux: Path
    version: str
    modules_tree: Path      # lib/modules/VERSION, with modules.dep
    initramfs: Path


# Each step says so on the console (with the kernel's time): a lab that hangs while booting
# shows where.
_INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
say() {{ echo "lab: $(cut -d' ' -f1 /proc/uptime) s: $*"; }}
say init
for ko in $(cat /lab/modules.list); do
  insmod /lab/modules/$ko || echo "lab: insmod $ko failed"
done
say modules loaded
mkdir -p /host /t /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000 {host} /host || echo "lab: no 9p root"
mount -t ext4 /dev/vda /t || echo "lab: no upper disk"
mkdir -p /t/upper /t/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/t/upper,workdir=/t/work /newroot
mkdir -p /newroot{share}
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 {lab} /newroot{share}
say root mounted, chroot
umount /proc /sys
mount --move /dev /newroot/dev
exec chroot /newroot "$(cat /newroot{share}/{python})" -m vmtax.guest.lab {share}/{job}
echo "lab: chroot failed"
echo b > /proc/sysrq-trigger
"""


def _build_lab_kernel(deb: Path, version: str | None, dest: Path,
                      vmlinux: bool = False) -> None:
    """The lab's initramfs and the module tree of the kernel package deb (version: the one
    it holds, None: found in it), and with vmlinux its kernel, uncompressed, too."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        unpacked = tmp / "unpacked"
        _check(_run_tool(["dpkg-deb", "-x", str(deb), str(unpacked)]))
        if version is None:
            version = next((d.name for d in (unpacked / "lib" / "modules").glob("*")), "")
        if vmlinux:
            elf = next((extract_vmlinux(z.read_bytes())
                        for z in (unpacked / "boot").glob(f"vmlinuz-{version}")), None)
            if elf is None:
                raise VmtaxError(f"lab: {deb.name} holds no boot/vmlinuz-{version} with a "
                                 "compressed ELF kernel inside")
            (tmp / "vmlinux").write_bytes(elf)
        _check(_run_tool(["depmod", "-b", str(unpacked), version]))
        try:
            _insmod_order(unpacked, version, KVM_MODULE)
        except VmtaxError:
            raise VmtaxError(f"lab: the guest kernel {version} ({deb.name}) has no "
                             f"{KVM_MODULE} module; the lab needs it to run KVM") from None
        early = list(dict.fromkeys(ko for m in EARLY_MODULES
                                   for ko in _insmod_order(unpacked, version, m)))
        busybox = shutil.which("busybox")
        if busybox is None:
            raise VmtaxError("lab: busybox is not installed (apt-get install busybox-static)")
        entries = [CpioEntry(d, stat.S_IFDIR | 0o755)
                   for d in ("bin", "dev", "lab", "lab/modules", "proc", "sys")]
        entries += [CpioEntry("bin/busybox", stat.S_IFREG | 0o755, Path(busybox)),
                    CpioEntry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)),
                    CpioEntry("init", stat.S_IFREG | 0o755, _INIT.format(
                        host=HOST_TAG, lab=LAB_TAG, share=SHARE, python=PYTHON,
                        job=JOB).encode()),
                    CpioEntry("lab/modules.list", stat.S_IFREG | 0o644,
                              "".join(ko.name + "\n" for ko in early).encode())]
        entries += [CpioEntry(f"lab/modules/{ko.name}", stat.S_IFREG | 0o644, ko)
                    for ko in early]
        with open(tmp / "initramfs.cpio", "wb") as f:
            write_cpio(f, sorted(entries, key=lambda e: e.name))
        os.rename(unpacked / "lib" / "modules" / version, tmp / "modules")
        shutil.rmtree(unpacked)
        (tmp / "meta.json").write_text(json.dumps({"version": version, "source": deb.name}))
        publish_dir(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _built(dest: Path, build: Callable[[], None]) -> dict[str, Any]:
    """dest's meta.json, once build() has made dest (once, whoever asks at the same time)."""
    if not (dest / "meta.json").exists():
        with build_lock(dest):
            if not (dest / "meta.json").exists():
                build()
    meta: dict[str, Any] = json.loads((dest / "meta.json").read_text())
    return meta


def lab_kernel(cache: Path, package: str | None = None) -> LabKernel:
    """The lab's kernel, its whole module tree and the lab's initramfs, built once into
    vmtax's cache: Debian's guest kernel (as for any guest), or the Debian kernel package
    named (`vmtax lab --kernel`, fetched with apt; its kernel kept beside, not among the
    guests' kernels, which it must not replace)."""
    if package is not None:
        if not KERNEL_PACKAGE.fullmatch(package):
            raise VmtaxError(f"lab: --kernel {package!r}: expected a Debian kernel package "
                             "name, like linux-image-6.12.107+deb12-amd64-unsigned")
        deb = _download_deb(package, cache / "debs")
        dest = cache / "lab" / f"{deb.stem}-{deb.stat().st_size}-f{FORMAT}"
        meta = _built(dest, lambda: _build_lab_kernel(deb, None, dest, vmlinux=True))
        return LabKernel(dest / "vmlinux", meta["version"], dest / "modules",
                         dest / "initramfs.cpio")
    kernel = debian_kernel(cache)
    source = json.loads((kernel.path.parent / "meta.json").read_text()).get("source")
    guest_deb = cache / "debs" / str(source)
    dest = cache / "lab" / f"{kernel.version}-{kernel.sha256[:12]}-f{FORMAT}"
    if not (dest / "meta.json").exists() and (not source or not guest_deb.is_file()):
        raise VmtaxError(f"lab: the .deb of the guest kernel {kernel.version} is not in "
                         f"{cache / 'debs'}; clear {kernel.path.parent} to fetch it again")
    _built(dest, lambda: _build_lab_kernel(guest_deb, kernel.version, dest))
    return LabKernel(kernel.path, kernel.version, dest / "modules",
                     dest / "initramfs.cpio")


def devices(kernel: LabKernel) -> frozenset[str]:
    """The devices the lab will have from its kernel's modules (MODULE_DEVICES)."""
    dep = (kernel.modules_tree / "modules.dep").read_text()
    have = {Path(line.split(":", 1)[0]).name.split(".ko", 1)[0] for line in dep.splitlines()}
    return frozenset(dev for module, dev in MODULE_DEVICES.items() if module in have)


@dataclass(frozen=True)
class Machine:
    """The lab's virtual machine: what `vmtax lab` sizes and the fault census varies."""
    vcpus: int = 2
    memory: int = 4 << 30                 # bytes
    cpu: str = CPU                        # QEMU's -cpu, with SVM_FLAGS
    tb_size: int | None = None            # TCG's translation cache, MiB; None: QEMU's
    tcg_thread: str = "multi"             # one host thread per vCPU, or "single"


def cpu_model(cpu: str) -> str:
    """The -cpu of a lab asked for cpu: with AMD-V and nested paging (SVM_FLAGS) added."""
    flags = cpu.split(",")
    return ",".join([*flags, *(f for f in SVM_FLAGS if f not in flags)])


def svm_problem(qemu: str, cpu: str = CPU) -> str | None:
    """Why this QEMU's TCG cannot emulate AMD-V with the CPU model cpu (None: it can):
    QEMU itself is asked to start a paused machine with it and `enforce`, then to quit."""
    binary = find_qemu(qemu)
    model = cpu_model(cpu)
    try:
        out = subprocess.run(
            [binary, "-nodefaults", "-no-user-config", "-display", "none", "-M", "q35",
             "-accel", "tcg", "-cpu", model + ",enforce", "-S", "-qmp", "stdio"],
            input='{"execute":"qmp_capabilities"}\n{"execute":"quit"}\n',
            capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{binary} could not be asked ({exc})"
    if out.returncode != 0:
        said = [line.removeprefix(f"{binary}: ") for line in out.stderr.splitlines()]
        return (f"{binary}'s TCG does not emulate AMD-V ({model}): "
                + ("; ".join(said[-2:]) or f"exit status {out.returncode}"))
    return None


def memory_problem(memory: int) -> str | None:
    available = host.available_memory_bytes()
    if available is not None and memory + QEMU_OVERHEAD > available:
        return (f"a lab of {memory >> 20} MiB (+{QEMU_OVERHEAD >> 20} MiB for QEMU) does not "
                f"fit in this host's {available >> 20} MiB of available memory; "
                "give --memory less")
    return None


def lab_argv(qemu: str, kernel: LabKernel, machine: Machine, share: Path,
             cache: Path) -> list[str]:
    """QEMU's command line for a lab machine whose writable share is the host's directory
    share (CONSOLE_LOG, OUT_LOG and ERR_LOG are written there too). vmtax's cache is
    shared writable too: what the lab builds (a guest's rootfs and initramfs, in minutes
    under TCG) is built once, for the host and every later lab; builds are published by
    atomic renames (vmtax.guest.kernel_cache), which hold over 9p, though their build
    locks do not reach the host's builders there."""
    tsc_khz = host_tsc_khz()
    # Every kernel message, from the first, in console.log (a lab once hung while booting
    # with nothing there at loglevel=4): a few hundred lines, under 0.2 s on TCG's serial.
    append = ["console=ttyS0", "earlyprintk=serial,ttyS0", "loglevel=7", "panic=-1",
              *BOOT_SPEEDUPS, "rdinit=/init"]
    if tsc_khz:
        append.append(f"tsc_early_khz={tsc_khz}")
    tcg = f"tcg,thread={machine.tcg_thread}" + (
        f",tb-size={machine.tb_size}" if machine.tb_size else "")
    consoles = []
    for name, log in (("out", OUT_LOG), ("err", ERR_LOG)):   # hvc0, hvc1
        consoles += ["-chardev", f"file,id={name},path={_opt(share / log)}",
                     "-device", f"virtconsole,chardev={name}"]
    return [qemu, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-accel", tcg, "-M", "q35", "-cpu", cpu_model(machine.cpu),
            "-smp", str(machine.vcpus), "-m", f"{machine.memory >> 20}M",
            "-kernel", str(kernel.vmlinux), "-initrd", str(kernel.initramfs),
            "-append", " ".join(append),
            "-chardev", f"file,id=console,path={_opt(share / CONSOLE_LOG)}",
            "-serial", "chardev:console",
            "-fsdev", f"local,id={HOST_TAG},path=/,security_model=none,readonly=on",
            "-device", f"virtio-9p-pci,fsdev={HOST_TAG},mount_tag={HOST_TAG}",
            "-fsdev", f"local,id={LAB_TAG},path={_opt(share)},security_model=none",
            "-device", f"virtio-9p-pci,fsdev={LAB_TAG},mount_tag={LAB_TAG}",
            "-fsdev", f"local,id={CACHE_TAG},path={_opt(cache)},security_model=none",
            "-device", f"virtio-9p-pci,fsdev={CACHE_TAG},mount_tag={CACHE_TAG}",
            "-drive", f"if=none,id=upper,format=raw,file={_opt(share / UPPER)},cache=writeback",
            "-device", "virtio-blk-pci,drive=upper",
            "-device", "virtio-serial-pci,id=vser", *consoles]


class LabJob(TypedDict):
    """What the lab runs, as JOB in the share holds it."""
    commands: list[list[str]]   # argv lists, run in turn until one fails
    cwd: str
    env: dict[str, str]
    tty: bool
    modules: str                # the kernel modules' tree
    version: str                # the kernel's release


def write_job(share: Path, commands: list[list[str]], cwd: str, modules_tree: Path,
              version: str, env: dict[str, str], tty: bool) -> None:
    """The lab's job: its commands (argv lists), run in turn until one fails."""
    (share / PYTHON).write_text(sys.executable)
    job = LabJob(commands=commands, cwd=cwd, env=env, tty=tty, modules=str(modules_tree),
                 version=version)
    (share / JOB).write_text(json.dumps(job))


# --- inside the lab -----------------------------------------------------------------------

_MOUNTS = (("proc", "proc", "/proc", ""), ("sysfs", "sysfs", "/sys", ""),
           ("devpts", "devpts", "/dev/pts", "gid=5,mode=620"),
           # /run: the host's runtime directory (its journals) is not the lab's. /tmp stays
           # the host's, under the overlay: a command started in a directory there finds it.
           ("tmpfs", "tmpfs", "/dev/shm", "mode=1777"), ("tmpfs", "tmpfs", "/run", "mode=0755"),
           ("tracefs", "tracefs", "/sys/kernel/tracing", ""),
           ("debugfs", "debugfs", "/sys/kernel/debug", ""),
           ("hugetlbfs", "hugetlbfs", "/dev/hugepages", ""))


def _say(text: str) -> None:
    with open("/dev/console", "w") as console:
        console.write(f"lab: {text}\n")


def _mount(fstype: str, source: str, target: str, options: str = "") -> None:
    os.makedirs(target, exist_ok=True)
    argv = ["mount", "-t", fstype, *(["-o", options] if options else []), source, target]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        _say(f"mount {target}: {done.stderr.strip()}")


def _prepare(job: LabJob) -> str | None:
    """The lab's mounts and modules; why KVM cannot run (None: it can)."""
    for fstype, source, target, options in _MOUNTS:
        _mount(fstype, source, target, options)
    _mount("9p", CACHE_TAG, job["env"]["VMTAX_CACHE"],
           "trans=virtio,version=9p2000.L,msize=512000")
    os.makedirs(WORK, exist_ok=True)
    # libvirtd's QEMU capabilities, probed in a lab: kept in vmtax's cache for the next
    # lab (the host's own are stale here, KVM being usable: probing both QEMU binaries
    # again took libvirtd 3.6 min under TCG, before its first answer).
    capabilities = Path(job["env"]["VMTAX_CACHE"]) / "lab" / LIBVIRT_CAPABILITIES
    capabilities.mkdir(parents=True, exist_ok=True)
    os.makedirs(LIBVIRT_CAPABILITIES_DIR, exist_ok=True)
    subprocess.run(["mount", "--bind", str(capabilities), LIBVIRT_CAPABILITIES_DIR],
                   check=False)
    _libvirt_without_namespaces()
    # The lab has no network but its loopback, which nothing else brings up: native's
    # iperf3 (client and server on 127.0.0.1) found "Network is unreachable".
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)
    modules = Path("/lib/modules") / job["version"]
    modules.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", job["modules"], str(modules)], check=False)
    for module in OPTIONAL_MODULES:
        subprocess.run(["modprobe", module], capture_output=True)
    done = subprocess.run(["modprobe", KVM_MODULE], capture_output=True, text=True)
    if done.returncode != 0 or not os.path.exists("/dev/kvm"):
        return f"modprobe {KVM_MODULE} failed: {done.stderr.strip() or 'no /dev/kvm'}"
    _udev_modes()
    return None


def _libvirt_without_namespaces() -> None:
    """The lab's libvirtd gives each QEMU the lab's own /dev (its qemu.conf: the lab's copy,
    on the overlay; the host's is never written). With its default, a private /dev per QEMU
    populated by libvirt, QEMU found neither /dev/null nor /dev/kvm in the lab: "Could not
    access KVM kernel module"."""
    with contextlib.suppress(OSError), open(LIBVIRT_QEMU_CONF, "a") as conf:
        conf.write("\n# vmtax lab: no private /dev per QEMU\nnamespaces = []\n")


def _udev_modes() -> None:
    """What a Debian host's udev does and the lab (no udev) must: KVM's devices for the
    group kvm. Without it, libvirt's QEMU (user libvirt-qemu) cannot open /dev/kvm, and
    libvirt refuses every KVM domain: "Emulator … does not support virt type 'kvm'"."""
    with contextlib.suppress(KeyError):
        gid = grp.getgrnam("kvm").gr_gid
        for device in KVM_DEVICES:
            with contextlib.suppress(FileNotFoundError):
                os.chown(device, 0, gid)
                os.chmod(device, 0o660)


class _Stream:
    """One of the lab's output consoles: what is written to it, counted."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.written = 0

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        self.written += len(data)


def _window(fd: int, env: dict[str, str]) -> None:
    """A pty of the lab sized as the host's terminal (COLUMNS, LINES), passing bytes as
    they are: no "\r" added to each "\n" (the host's terminal adds its own)."""
    attrs = termios.tcgetattr(fd)
    attrs[1] &= ~termios.OPOST
    termios.tcsetattr(fd, termios.TCSANOW, attrs)
    with contextlib.suppress(ValueError, OSError):
        size = struct.pack("HHHH", int(env.get("LINES", 24)), int(env.get("COLUMNS", 80)), 0, 0)
        fcntl.ioctl(fd, termios.TIOCSWINSZ, size)


def _run(argv: list[str], cwd: str, env: dict[str, str], out: _Stream, err: _Stream,
         tty: bool) -> int:
    """The command, its stdout onto out and its stderr onto err: through a pty each when
    the host's side is a terminal (live progress, colours), else through pipes, so that
    it writes plain lines as it would into a host's log. Once it has exited, what it
    left running (a daemon that kept its output open) is not waited for."""
    ptys = [pty.openpty() for _ in range(2)] if tty else []
    for _, slave in ptys:
        _window(slave, env)
    ends = [slave for _, slave in ptys] or [subprocess.PIPE, subprocess.PIPE]
    with subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=ends[0],
                          stderr=ends[1]) as child:
        for _, slave in ptys:
            os.close(slave)
        reading = [master for master, _ in ptys] or [
            child.stdout.fileno(), child.stderr.fileno()]   # type: ignore[union-attr]
        into = dict(zip(reading, (out, err)))
        exited_at = None
        while reading:
            ready, _, _ = select.select(reading, [], [], 0.5)
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:   # a pty whose last writer is gone
                    data = b""
                if data:
                    into[fd].write(data)
                else:
                    reading.remove(fd)
            if child.poll() is not None and not ready:
                exited_at = exited_at or time.monotonic()
                if time.monotonic() - exited_at > 1.0:
                    break
        child.wait()
    for master, _ in ptys:
        os.close(master)
    return child.returncode


def _uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def _beat(share: Path) -> None:
    """The lab's heartbeat: its uptime into the share every HEARTBEAT_EVERY seconds, from
    a thread of its own, as long as the lab's kernel runs its processes."""
    def beat() -> None:
        while True:
            with contextlib.suppress(OSError):
                (share / HEARTBEAT).write_text(f"{_uptime():.1f}")
            time.sleep(HEARTBEAT_EVERY)
    threading.Thread(target=beat, daemon=True).start()


def _run_commands(job: LabJob, share: Path, out: _Stream, err: _Stream) -> int:
    """The job's commands in turn, each recorded in COMMANDS as it starts and ends, until
    one fails: its exit status (or the last one's)."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           **job["env"]}
    records: list[dict[str, Any]] = []
    rc = 0
    for argv in job["commands"]:
        record: dict[str, Any] = {"argv": argv, "out": [out.written, None],
                                  "err": [err.written, None], "rc": None,
                                  "started": _uptime()}
        records.append(record)
        (share / COMMANDS).write_text(json.dumps(records))
        rc = _run(argv, job["cwd"], env, out, err, job.get("tty", False))
        if rc < 0:
            err.write(f"vmtax: error: lab: {shlex.join(argv[2:4])} died of signal "
                      f"{signal.Signals(-rc).name}\n".encode())
        record.update(out=[record["out"][0], out.written], err=[record["err"][0], err.written],
                      rc=rc, seconds=round(_uptime() - record["started"], 2))
        (share / COMMANDS).write_text(json.dumps(records))
        if rc != 0:
            break
    return rc


def inside(job_path: str) -> int:
    """The lab's side: mounts, KVM, the commands (their output on the virtio consoles),
    then the exit status and the results handed back through the share, and power off."""
    share = Path(job_path).parent
    rc = 125
    with contextlib.suppress(OSError):
        (share / STARTED).write_text(str(_uptime()))
    _beat(share)
    try:
        job: LabJob = json.loads(Path(job_path).read_text())
        problem = _prepare(job)
        with open("/dev/hvc0", "wb", buffering=0) as out, \
                open("/dev/hvc1", "wb", buffering=0) as err:
            for console in (out, err):
                _window(console.fileno(), {})
            if problem:
                err.write(f"vmtax: error: lab: {problem}\n".encode())
            else:
                boot = _uptime()
                rc = _run_commands(job, share, _Stream(out.fileno()), _Stream(err.fileno()))
                (share / TIMINGS).write_text(json.dumps(
                    {"boot": boot, "command": round(_uptime() - boot, 2)}))
    except Exception as exc:   # the host learns why on its terminal, or from the console
        _say(f"{type(exc).__name__}: {exc}")
        with contextlib.suppress(OSError), open("/dev/hvc1", "wb", buffering=0) as err:
            err.write(f"vmtax: error: lab: {type(exc).__name__}: {exc}\n".encode())
    finally:
        (share / RC).write_text(str(rc))
        os.sync()
        with open("/proc/sysrq-trigger", "w") as trigger:
            trigger.write("b")   # -no-reboot: QEMU exits
    return rc


def spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        return proc.spawn(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=f)


if __name__ == "__main__":
    sys.exit(inside(sys.argv[1]))
