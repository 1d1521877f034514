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
after its chroot, the lab's.

Every run made in the lab records LABEL in its host facts (VMTAX_LAB, read by
vmtax.host.machine.fingerprint): numbers of a KVM nested under TCG keep the shape of the
tax, never hardware's figures.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import termios
from dataclasses import dataclass
from pathlib import Path

from vmtax.core.errors import VmtaxError
from vmtax.guest.image import (CpioEntry, _check, _insmod_order, _run_tool, debian_kernel,
                               write_cpio)
from vmtax.guest.kernel_cache import build_lock, publish_dir
from vmtax.guest.qemu import BOOT_SPEEDUPS, _opt, find_qemu, host_tsc_khz
from vmtax.host import machine as host
from vmtax.host import proc
from vmtax.host.machine import LAB_ENV, LAB_LABEL

__all__ = ["LAB_ENV", "LAB_LABEL"]

FORMAT = "4"    # bump when the lab's kernel directory or initramfs layout changes
# The lab's CPU: QEMU's TCG emulates AMD-V; it has no VMX (Intel) emulation at all.
CPU = "max,+svm,+npt"
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
OPTIONAL_MODULES = ("vhost_net", "tun", "bridge", "veth")
# The devices some of them make, which vmtax's targets check for.
MODULE_DEVICES = {"vhost_net": "/dev/vhost-net", "tun": "/dev/net/tun"}
KVM_DEVICES = ("/dev/kvm", "/dev/vhost-net")
LIBVIRT_CAPABILITIES = "libvirt-qemu-capabilities"
LIBVIRT_CAPABILITIES_DIR = "/var/cache/libvirt/qemu/capabilities"
LIBVIRT_QEMU_CONF = "/etc/libvirt/qemu.conf"
HOST_TAG, LAB_TAG, CACHE_TAG = "host", "lab", "cache"
# Where the lab's writable share is mounted, inside the lab.
SHARE = "/vmtax-lab"
JOB, RC, RESULTS, PYTHON, TIMINGS = "job.json", "rc", "results", "python", "timings.json"
# Written by the lab's own vmtax as it starts: the lab has booted (the host's watchdog).
STARTED = "started"
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


def _build_lab_kernel(deb: Path, version: str, dest: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        unpacked = tmp / "unpacked"
        _check(_run_tool(["dpkg-deb", "-x", str(deb), str(unpacked)]))
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


def lab_kernel(cache: Path) -> LabKernel:
    """Debian's guest kernel (built into vmtax's cache as for any guest), its whole module
    tree and the lab's initramfs, built once beside it."""
    kernel = debian_kernel(cache)
    source = json.loads((kernel.path.parent / "meta.json").read_text()).get("source")
    deb = cache / "debs" / str(source)
    dest = cache / "lab" / f"{kernel.version}-{kernel.sha256[:12]}-f{FORMAT}"
    if not (dest / "meta.json").exists():
        if not source or not deb.is_file():
            raise VmtaxError(f"lab: the .deb of the guest kernel {kernel.version} is not in "
                             f"{cache / 'debs'}; clear {kernel.path.parent} to fetch it again")
        with build_lock(dest):
            if not (dest / "meta.json").exists():
                _build_lab_kernel(deb, kernel.version, dest)
    return LabKernel(kernel.path, kernel.version, dest / "modules",
                     dest / "initramfs.cpio")


def devices(kernel: LabKernel) -> frozenset[str]:
    """The devices the lab will have from its kernel's modules (MODULE_DEVICES)."""
    dep = (kernel.modules_tree / "modules.dep").read_text()
    have = {Path(line.split(":", 1)[0]).name.split(".ko", 1)[0] for line in dep.splitlines()}
    return frozenset(dev for module, dev in MODULE_DEVICES.items() if module in have)


def svm_problem(qemu: str) -> str | None:
    """Why this QEMU's TCG cannot emulate AMD-V (None: it can): QEMU itself is asked to
    start a paused machine with the lab's CPU and `enforce`, then to quit."""
    binary = find_qemu(qemu)
    try:
        out = subprocess.run(
            [binary, "-nodefaults", "-no-user-config", "-display", "none", "-M", "q35",
             "-accel", "tcg", "-cpu", CPU + ",enforce", "-S", "-qmp", "stdio"],
            input='{"execute":"qmp_capabilities"}\n{"execute":"quit"}\n',
            capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{binary} could not be asked ({exc})"
    if out.returncode != 0:
        said = [line.removeprefix(f"{binary}: ") for line in out.stderr.splitlines()]
        return (f"{binary}'s TCG does not emulate AMD-V ({CPU}): "
                + ("; ".join(said[-2:]) or f"exit status {out.returncode}"))
    return None


def memory_problem(memory: int) -> str | None:
    available = host.available_memory_bytes()
    if available is not None and memory + QEMU_OVERHEAD > available:
        return (f"a lab of {memory >> 20} MiB (+{QEMU_OVERHEAD >> 20} MiB for QEMU) does not "
                f"fit in this host's {available >> 20} MiB of available memory; "
                "give --memory less")
    return None


def lab_argv(qemu: str, kernel: LabKernel, vcpus: int, memory: int, share: Path,
             cache: Path) -> list[str]:
    """QEMU's command line for a lab of vcpus and memory bytes whose writable share is
    the host's directory share (console.log and out.log are written there too). vmtax's
    cache is shared writable too: what the lab builds (a guest's rootfs and initramfs, in
    minutes under TCG) is built once, for the host and every later lab; builds are
    published by atomic renames (vmtax.guest.kernel_cache), which hold over 9p, though
    their build locks do not reach the host's builders there."""
    tsc_khz = host_tsc_khz()
    # Every kernel message, from the first, in console.log (a lab once hung while booting
    # with nothing there at loglevel=4): a few hundred lines, under 0.2 s on TCG's serial.
    append = ["console=ttyS0", "earlyprintk=serial,ttyS0", "loglevel=7", "panic=-1",
              *BOOT_SPEEDUPS, "rdinit=/init"]
    if tsc_khz:
        append.append(f"tsc_early_khz={tsc_khz}")
    return [qemu, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-accel", "tcg,thread=multi", "-M", "q35", "-cpu", CPU,
            "-smp", str(vcpus), "-m", f"{memory >> 20}M",
            "-kernel", str(kernel.vmlinux), "-initrd", str(kernel.initramfs),
            "-append", " ".join(append),
            "-chardev", f"file,id=console,path={_opt(share / 'console.log')}",
            "-serial", "chardev:console",
            "-fsdev", f"local,id={HOST_TAG},path=/,security_model=none,readonly=on",
            "-device", f"virtio-9p-pci,fsdev={HOST_TAG},mount_tag={HOST_TAG}",
            "-fsdev", f"local,id={LAB_TAG},path={_opt(share)},security_model=none",
            "-device", f"virtio-9p-pci,fsdev={LAB_TAG},mount_tag={LAB_TAG}",
            "-fsdev", f"local,id={CACHE_TAG},path={_opt(cache)},security_model=none",
            "-device", f"virtio-9p-pci,fsdev={CACHE_TAG},mount_tag={CACHE_TAG}",
            "-drive", f"if=none,id=upper,format=raw,file={_opt(share / UPPER)},cache=writeback",
            "-device", "virtio-blk-pci,drive=upper",
            "-device", "virtio-serial-pci,id=vser",
            "-chardev", f"file,id=out,path={_opt(share / 'out.log')}",
            "-device", "virtconsole,chardev=out"]


def write_job(share: Path, argv: list[str], cwd: str, modules_tree: Path, version: str,
              env: dict[str, str], tty: bool) -> None:
    (share / PYTHON).write_text(sys.executable)
    (share / JOB).write_text(json.dumps({"argv": argv, "cwd": cwd, "env": env, "tty": tty,
                                         "modules": str(modules_tree), "version": version}))


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


def _prepare(job: dict) -> str | None:
    """The lab's mounts and modules; why KVM cannot run (None: it can)."""
    for fstype, source, target, options in _MOUNTS:
        _mount(fstype, source, target, options)
    _mount("9p", CACHE_TAG, job["env"]["VMTAX_CACHE"],
           "trans=virtio,version=9p2000.L,msize=512000")
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


def _run(argv: list[str], cwd: str, env: dict[str, str], out, tty: bool) -> int:
    """The command, its output on the virtio console: straight onto it when the host's
    side is a terminal (live progress), else through a pipe, so that it writes plain
    lines as it would into a host's log."""
    if tty:
        return subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                              stderr=out).returncode
    with subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as child:
        assert child.stdout is not None
        while data := os.read(child.stdout.fileno(), 65536):
            out.write(data)
    return child.returncode


def _raw_output(fd: int) -> None:
    """The console passes the command's bytes as they are: no "\r" added to each "\n"
    (the host's terminal adds its own)."""
    attrs = termios.tcgetattr(fd)
    attrs[1] &= ~termios.OPOST
    termios.tcsetattr(fd, termios.TCSANOW, attrs)


def _uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def inside(job_path: str) -> int:
    """The lab's side: mounts, KVM, the command (its output on the virtio console), then
    the exit status and the results handed back through the share, and power off."""
    share = Path(job_path).parent
    rc = 125
    with contextlib.suppress(OSError):
        (share / STARTED).write_text(str(_uptime()))
    try:
        job = json.loads(Path(job_path).read_text())
        problem = _prepare(job)
        with open("/dev/hvc0", "wb", buffering=0) as out:
            _raw_output(out.fileno())
            if problem:
                out.write(f"vmtax: error: lab: {problem}\n".encode())
            else:
                env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                       **job["env"]}
                boot = _uptime()
                rc = _run(job["argv"], job["cwd"], env, out, job.get("tty", False))
                if rc < 0:
                    out.write(f"vmtax: error: lab: {job['argv'][2:4]} died of signal "
                              f"{signal.Signals(-rc).name}\n".encode())
                (share / TIMINGS).write_text(json.dumps(
                    {"boot": boot, "command": round(_uptime() - boot, 2)}))
    except Exception as exc:   # the host learns why on its terminal, or from the console
        _say(f"{type(exc).__name__}: {exc}")
        with contextlib.suppress(OSError), open("/dev/hvc0", "wb", buffering=0) as out:
            out.write(f"vmtax: error: lab: {type(exc).__name__}: {exc}\n".encode())
    finally:
        (share / RC).write_text(str(rc))
        os.sync()
        with open("/proc/sysrq-trigger", "w") as trigger:
            trigger.write("b")   # -no-reboot: QEMU exits
    return rc


def spawn(argv: list[str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as f:
        return proc.spawn(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=f)


if __name__ == "__main__":
    sys.exit(inside(sys.argv[1]))
