import errno
import functools
import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from vmtax.host import kvm

DEV_NULL = "/dev/null"   # a character device that is not KVM


def _children() -> set[int]:
    """Live children of this process, from every thread's /proc children list."""
    pids = set()
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        with open(path) as f:
            pids.update(int(p) for p in f.read().split())
    return pids


def fake_sys(tmp_path, *modules):
    root = tmp_path / "sys"
    for module in modules:
        (root / "module" / module / "parameters").mkdir(parents=True)
    root.mkdir(exist_ok=True)
    return str(root)


def fake_proc(tmp_path, flags):
    root = tmp_path / "proc"
    root.mkdir()
    if flags is not None:
        (root / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: fpu {flags}\n\n")
    return str(root)


def api_12(dev):
    return 12


def hang(dev):
    time.sleep(60)
    return "never"


def probe(tmp_path, *modules, dev=DEV_NULL, flags="", **kwargs):
    kwargs.setdefault("query_api", api_12)
    return kvm.probe(dev, fake_sys(tmp_path, *modules), proc_root=fake_proc(tmp_path, flags),
                     **kwargs)


@pytest.mark.parametrize("modules, flags, expected", [
    ((), "vmx", "load the module with `modprobe kvm_intel`"),
    ((), "svm", "load the module with `modprobe kvm_amd`"),
    (("kvm_amd",), "svm", "kvm_amd is loaded but made no device"),
    ((), "hypervisor", "this host is itself a VM without nested virtualization"),
    ((), "sse2", "enable virtualization in the firmware setup"),
    ((), None, "load the kvm_intel or kvm_amd module"),
])
def test_absent_device_says_why(tmp_path, modules, flags, expected):
    dev = tmp_path / "kvm"
    status = probe(tmp_path, *modules, dev=str(dev), flags=flags)
    assert not status.usable
    assert status.reason.startswith(f"{dev} does not exist: ")
    assert expected in status.reason


def test_permission_denied_names_the_group(tmp_path):
    def denied(dev):
        raise PermissionError(errno.EACCES, "Permission denied", dev)
    status = probe(tmp_path, "kvm_intel", query_api=denied)
    assert not status.usable
    assert status.module == "kvm_intel"
    assert status.reason.startswith(f"no permission to open {DEV_NULL} (group root)")
    assert "usermod -aG root $USER" in status.reason


def test_regular_file_is_not_kvm(tmp_path):
    dev = tmp_path / "kvm"
    dev.write_text("")
    status = probe(tmp_path, dev=str(dev))
    assert status == kvm.KvmStatus(False, f"{dev} is not a character device, so it is not KVM",
                                   None)


def test_character_device_without_kvm_ioctls(tmp_path):
    status = probe(tmp_path, query_api=kvm.query_api_version)
    assert not status.usable
    assert status.reason.startswith(f"{DEV_NULL} is not a KVM device (KVM_GET_API_VERSION failed")


def test_api_version_mismatch(tmp_path):
    status = probe(tmp_path, query_api=lambda dev: 11)
    assert not status.usable
    assert "speaks KVM API version 11, not 12" in status.reason


def test_vcpu_that_runs_means_usable(tmp_path):
    status = probe(tmp_path, "kvm_intel", vcpu_body=lambda dev: "the loop")
    assert status == kvm.KvmStatus(True, "KVM works under kvm_intel: a test vCPU ran the loop",
                                   "kvm_intel")


def test_hardware_module_wins_over_kvm_pvm_when_the_vcpu_runs(tmp_path):
    status = probe(tmp_path, "kvm_pvm", "kvm_amd", vcpu_body=lambda dev: "the loop")
    assert status.usable and status.module == "kvm_amd"


def test_kvm_pvm_hang_is_reported_and_the_child_killed(tmp_path):
    before = _children()
    started = time.monotonic()
    status = probe(tmp_path, "kvm_pvm", timeout=0.5, vcpu_body=hang)
    assert time.monotonic() - started < 1.5
    assert status == kvm.KvmStatus(False, kvm.PVM_REASON, "kvm_pvm", hung=True)
    assert _children() == before


@pytest.mark.parametrize("modules, where, module", [
    (("kvm_intel",), "under kvm_intel", "kvm_intel"),
    ((), "under this KVM", None),
])
def test_hang_without_kvm_pvm(tmp_path, modules, where, module):
    status = probe(tmp_path, *modules, timeout=0.3, vcpu_body=hang)
    assert status.module == module and not status.usable
    assert status.reason == (f"a test vCPU {where} did not finish within 0.3 s a loop hardware "
                             "runs in milliseconds: guests would hang under -accel kvm; "
                             "run them with TCG")


def test_slow_vcpu_means_emulated(tmp_path, monkeypatch):
    monkeypatch.setattr(kvm, "_SLOW_SECONDS", 0.1)

    def slow(dev):
        time.sleep(0.3)
        return "the loop"
    status = probe(tmp_path, "kvm_intel", timeout=5, vcpu_body=slow)
    assert not status.usable and status.module == "kvm_intel"
    assert "KVM emulates instructions here; run guests with TCG" in status.reason
    assert status.reason.startswith("a test vCPU under kvm_intel needed 0.")


def test_vcpu_error_is_reported(tmp_path):
    def busy(dev):
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))
    status = probe(tmp_path, "kvm_amd", vcpu_body=busy)
    assert status == kvm.KvmStatus(
        False, "KVM cannot run a test vCPU under kvm_amd (Device or resource busy): "
        "run guests with TCG", "kvm_amd")


def test_vcpu_error_under_kvm_pvm_keeps_the_detail(tmp_path):
    def refused(dev):
        raise kvm._VcpuError("KVM_CREATE_VCPU failed: Invalid argument")
    status = probe(tmp_path, "kvm_pvm", vcpu_body=refused)
    assert status.reason == (kvm.PVM_REASON +
                             " (the test vCPU failed: KVM_CREATE_VCPU failed: Invalid argument)")


def test_child_killed_by_a_signal(tmp_path):
    def crash(dev):
        os.kill(os.getpid(), signal.SIGKILL)
        return "never"
    status = probe(tmp_path, "kvm_intel", vcpu_body=crash)
    assert "(the probe process died (signal 9))" in status.reason


def test_default_probe_is_cached(monkeypatch):
    calls = []

    def fake(*args):
        calls.append(args)
        return kvm.KvmStatus(False, "fake", None)
    monkeypatch.setattr(kvm, "_probe", fake)
    monkeypatch.setattr(kvm, "_cache", None)
    assert kvm.probe() is kvm.probe()
    assert len(calls) == 1
    kvm.probe(timeout=1.0)
    assert len(calls) == 2


def test_guest_code_loops_back_to_dec():
    code = kvm._guest_code(5)
    assert code[:6] == bytes([0x66, 0xB9, 5, 0, 0, 0])
    # jnz's rel8 is taken from the end of the jnz: it must land on the 66 49 (dec ecx).
    jnz = code.index(bytes([0x75]))
    assert jnz + 2 + (code[jnz + 1] - 256) == code.index(bytes([0x66, 0x49]))


def _kvm_openable() -> bool:
    try:
        kvm.query_api_version("/dev/kvm")
    except Exception:
        return False
    return True


@pytest.mark.live
def test_live_probe(tmp_path, monkeypatch):
    monkeypatch.setenv("VMTAX_RUNTIME", str(tmp_path))
    monkeypatch.setattr(kvm, "_cache", None)
    before = _children()
    started = time.monotonic()
    status = kvm.probe()
    elapsed = time.monotonic() - started
    assert elapsed < 2.0 + 1.0
    assert _children() == before
    assert status.reason and "\n" not in status.reason
    if os.path.isdir("/sys/module/kvm_pvm") and not (os.path.isdir("/sys/module/kvm_intel")
                                                     or os.path.isdir("/sys/module/kvm_amd")):
        assert status == kvm.KvmStatus(False, kvm.PVM_REASON, "kvm_pvm", hung=True)
    # A hung vCPU's verdict is kept for this boot: another process gets it at once.
    again = subprocess.run([sys.executable, "-c", "from vmtax.host import kvm; import time; "
                            "t = time.monotonic(); s = kvm.probe(); "
                            "print(s.usable, s.hung, round(time.monotonic() - t, 3))"],
                           capture_output=True, text=True, timeout=30, check=True)
    usable, hung, seconds = again.stdout.split()
    assert (usable, hung) == (str(status.usable), str(status.hung))
    if status.hung:
        assert float(seconds) < 0.5
        assert (tmp_path / "kvm-probe.json").exists()


def test_kept_verdict_only_for_its_key(tmp_path, monkeypatch):
    monkeypatch.setenv("VMTAX_RUNTIME", str(tmp_path))
    hung = kvm.KvmStatus(False, "hangs", "kvm_pvm", hung=True)
    kvm._keep_verdict("boot-a 1 2 kvm_pvm", hung)
    assert kvm._kept_verdict("boot-a 1 2 kvm_pvm") == hung
    assert kvm._kept_verdict("boot-b 1 2 kvm_pvm") is None      # rebooted
    assert kvm._kept_verdict("boot-a 1 2 kvm_intel") is None    # modules changed
    (tmp_path / "kvm-probe.json").write_text("{not json")
    assert kvm._kept_verdict("boot-a 1 2 kvm_pvm") is None


@pytest.mark.live
@pytest.mark.skipif(not _kvm_openable(), reason="/dev/kvm cannot be opened here")
def test_live_guest_code_exits_with_out_and_hlt():
    """The real ioctl sequence and guest code, with a loop short enough even for an emulator."""
    status = kvm.probe(timeout=10.0, vcpu_body=functools.partial(kvm.run_tiny_guest,
                                                                 iterations=1000))
    assert status.usable, status.reason
    assert "1,000 loop iterations in" in status.reason
    assert status.reason.endswith("then out and hlt")
