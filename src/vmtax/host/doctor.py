"""`vmtax doctor`: everything vmtax can use on this host, and what to do where it can't.

The host's own checks (KVM, QEMU, huge pages, KSM, cgroups, busybox, the undo journal) are
here; the plugins' come from what they declare through the core registry: a check per
container runtime (vmtax.core.runtime) and per program a workload needs. Collectors
declare their own line (Collector.doctor), which the command adds.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import os
import re
import shutil
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from vmtax.core import paths
from vmtax.core import workload as workloads
from vmtax.core.errors import VmtaxError
from vmtax.core.files import read_json
from vmtax.core.runtime import Runtime, runtimes
from vmtax.core.target import Target
from vmtax.core.target import kinds as target_kinds
from vmtax.core.text import first_line
from vmtax.host import journal, kvm, machine
from vmtax.host.proc import run


@dataclass
class Check:
    name: str
    ok: bool
    detail: str   # one line; when not ok, it says what to do


# Some tools print their version and still fail on --version: dbench has no such option,
# ffmpeg's is -version. A first line naming a version number answers all the same (a
# loader's "version `GLIBC_2.34' not found" names none).
VERSION_LINE = re.compile(r"\bversion\s+v?\d", re.IGNORECASE)


def _version(path: str, args: tuple[str, ...] = ("--version",)) -> str | None:
    key = _binary_key(path, args)
    if key is not None and key in _kept_versions():
        _asked[key] = _kept_versions()[key]
        return _asked[key]
    out = run([path, *args], timeout=3.0)
    line = first_line(out.stdout) or first_line(out.stderr)
    found = line if line and (out.exit_code == 0 or VERSION_LINE.search(line)) else None
    if key is not None and not out.timed_out:
        _asked[key] = found
    return found


# What a program answers to --version is kept (~20 programs cost ~0.3 s of CPU to start),
# keyed on what could change the answer: the program file itself (path, inode, size,
# times; a package upgrade replaces it) and the dynamic loader's cache, which every
# installed or removed library package rewrites.
_VERSIONS_FILE = "doctor-versions.json"
_asked: dict[str, str | None] = {}   # this call's answers, kept for the next


def _binary_key(path: str, args: tuple[str, ...]) -> str | None:
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
        libraries = os.stat("/etc/ld.so.cache").st_mtime_ns
    except OSError:
        return None
    return json.dumps([path, real, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                       libraries, list(args)])


# ~20 programs' answers: a file far larger is none of vmtax's.
_MAX_VERSIONS = 1 << 20


@functools.cache
def _kept_versions() -> dict[str, str | None]:
    """The answers kept (none when there are none, or they are garbled: asked again); a
    file vmtax does not write there (a FIFO, another user's) is refused in one line."""
    try:
        kept = read_json(paths.cache_dir() / _VERSIONS_FILE, "doctor's version cache",
                         _MAX_VERSIONS)
    except (FileNotFoundError, ValueError):
        return {}
    if not isinstance(kept, dict):
        return {}
    return {k: v for k, v in kept.items() if isinstance(v, str) or v is None}


def _keep_versions() -> None:
    """Only the answers this call used: a program upgraded or removed leaves no entry."""
    with contextlib.suppress(OSError):
        path = paths.cache_dir() / _VERSIONS_FILE
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(_asked))
        tmp.replace(path)


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
    # A hung vCPU's verdict is kept until the boot, the device or the modules change
    # (kvm.probe): probing again would only wait out the same timeout.
    status = kvm.probe()
    detail = status.reason
    if not status.usable and "TCG" not in detail:
        detail += "; run guests with TCG"
    if not status.usable:
        detail += ("; a real KVM, nested in a TCG guest with emulated AMD-V: "
                   "vmtax lab run --targets native,vm:kvm")
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
        nr = (machine.read_text(os.path.join(directory, "nr_hugepages")) or "?").strip()
        free = (machine.read_text(os.path.join(directory, "free_hugepages")) or "?").strip()
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
    run_state = (machine.read_text(os.path.join(base, "run")) or "?").strip()
    sharing = (machine.read_text(os.path.join(base, "pages_sharing")) or "?").strip()
    state = {"0": "stopped", "1": "running", "2": "unmerging"}.get(run_state, run_state)
    return Check("ksm", True, f"{state}, {sharing} pages sharing")


def _cgroup_check() -> Check:
    layout = machine.cgroup_layout()
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
    line = first_line(out.stdout) or first_line(out.stderr)
    return Check("busybox", True, f"{path}: {line or 'version unknown'}{_busybox_note(path)}")


def _runtime_check(cls: type[Runtime]) -> Check:
    """A container runtime plugin: usable here, or why not."""
    name = f"container:{cls.name}"
    why = cls.unavailable()
    if why is not None:
        return Check(name, False, why)
    path = shutil.which(cls.name)
    version = _version(path) if path else None
    return Check(name, True, (f"{path}: {version}" if version else cls.description)
                 + cls.host_note())


def _target_check(cls: type[Target]) -> Check | None:
    """A target kind's own line (Target.doctor), if it declares one."""
    found = cls.doctor()
    return None if found is None else Check(cls.name, *found)


def _plugin_checks() -> list[Callable[[], Check | None]]:
    """A check per container runtime, per target kind that declares one and per program a
    workload needs, as the plugins declare them."""
    checks: list[Callable[[], Check | None]] = [
        functools.partial(_runtime_check, cls) for cls in runtimes().values()]
    checks += [functools.partial(_target_check, cls) for cls in target_kinds().values()]
    programs: dict[str, list[str]] = {}
    for w in workloads.registered().values():
        for binary in w.binaries:
            programs.setdefault(binary, []).append(w.name)
    built = {b: how for w in workloads.registered().values()
             for b, how in w.built_on_first_use().items()}
    for binary, users in programs.items():
        packages = sorted({p for w in workloads.registered().values() if w.name in users
                           for p in w.packages})
        if binary in built and shutil.which(binary) is None:
            checks.append(functools.partial(Check, binary, *built[binary]))
            continue
        checks.append(functools.partial(
            _tool_check, binary, f"apt-get install {' '.join(packages) or binary} "
            f"(workloads {', '.join(users)})"))
    return checks


def _journal_check() -> Check:
    """Is the runtime directory private, and did killed vmtax processes leave changes?"""
    try:
        left = journal.left_behind_warning()
    except VmtaxError as exc:
        return Check("undo journal", False, str(exc))
    if left:
        return Check("undo journal", False, left)
    return Check("undo journal", True, "nothing left behind by killed runs (journals in "
                 f"{paths.runtime_dir(create=False)})")


def doctor() -> list[Check]:
    """Everything vmtax can use on this host, in a fixed order; ~2 s when the KVM probe
    runs its vCPU to the timeout, once per boot."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        # The KVM probe waits up to its timeout; everything else runs beside it.
        kvm_future = pool.submit(_kvm_check)
        qemu_future = pool.submit(_qemu_checks)
        tool_futures = [pool.submit(check) for check in _plugin_checks()]
        busybox_future = pool.submit(_busybox_check)
        checks = [kvm_future.result(), *qemu_future.result(), _hugepages_check(),
                  _ksm_check(), _cgroup_check(),
                  *(check for f in tool_futures if (check := f.result()) is not None),
                  busybox_future.result(),
                  _journal_check()]
    _keep_versions()
    return checks
