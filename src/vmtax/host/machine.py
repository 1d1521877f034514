"""What this host is (stored with every result): its fingerprint, TSC rate and cgroup layout."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import socket
from collections.abc import Iterator
from typing import Any

from vmtax import __version__
from vmtax.host.proc import run


def read_text(path: str) -> str | None:
    """A small file's text, or None when it cannot be read."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _cpuinfo(proc_root: str = "/proc") -> list[dict[str, str]]:
    """/proc/cpuinfo as one dict per logical CPU."""
    cpus: list[dict[str, str]] = [{}]
    for line in (read_text(os.path.join(proc_root, "cpuinfo")) or "").splitlines():
        if not line.strip():
            if cpus[-1]:
                cpus.append({})
            continue
        key, _, value = line.partition(":")
        cpus[-1][key.strip()] = value.strip()
    return [c for c in cpus if c]


def _os_release() -> str | None:
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        text = read_text(path)
        if text:
            match = re.search(r'^PRETTY_NAME=["\']?(.*?)["\']?$', text, re.M)
            if match:
                return match.group(1)
    return None


def _meminfo_bytes(key: str) -> int | None:
    match = re.search(rf"^{key}:\s+(\d+) kB", read_text("/proc/meminfo") or "", re.M)
    return int(match.group(1)) * 1024 if match else None


def available_memory_bytes() -> int | None:
    return _meminfo_bytes("MemAvailable")


# Set in the lab's environment (vmtax.guest.lab) and recorded with every run made there, so
# each renderer can say its KVM numbers are a nested lab's, never hardware's.
LAB_ENV = "VMTAX_LAB"
LAB_LABEL = "nested KVM in a TCG lab, AMD-V emulated"


def lab() -> str | None:
    """What kind of lab this host is (LAB_LABEL inside `vmtax lab`, and while `vmtax lab`
    checks a command for one: planning_lab), None on a real host."""
    return os.environ.get(LAB_ENV) or (LAB_LABEL if _planning else None)


# In a lab everything runs under TCG (guests under TCG in TCG, or a KVM nested on it):
# this many times slower than on the host, where timeouts (a guest's boot, perf's start)
# were chosen.
LAB_SLOWDOWN = 5


def lab_scaled(seconds: float) -> float:
    """A timeout chosen for a host, here: in a lab, LAB_SLOWDOWN times longer."""
    return seconds * LAB_SLOWDOWN if lab() else seconds


# Devices a lab being planned will have (its kernel loads their modules) though this host
# has not: while `vmtax lab` checks a command's arguments here, they pass as in the lab,
# and this host is a lab (a lab's run to resume is resumable there).
_lab_devices: frozenset[str] = frozenset()
_planning = False


@contextlib.contextmanager
def planning_lab(devices: frozenset[str]) -> Iterator[None]:
    global _lab_devices, _planning
    before, _lab_devices, _planning = (_lab_devices, _planning), devices, True
    try:
        yield
    finally:
        _lab_devices, _planning = before


def has_device(path: str) -> bool:
    """The device exists here, or in the lab whose command is being checked."""
    return os.path.exists(path) or path in _lab_devices


def _clocksource() -> str | None:
    text = read_text("/sys/devices/system/clocksource/clocksource0/current_clocksource")
    return text.strip() if text else None


def fingerprint() -> dict[str, Any]:
    """The facts about this host that a result depends on; JSON-serializable, ~1 ms."""
    cpus = _cpuinfo()
    first = cpus[0] if cpus else {}
    packages = {c["physical id"] for c in cpus if "physical id" in c}
    cores_per_socket = int(first["cpu cores"]) if first.get("cpu cores", "").isdigit() else None
    siblings = int(first["siblings"]) if first.get("siblings", "").isdigit() else None
    uname = os.uname()
    return {
        "cpu_model": first.get("model name") or platform.processor() or None,
        # A microcode update changes speed (mitigations) without changing the model.
        "microcode": first.get("microcode"),
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
        # Only inside a lab, so a real host's facts stay as they were.
        **({"lab": lab()} if lab() else {}),
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
    text = read_text(os.path.join(sys_root, "devices/system/cpu/cpu0/tsc_freq_khz"))
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


def _mounts(mountinfo: str) -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount listed in mountinfo, in its order."""
    found = []
    for line in (read_text(mountinfo) or "").splitlines():
        fields = line.split()
        if " - " in line and len(fields) >= 5:
            found.append((fields[4], line.split(" - ", 1)[1].split()[0]))
    return found


def cgroup_mounts(mountinfo: str = "/proc/self/mountinfo",
                  root: str = "/sys/fs/cgroup") -> list[tuple[str, str]]:
    """(mount point, "cgroup" or "cgroup2") of every cgroup hierarchy at or under root."""
    return [(point, fstype) for point, fstype in _mounts(mountinfo)
            if fstype in ("cgroup", "cgroup2")
            and (point == root or point.startswith(root + "/"))]


def fs_type(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem path is on ("tmpfs"): that of the last mount at it or
    at its nearest parent."""
    found: tuple[int, str] | None = None
    for point, fstype in _mounts(mountinfo):
        if path == point or path.startswith(point.rstrip("/") + "/"):
            if found is None or len(point) >= found[0]:
                found = (len(point), fstype)
    return found[1] if found else None


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
