"""What this host is (stored with every result) and what it can run (`vmtax doctor`)."""

from __future__ import annotations

import functools
import glob
import os
import platform
import re
import shutil
import socket
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from vmtax import __version__, kvm
from vmtax.proc import run


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _cpuinfo(proc_root: str = "/proc") -> list[dict[str, str]]:
    """/proc/cpuinfo as one dict per logical CPU."""
    cpus: list[dict[str, str]] = [{}]
    for line in (_read(os.path.join(proc_root, "cpuinfo")) or "").splitlines():
        if not line.strip():
            if cpus[-1]:
                cpus.append({})
            continue
        key, _, value = line.partition(":")
        cpus[-1][key.strip()] = value.strip()
    return [c for c in cpus if c]


def _os_release() -> str | None:
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        text = _read(path)
        if text:
            match = re.search(r'^PRETTY_NAME=["\']?(.*?)["\']?$', text, re.M)
            if match:
                return match.group(1)
    return None


def _meminfo_bytes(key: str) -> int | None:
    match = re.search(rf"^{key}:\s+(\d+) kB", _read("/proc/meminfo") or "", re.M)
    return int(match.group(1)) * 1024 if match else None


def _clocksource() -> str | None:
    text = _read("/sys/devices/system/clocksource/clocksource0/current_clocksource")
    return text.strip() if text else None


def fingerprint() -> dict:
    """The facts about this host that a result depends on; JSON-serializable, ~1 ms."""
    cpus = _cpuinfo()
    first = cpus[0] if cpus else {}
    packages = {c["physical id"] for c in cpus if "physical id" in c}
    cores_per_socket = int(first["cpu cores"]) if first.get("cpu cores", "").isdigit() else None
    siblings = int(first["siblings"]) if first.get("siblings", "").isdigit() else None
    uname = os.uname()
    return {
        "cpu_model": first.get("model name") or platform.processor() or None,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "sockets": len(packages) or None,
        "cores_per_socket": cores_per_socket,
        "threads_per_core": (siblings // cores_per_socket
                             if siblings and cores_per_socket else None),
        # A host that is itself a VM measures differently (steal time, nested paging).
        "virtualized": "hypervisor" in first.get("flags", "").split(),
        "arch": uname.machine,
        "kernel": uname.release,
        "os": _os_release(),
        "memory_bytes": _meminfo_bytes("MemTotal"),
        "hostname": socket.gethostname(),
        "clocksource": _clocksource(),
        "python": platform.python_version(),
        "vmtax": __version__,
    }


# Kernel log lines, best first: the refined calibration beats the early one.
_TSC_LOG_PATTERNS = (
    re.compile(r"tsc: Refined TSC clocksource calibration: (\d+(?:\.\d+)?) MHz"),
    re.compile(r"tsc: Detected (\d+(?:\.\d+)?) MHz TSC"),
    re.compile(r"tsc: Detected (\d+(?:\.\d+)?) MHz processor"),
)


def _mhz_to_khz(text: str) -> int:
    return round(float(text) * 1000)


def _read_kmsg(path: str) -> str | None:
    """The kernel ring buffer from /dev/kmsg without blocking (or any file, for tests)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    records = []
    try:
        while True:
            try:
                record = os.read(fd, 8192)   # /dev/kmsg returns one record per read
            except BlockingIOError:
                break                        # end of the ring buffer
            except BrokenPipeError:
                continue                     # a record was overwritten while we read
            except OSError:
                break
            if not record:
                break
            records.append(record.decode(errors="replace"))
    finally:
        os.close(fd)
    return "".join(records)


def _tsc_from_log(text: str) -> int | None:
    for pattern in _TSC_LOG_PATTERNS:
        matches = pattern.findall(text)
        if matches:
            return _mhz_to_khz(matches[-1])
    return None


def _dmesg(argv: tuple[str, ...]) -> str:
    if shutil.which(argv[0]) is None:
        return ""
    out = run(list(argv), timeout=2.0)
    return out.stdout if out.exit_code == 0 else ""


def tsc_khz(sys_root: str = "/sys", proc_root: str = "/proc", kmsg: str = "/dev/kmsg",
            dmesg: tuple[str, ...] = ("dmesg",)) -> int | None:
    """The host TSC frequency in kHz, for `tsc_early_khz=` on microvm guests.

    Sources, best first: sysfs tsc_freq_khz, the kernel's own calibration in its log
    (/dev/kmsg, or `dmesg` when kmsg is not readable), then /proc/cpuinfo "cpu MHz",
    which equals the TSC rate only on constant-TSC CPUs but beats a guest's guess.
    """
    text = _read(os.path.join(sys_root, "devices/system/cpu/cpu0/tsc_freq_khz"))
    if text and text.strip().isdigit() and int(text) > 0:
        return int(text)
    log = _read_kmsg(kmsg)
    found = _tsc_from_log(log if log is not None else _dmesg(dmesg))
    if found:
        return found
    for cpu in _cpuinfo(proc_root):
        mhz = cpu.get("cpu MHz")
        if mhz and re.fullmatch(r"\d+(?:\.\d+)?", mhz) and float(mhz) > 0:
            return _mhz_to_khz(mhz)
    return None


def cgroup_mounts(mountinfo: str = "/proc/self/mountinfo",
                  root: str = "/sys/fs/cgroup") -> list[tuple[str, str]]:
    """(mount point, "cgroup" or "cgroup2") of every cgroup hierarchy at or under root."""
    found = []
    for line in (_read(mountinfo) or "").splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        mount_point = fields[4]
        fstype = line.split(" - ", 1)[1].split()[0]
        if fstype in ("cgroup", "cgroup2") and (
                mount_point == root or mount_point.startswith(root + "/")):
            found.append((mount_point, fstype))
    return found


def cgroup_layout(mountinfo: str = "/proc/self/mountinfo", root: str = "/sys/fs/cgroup") -> str:
    """"unified" (cgroup v2 only), "hybrid" (v1 controllers + v2 beside them), "legacy"
    (v1 only) or "none", from what is mounted at and under root."""
    mounts = cgroup_mounts(mountinfo, root)
    v1 = any(fstype == "cgroup" for _, fstype in mounts)
    v2_elsewhere = any(fstype == "cgroup2" and point != root for point, fstype in mounts)
    if (root, "cgroup2") in mounts:
        return "unified"
    if v1:
        return "hybrid" if v2_elsewhere else "legacy"
    return "none"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str   # one line; when not ok, it says what to do


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _version(path: str, args: tuple[str, ...] = ("--version",)) -> str | None:
    out = run([path, *args], timeout=3.0)
    line = _first_line(out.stdout) or _first_line(out.stderr)
    return line if out.exit_code == 0 and line else None


def _tool_check(name: str, install: str, note: Callable[[str], str] | None = None) -> Check:
    """Present + version line, or what to install; note(path) adds a remark when present."""
    path = shutil.which(name)
    if path is None:
        return Check(name, False, f"not found on PATH: {install}")
    version = _version(path)
    if version is None:
        return Check(name, False, f"{path} does not answer --version: reinstall it ({install})")
    return Check(name, True, f"{path}: {version}" + (note(path) if note else ""))


def _is_static_elf(path: str) -> bool | None:
    """True if the ELF file has no PT_INTERP (no dynamic loader), None if not readable ELF."""
    try:
        with open(path, "rb") as f:
            header = f.read(64)
            if header[:4] != b"\x7fELF":
                return None
            is64, little = header[4] == 2, header[5] == 1
            end = "<" if little else ">"
            if is64:
                phoff, = struct.unpack_from(end + "Q", header, 32)
                phentsize, phnum = struct.unpack_from(end + "HH", header, 54)
            else:
                phoff, = struct.unpack_from(end + "I", header, 28)
                phentsize, phnum = struct.unpack_from(end + "HH", header, 42)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except (OSError, struct.error):
        return None
    if phentsize < 4 or len(table) < phentsize * phnum:
        return None
    types = [struct.unpack_from(end + "I", table, i * phentsize)[0] for i in range(phnum)]
    return 3 not in types   # PT_INTERP names the dynamic loader


def _kvm_check() -> Check:
    status = kvm.probe(fresh=True)
    detail = status.reason
    if not status.usable and "TCG" not in detail:
        detail += "; run guests with TCG"
    return Check("kvm", status.usable, detail)


def _qemu_checks() -> list[Check]:
    found: dict[str, str] = {}
    for directory in os.get_exec_path() + ["/usr/libexec"]:
        for path in sorted(glob.glob(os.path.join(directory, "qemu-system-*"))
                           + glob.glob(os.path.join(directory, "qemu-kvm"))):
            name = os.path.basename(path)
            if name not in found and os.access(path, os.X_OK):
                found[name] = path
    if not found:
        return [Check("qemu", False, "no qemu-system-* binary found: install QEMU "
                      "(Debian: apt-get install qemu-system-x86)")]
    checks = []
    for name, path in sorted(found.items()):
        version = _version(path)
        checks.append(Check(name, version is not None, f"{path}: {version}" if version else
                            f"{path} does not answer --version: reinstall QEMU"))
    return checks


def _hugepages_check(sys_root: str = "/sys") -> Check:
    sizes = []
    for directory in glob.glob(os.path.join(sys_root, "kernel/mm/hugepages/hugepages-*kB")):
        kb = int(directory.rsplit("-", 1)[1][:-2])
        nr = (_read(os.path.join(directory, "nr_hugepages")) or "?").strip()
        free = (_read(os.path.join(directory, "free_hugepages")) or "?").strip()
        sizes.append((kb, nr, free))
    if not sizes:
        return Check("hugepages", False, "no huge page support in this kernel "
                     "(CONFIG_HUGETLBFS): the huge-page experiments cannot run here")
    parts = [f"{_size_name(kb)}: {nr} reserved, {free} free" for kb, nr, free in sorted(sizes)]
    gib = any(kb == 1 << 20 for kb, _, _ in sizes)
    return Check("hugepages", True, "; ".join(parts) + (
        "; 1 GiB pages supported" if gib else "; no 1 GiB pages here: use 2 MiB pages"))


def _size_name(kb: int) -> str:
    return f"{kb >> 20} GiB" if kb >= 1 << 20 else f"{kb >> 10} MiB" if kb >= 1024 else f"{kb} KiB"


def _ksm_check(sys_root: str = "/sys") -> Check:
    base = os.path.join(sys_root, "kernel/mm/ksm")
    if not os.path.isdir(base):
        return Check("ksm", False, "no /sys/kernel/mm/ksm (kernel without CONFIG_KSM): "
                     "density with KSM cannot be measured here")
    run_state = (_read(os.path.join(base, "run")) or "?").strip()
    sharing = (_read(os.path.join(base, "pages_sharing")) or "?").strip()
    state = {"0": "stopped", "1": "running", "2": "unmerging"}.get(run_state, run_state)
    return Check("ksm", True, f"{state}, {sharing} pages sharing")


def _cgroup_check() -> Check:
    layout = cgroup_layout()
    if layout == "none":
        return Check("cgroup", False, "no cgroup filesystem under /sys/fs/cgroup: mount "
                     "cgroup2 there (container targets need it)")
    return Check("cgroup", True, f"{layout} layout" + (
        " (v1 controllers plus cgroup2 at /sys/fs/cgroup/unified)" if layout == "hybrid" else ""))


def _busybox_note(path: str) -> str:
    static = _is_static_elf(path)
    return {True: " (static)", None: "",
            False: " (dynamic: vmtax copies its libraries too; busybox-static avoids that)",
            }[static]


def _busybox_check() -> Check:
    # busybox has no --version; run without arguments it prints its version first.
    path = shutil.which("busybox")
    if path is None:
        return Check("busybox", False, "not found on PATH: apt-get install busybox-static "
                     "(every container and guest rootfs is built on it)")
    out = run([path], timeout=3.0)
    line = _first_line(out.stdout) or _first_line(out.stderr)
    return Check("busybox", True, f"{path}: {line or 'version unknown'}{_busybox_note(path)}")


def _runtime_check(cls: Any) -> Check:
    """A container runtime plugin: usable here, or why not."""
    name = f"container:{cls.name}"
    why = cls.unavailable()
    if why is not None:
        return Check(name, False, why)
    path = shutil.which(cls.name)
    version = _version(path) if path else None
    return Check(name, True, (f"{path}: {version}" if version else cls.description)
                 + cls.host_note())


def _plugin_checks() -> list[Callable[[], Check]]:
    """A check per container runtime and per program a workload needs, as the plugins
    declare them."""
    from vmtax import workloads
    from vmtax.targets import container

    checks: list[Callable[[], Check]] = [
        functools.partial(_runtime_check, cls) for cls in container.runtimes().values()]
    programs: dict[str, list[str]] = {}
    for w in workloads.registered().values():
        for binary in w.binaries:
            programs.setdefault(binary, []).append(w.name)
    for binary, users in programs.items():
        packages = sorted({p for w in workloads.registered().values() if w.name in users
                           for p in w.packages})
        checks.append(functools.partial(
            _tool_check, binary, f"apt-get install {' '.join(packages) or binary} "
            f"(workloads {', '.join(users)})"))
    return checks


def doctor() -> list[Check]:
    """Everything vmtax can use on this host, in a fixed order; ~2 s (the KVM probe)."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        # The KVM probe waits up to its timeout; everything else runs beside it.
        kvm_future = pool.submit(_kvm_check)
        qemu_future = pool.submit(_qemu_checks)
        tool_futures = [pool.submit(check) for check in _plugin_checks()]
        busybox_future = pool.submit(_busybox_check)
        return [kvm_future.result(), *qemu_future.result(), _hugepages_check(),
                _ksm_check(), _cgroup_check(),
                *(f.result() for f in tool_futures), busybox_future.result()]
