"""Can QEMU use KVM on this host? Decided by running a tiny vCPU, not by opening /dev/kvm.

Opening the device proves little: under kvm_pvm, KVM_CREATE_VM succeeds and a few real-mode
instructions even run, but through the in-kernel instruction emulator at about a million
instructions per second, so a stock guest kernel never gets anywhere. So probe() runs a
busy loop that hardware KVM finishes in milliseconds and an emulator needs tens of seconds
for, in a forked child killed at the timeout. Everything is done with ioctl + mmap + ctypes
so that no compiled helper is needed.

A vCPU that hung for the whole timeout is a property of this boot's KVM module, not of the
moment, and costs every vmtax command that starts a guest the full timeout: that verdict
is kept in the runtime directory (a tmpfs, emptied by a reboot), keyed by the boot, the
device and the loaded modules, and reused until one of them changes (by `doctor` too).
"""

from __future__ import annotations

import ctypes
import fcntl
import grp
import json
import mmap
import os
import platform
import select
import signal
import stat
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, overload

from vmtax.core import paths
from vmtax.host import machine
from vmtax.host.proc import _die_with_parent


@dataclass(frozen=True)
class KvmStatus:
    usable: bool
    reason: str          # one line a user understands: why not usable, or what was verified
    module: str | None   # "kvm_intel", "kvm_amd", "kvm_pvm", ... (None if unknown/absent)
    # The test vCPU hung: the verdict holds until the boot, device or modules change.
    hung: bool = False


# <linux/kvm.h>: the ioctl numbers and exit reasons this probe needs.
_KVM_API_VERSION = 12


def _io(nr: int) -> int:
    return (0xAE << 8) | nr


def _iow(nr: int, size: int) -> int:
    return (1 << 30) | (size << 16) | (0xAE << 8) | nr


def _ior(nr: int, size: int) -> int:
    return (2 << 30) | (size << 16) | (0xAE << 8) | nr


_REGS_SIZE = 18 * 8      # struct kvm_regs: rax..r15, rip, rflags
_SREGS_SIZE = 312        # struct kvm_sregs; cs is its first struct kvm_segment
KVM_GET_API_VERSION = _io(0x00)
KVM_CREATE_VM = _io(0x01)
KVM_GET_VCPU_MMAP_SIZE = _io(0x04)
KVM_CREATE_VCPU = _io(0x41)
KVM_SET_USER_MEMORY_REGION = _iow(0x46, 32)
KVM_RUN = _io(0x80)
KVM_SET_REGS = _iow(0x82, _REGS_SIZE)
KVM_GET_SREGS = _ior(0x83, _SREGS_SIZE)
KVM_SET_SREGS = _iow(0x84, _SREGS_SIZE)
_EXIT_IO = 2
_EXIT_HLT = 5
_EXIT_NAMES = {0: "UNKNOWN", 1: "EXCEPTION", 2: "IO", 5: "HLT", 6: "MMIO", 8: "SHUTDOWN",
               9: "FAIL_ENTRY", 17: "INTERNAL_ERROR"}

_GUEST_ADDR = 0x1000
_GUEST_PORT = 0x10
_GUEST_VALUE = 0x2A
# Hardware runs this loop at about an iteration per cycle (~15 ms); kvm_pvm's emulator
# manages about one per microsecond (measured: 40 s), far past any sensible timeout.
_LOOP_ITERATIONS = 1 << 25


def _guest_code(iterations: int) -> bytes:
    """16-bit real mode: mov ecx, N; l: dec ecx; jnz l; mov al, 0x2a; out 0x10, al; hlt"""
    return (bytes([0x66, 0xB9]) + iterations.to_bytes(4, "little")
            + bytes([0x66, 0x49, 0x75, 0xFC, 0xB0, _GUEST_VALUE, 0xE6, _GUEST_PORT, 0xF4]))


# Vendor modules that register /dev/kvm, hardware ones first: when kvm_pvm is loaded next
# to kvm_intel/kvm_amd, a vCPU that runs means the hardware module is the one serving us.
_VENDOR_MODULES = ("kvm_intel", "kvm_amd", "kvm_pvm")

# The test loop takes ~15 ms on hardware; anything this slow is being emulated.
_SLOW_SECONDS = 1.0
# How much longer the test vCPU may take inside `vmtax lab` (see _probe).
LAB_PROBE_SLOWDOWN = 15

PVM_REASON = ("KVM is present but provided by kvm_pvm, which boots only PVM guest kernels; "
              "a stock kernel hangs under -accel kvm")


class _VcpuError(Exception):
    """The test vCPU ran but did not do what its code says."""


class _NotKvm(Exception):
    """The device opened but does not answer KVM_GET_API_VERSION."""


@overload
def _ioctl(fd: int, request: int, arg: int | bytearray | ctypes.Array[Any], name: str) -> int:
    ...
@overload
def _ioctl(fd: int, request: int, arg: bytes, name: str) -> bytes: ...
def _ioctl(fd: int, request: int, arg: int | bytes | bytearray | ctypes.Array[Any],
           name: str) -> int | bytes:
    """fcntl.ioctl: a number or a buffer it fills (the call's result), or bytes it reads
    (a copy of them back)."""
    try:
        return fcntl.ioctl(fd, request, arg)
    except OSError as e:
        raise _VcpuError(f"{name} failed: {e.strerror}") from None


def run_tiny_guest(dev: str, iterations: int = _LOOP_ITERATIONS) -> str:
    """Run the real-mode test loop on one vCPU of a new VM; return what was seen.

    Raises _VcpuError (or OSError) when KVM refuses a step or the guest exits unexpectedly.
    Takes tens of seconds where instructions are emulated (kvm_pvm) or forever where the
    vCPU is stuck, which is why it only ever runs in a child process.
    """
    if platform.machine() not in ("x86_64", "i686", "i386"):
        raise _VcpuError(f"the test vCPU is x86 code and this host is {platform.machine()}")
    kvm = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
    vm = _ioctl(kvm, KVM_CREATE_VM, 0, "KVM_CREATE_VM")
    mem = mmap.mmap(-1, mmap.PAGESIZE)
    code = _guest_code(iterations)
    mem[:len(code)] = code
    region = (ctypes.c_uint64 * 4)(
        0,                                   # slot 0, flags 0 (two u32 packed in one u64)
        _GUEST_ADDR, mmap.PAGESIZE,
        ctypes.addressof(ctypes.c_char.from_buffer(mem)))
    _ioctl(vm, KVM_SET_USER_MEMORY_REGION, region, "KVM_SET_USER_MEMORY_REGION")
    vcpu = _ioctl(vm, KVM_CREATE_VCPU, 0, "KVM_CREATE_VCPU")
    run_size = _ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0, "KVM_GET_VCPU_MMAP_SIZE")
    run = mmap.mmap(vcpu, run_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    sregs = bytearray(_SREGS_SIZE)
    _ioctl(vcpu, KVM_GET_SREGS, sregs, "KVM_GET_SREGS")
    sregs[0:8] = (0).to_bytes(8, "little")     # cs.base
    sregs[12:14] = (0).to_bytes(2, "little")   # cs.selector
    _ioctl(vcpu, KVM_SET_SREGS, bytes(sregs), "KVM_SET_SREGS")
    regs = bytearray(_REGS_SIZE)
    regs[16 * 8:17 * 8] = _GUEST_ADDR.to_bytes(8, "little")   # rip
    regs[17 * 8:18 * 8] = (2).to_bytes(8, "little")           # rflags: bit 1 is reserved-set
    _ioctl(vcpu, KVM_SET_REGS, bytes(regs), "KVM_SET_REGS")

    def run_once() -> int:
        _ioctl(vcpu, KVM_RUN, 0, "KVM_RUN")
        return int.from_bytes(run[8:12], "little")

    def exit_name(reason: int) -> str:
        return _EXIT_NAMES.get(reason, str(reason))

    started = time.perf_counter()
    reason = run_once()
    elapsed_ms = (time.perf_counter() - started) * 1000
    if reason != _EXIT_IO:
        raise _VcpuError(f"expected an IO exit, got {exit_name(reason)}")
    direction, size = run[32], run[33]
    port = int.from_bytes(run[34:36], "little")
    offset = int.from_bytes(run[40:48], "little")
    if (direction, size, port) != (1, 1, _GUEST_PORT) or run[offset] != _GUEST_VALUE:
        raise _VcpuError(f"unexpected IO exit: port {port:#x}, value {run[offset]:#x}")
    reason = run_once()
    if reason != _EXIT_HLT:
        raise _VcpuError(f"expected a HLT exit, got {exit_name(reason)}")
    return f"{iterations:,} loop iterations in {elapsed_ms:.0f} ms, then out and hlt"


@dataclass(frozen=True)
class _ChildOutcome:
    kind: str        # "ok", "failed" or "hung"
    detail: str
    elapsed: float   # seconds from fork to answer (or to the timeout)


def _run_in_child(body: Callable[[str], str], dev: str, timeout: float) -> _ChildOutcome:
    """Run body(dev) in a forked child; SIGKILL it if it has not answered within timeout."""
    read_end, write_end = os.pipe()
    parent = os.getpid()
    # As in proc.spawn: a stop signal must not land in Python's at-fork hooks.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    pid = os.fork()
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if pid == 0:
        try:
            # Keep only the answer pipe: a copy of another thread's subprocess pipe would
            # hold that pipe open (and its reader waiting) until this child exits.
            highest = max(map(int, os.listdir("/proc/self/fd")))
            os.closerange(3, write_end)
            os.closerange(write_end + 1, highest + 1)
            _die_with_parent()
            if os.getppid() != parent:   # the parent died before prctl took effect
                os._exit(1)
            try:
                msg = "ok " + body(dev)
            except Exception as e:   # whatever went wrong, the parent must hear about it
                msg = "failed " + (e.strerror if isinstance(e, OSError) and e.strerror
                                   else str(e) or type(e).__name__)
            os.write(write_end, msg.encode(errors="replace")[:select.PIPE_BUF])
        finally:
            os._exit(0)
    os.close(write_end)
    started = time.perf_counter()
    ready: list[tuple[int, int]] = []
    try:
        poller = select.poll()   # not select(): vmtax may hold more than 1024 fds
        poller.register(read_end, select.POLLIN)
        ready = poller.poll(timeout * 1000)
        answer = os.read(read_end, select.PIPE_BUF).decode(errors="replace") if ready else None
        elapsed = time.perf_counter() - started
    finally:
        os.close(read_end)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        status = _reap(pid)
    if answer is None:
        return _ChildOutcome("hung", f"did not finish within {timeout:g} s", elapsed)
    if not answer:
        how = (f"signal {os.WTERMSIG(status)}" if status is not None and os.WIFSIGNALED(status)
               else "no answer")
        return _ChildOutcome("failed", f"the probe process died ({how})", elapsed)
    kind, _, detail = answer.partition(" ")
    return _ChildOutcome(kind, detail, elapsed)


def _reap(pid: int, wait: float = 5.0) -> int | None:
    """waitpid(pid), but give up after `wait` seconds rather than block vmtax forever."""
    deadline = time.monotonic() + wait
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return status
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


def _loaded_modules(sys_root: str) -> list[str]:
    return [m for m in _VENDOR_MODULES if os.path.isdir(os.path.join(sys_root, "module", m))]


def _cpu_flags(proc_root: str) -> set[str] | None:
    try:
        with open(os.path.join(proc_root, "cpuinfo")) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        return None
    return set()


def _absent_hint(sys_root: str, proc_root: str) -> str:
    """Why there is no /dev/kvm, and what to do, from the CPU flags and loaded modules."""
    modules = _loaded_modules(sys_root)
    flags = _cpu_flags(proc_root)
    if flags is None:
        return "load the kvm_intel or kvm_amd module, or run guests with TCG"
    vendor = "kvm_intel" if "vmx" in flags else "kvm_amd" if "svm" in flags else None
    if vendor and vendor in modules:
        return (f"{vendor} is loaded but made no device: check `dmesg | grep -i kvm` "
                "(virtualization disabled in the firmware?)")
    if vendor:
        return f"the CPU supports it: load the module with `modprobe {vendor}`"
    if "hypervisor" in flags:
        return ("this host is itself a VM without nested virtualization (no vmx/svm CPU flag): "
                "enable nested virtualization on its host, or run guests with TCG")
    return ("the CPU shows no VT-x/AMD-V (no vmx/svm flag): enable virtualization in the "
            "firmware setup, or run guests with TCG")


def _permission_reason(dev: str, st: os.stat_result) -> str:
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return (f"no permission to open {dev} (group {group}): add your user to it with "
            f"`usermod -aG {group} $USER` and log in again, or run guests with TCG")


def query_api_version(dev: str) -> int:
    """Open dev and return its KVM_GET_API_VERSION; raises _NotKvm if it has none."""
    fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
    try:
        return fcntl.ioctl(fd, KVM_GET_API_VERSION, 0)
    except OSError as e:
        raise _NotKvm(e.strerror) from None
    finally:
        os.close(fd)


def _probe(dev: str, sys_root: str, proc_root: str, timeout: float,
           query_api: Callable[[str], int],
           vcpu_body: Callable[[str], str]) -> KvmStatus:
    modules = _loaded_modules(sys_root)
    try:
        st = os.stat(dev)
    except FileNotFoundError:
        return KvmStatus(False, f"{dev} does not exist: {_absent_hint(sys_root, proc_root)}",
                         modules[0] if modules else None)
    except OSError as e:
        return KvmStatus(False, f"cannot stat {dev}: {e.strerror}", None)
    if not stat.S_ISCHR(st.st_mode):
        return KvmStatus(False, f"{dev} is not a character device, so it is not KVM", None)
    try:
        version = query_api(dev)
    except PermissionError:
        return KvmStatus(False, _permission_reason(dev, st), modules[0] if modules else None)
    except OSError as e:
        return KvmStatus(False, f"cannot open {dev}: {e.strerror}", None)
    except _NotKvm as e:
        return KvmStatus(False, f"{dev} is not a KVM device (KVM_GET_API_VERSION failed: {e})",
                         None)
    if version != _KVM_API_VERSION:
        return KvmStatus(False, f"{dev} speaks KVM API version {version}, not "
                         f"{_KVM_API_VERSION}: this kernel's KVM is not usable by QEMU", None)

    # In vmtax's lab KVM is nested on TCG by design (and labelled so): its vCPUs run at
    # TCG's pace, tens of times slower than hardware's, more on a loaded host.
    lab = LAB_PROBE_SLOWDOWN if machine.lab() else 1
    outcome = _run_in_child(vcpu_body, dev, timeout * lab)
    hardware = [m for m in modules if m != "kvm_pvm"]
    if outcome.kind == "ok" and outcome.elapsed < _SLOW_SECONDS * lab:
        module = hardware[0] if hardware else (modules[0] if modules else None)
        return KvmStatus(True, f"KVM works under {module or 'an unknown module'}: "
                         f"a test vCPU ran {outcome.detail}", module)
    # A vCPU that cannot run points at kvm_pvm whenever it is loaded.
    module = "kvm_pvm" if "kvm_pvm" in modules else (modules[0] if modules else None)
    hung = outcome.kind == "hung"
    if module == "kvm_pvm":
        failure = f" (the test vCPU failed: {outcome.detail})" if outcome.kind == "failed" else ""
        return KvmStatus(False, PVM_REASON + failure, module, hung)
    where = f"under {module}" if module else "under this KVM"
    if outcome.kind == "ok":
        return KvmStatus(False, f"a test vCPU {where} needed {outcome.elapsed:.1f} s for a loop "
                         "hardware runs in milliseconds: KVM emulates instructions here; "
                         "run guests with TCG", module)
    if hung:
        return KvmStatus(False, f"a test vCPU {where} {outcome.detail} a loop hardware runs "
                         "in milliseconds: guests would hang under -accel kvm; "
                         "run them with TCG", module, hung)
    return KvmStatus(False, f"KVM cannot run a test vCPU {where} ({outcome.detail}): "
                     "run guests with TCG", module)


_cache: KvmStatus | None = None
_cache_lock = threading.Lock()
_VERDICT_FILE = "kvm-probe.json"


def _boot_key(dev: str, sys_root: str) -> str | None:
    """What a kept verdict is valid for: this boot, this device node, these modules."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        st = os.stat(dev)
    except OSError:
        return None
    return f"{boot} {st.st_rdev} {st.st_ctime_ns} {' '.join(_loaded_modules(sys_root))}"


def _kept_verdict(key: str) -> KvmStatus | None:
    try:
        kept = json.loads((paths.runtime_dir(create=False) / _VERDICT_FILE).read_text())
        if kept.get("key") == key:
            return KvmStatus(False, kept["reason"], kept["module"], True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def _keep_verdict(key: str, status: KvmStatus) -> None:
    try:
        path = paths.runtime_dir() / _VERDICT_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": key, "reason": status.reason,
                                   "module": status.module}))
        tmp.replace(path)
    except OSError:
        pass   # only a cache: the next command probes again


def probe(dev: str = "/dev/kvm", sys_root: str = "/sys", timeout: float = 2.0, *,
          proc_root: str = "/proc",
          query_api: Callable[[str], int] = query_api_version,
          vcpu_body: Callable[[str], str] = run_tiny_guest,
          fresh: bool = False) -> KvmStatus:
    """Whether QEMU can use KVM here; cached per process for the default arguments, and a
    hung vCPU's verdict per boot (fresh=True probes again and replaces it).

    proc_root, query_api and vcpu_body exist for tests: a fake /proc, a stand-in for
    opening the device and asking its API version (it may raise PermissionError), and a
    stand-in for the code that runs inside the child (it may hang or raise).
    """
    global _cache
    default = (dev, sys_root, timeout, proc_root, query_api, vcpu_body) == (
        "/dev/kvm", "/sys", 2.0, "/proc", query_api_version, run_tiny_guest)
    if not default:
        return _probe(dev, sys_root, proc_root, timeout, query_api, vcpu_body)
    with _cache_lock:
        if _cache is None or fresh:
            key = _boot_key(dev, sys_root)
            kept = None if fresh or key is None else _kept_verdict(key)
            _cache = kept or _probe(dev, sys_root, proc_root, timeout, query_api, vcpu_body)
            if kept is None and key is not None and _cache.hung:
                _keep_verdict(key, _cache)
        return _cache
