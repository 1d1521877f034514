import json
import struct
import sys
import time

import pytest

from vmtax.host import doctor, kvm
from vmtax.host import machine as host


def test_fingerprint_keys_and_types():
    started = time.perf_counter()
    fp = host.fingerprint()
    assert time.perf_counter() - started < 0.05
    types = {
        "cpu_model": (str, type(None)), "microcode": (str, type(None)),
        "logical_cpus": int, "usable_cpus": int, "sockets": (int, type(None)),
        "cores_per_socket": (int, type(None)),
        "threads_per_core": (int, type(None)), "virtualized": bool, "arch": str,
        "kernel": str, "os": (str, type(None)), "memory_bytes": int, "hostname": str,
        "clocksource": (str, type(None)), "python": str, "vmtax": str,
    }
    assert set(fp) == set(types)
    for key, expected in types.items():
        assert isinstance(fp[key], expected), key
    assert fp["memory_bytes"] > 0 and fp["logical_cpus"] >= fp["usable_cpus"] >= 1
    json.dumps(fp)


@pytest.fixture
def roots(tmp_path):
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    proc_root.mkdir()
    sys_root.mkdir()
    return sys_root, proc_root, tmp_path / "kmsg"


def tsc(roots, dmesg=("/nonexistent/dmesg",)):
    sys_root, proc_root, kmsg = roots
    return host.tsc_khz(str(sys_root), str(proc_root), str(kmsg), dmesg)


def test_tsc_from_sysfs_first(roots):
    sys_root, _, kmsg = roots
    (sys_root / "devices/system/cpu/cpu0").mkdir(parents=True)
    (sys_root / "devices/system/cpu/cpu0/tsc_freq_khz").write_text("2899999\n")
    kmsg.write_text("6,1,2,-;tsc: Detected 2596.122 MHz processor\n")
    assert tsc(roots) == 2899999


def test_tsc_refined_calibration_beats_detected(roots):
    roots[2].write_text("6,1,2,-;tsc: Detected 2596.122 MHz processor\n"
                        "6,2,3,-;tsc: Refined TSC clocksource calibration: 2596.991 MHz\n")
    assert tsc(roots) == 2596991


def test_tsc_detected_processor_from_kmsg(roots):
    roots[2].write_text("5,0,0,-;Linux version 6.1\n"
                        "6,1,65,-;tsc: Detected 2596.122 MHz processor\n")
    assert tsc(roots) == 2596122


def test_tsc_from_dmesg_when_kmsg_is_unreadable(roots):
    argv = (sys.executable, "-c",
            "print('[    0.000065] tsc: Detected 3000.000 MHz TSC')")
    assert tsc(roots, dmesg=argv) == 3000000


def test_tsc_from_cpuinfo_last(roots):
    (roots[1] / "cpuinfo").write_text("processor\t: 0\ncpu MHz\t\t: 2596.122\n\n")
    assert tsc(roots) == 2596122


def test_tsc_unknown(roots):
    assert tsc(roots) is None


def test_tsc_here_is_plausible():
    khz = host.tsc_khz()
    assert khz is None or 100_000 < khz < 10_000_000


MOUNTS = {
    "unified": ["30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw"],
    "hybrid": ["31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw",
               "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu",
               "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw"],
    "legacy": ["31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw",
               "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu"],
    "none": ["22 1 0:21 / /sys rw - sysfs sysfs rw",
             "50 1 0:40 / /mnt/cg rw - cgroup2 cgroup2 rw"],
}


@pytest.mark.parametrize("layout", MOUNTS)
def test_cgroup_layout(tmp_path, layout):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("\n".join(MOUNTS[layout]) + "\n")
    assert host.cgroup_layout(str(mountinfo)) == layout


def test_cgroup_mounts_are_the_hierarchies_under_the_root(tmp_path):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("\n".join(MOUNTS["hybrid"] + MOUNTS["none"]) + "\n")
    assert host.cgroup_mounts(str(mountinfo)) == [("/sys/fs/cgroup/cpu", "cgroup"),
                                                  ("/sys/fs/cgroup/unified", "cgroup2")]


def elf(tmp_path, *segment_types):
    """A minimal little-endian ELF64 header plus program headers of the given types."""
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 32, 64)                       # e_phoff
    struct.pack_into("<HH", header, 54, 56, len(segment_types))  # e_phentsize, e_phnum
    table = b"".join(struct.pack("<I", t) + bytes(52) for t in segment_types)
    path = tmp_path / "binary"
    path.write_bytes(bytes(header) + table)
    return str(path)


def test_static_elf_detection(tmp_path):
    assert doctor._is_static_elf(elf(tmp_path, 1, 1)) is True
    assert doctor._is_static_elf(elf(tmp_path, 6, 3, 1)) is False   # PHDR, INTERP, LOAD
    (tmp_path / "script").write_text("#!/bin/sh\n")
    assert doctor._is_static_elf(str(tmp_path / "script")) is None


def test_hugepages_check(tmp_path):
    for kb, nr, free in ((2048, 4, 3), (1048576, 0, 0)):
        d = tmp_path / f"kernel/mm/hugepages/hugepages-{kb}kB"
        d.mkdir(parents=True)
        (d / "nr_hugepages").write_text(f"{nr}\n")
        (d / "free_hugepages").write_text(f"{free}\n")
    check = doctor._hugepages_check(str(tmp_path))
    assert check.ok
    assert check.detail.startswith("2 MiB: 4 reserved, 3 free; 1 GiB: 0 reserved, 0 free; "
                                   "1 GiB pages supported")
    assert not doctor._hugepages_check(str(tmp_path / "empty")).ok


def test_ksm_check(tmp_path):
    assert not doctor._ksm_check(str(tmp_path)).ok
    ksm = tmp_path / "kernel/mm/ksm"
    ksm.mkdir(parents=True)
    (ksm / "run").write_text("1\n")
    (ksm / "pages_sharing").write_text("1234\n")
    check = doctor._ksm_check(str(tmp_path))
    assert check.ok and check.detail.startswith("running, 1234 pages sharing")


def test_missing_tool_says_what_to_install():
    check = doctor._tool_check("vmtax-no-such-tool", "apt-get install it")
    assert check == doctor.Check("vmtax-no-such-tool", False,
                               "not found on PATH: apt-get install it")


def _check_names(checks):
    names = [c.name for c in checks]
    assert names[0] == "kvm"
    assert any(n == "qemu" or n.startswith("qemu-system-") or n == "qemu-kvm" for n in names)
    from vmtax.core import workload as workloads
    from vmtax.core.runtime import runtimes
    # A check per container runtime and per workload program the plugins declare.
    expected = ["hugepages", "ksm", "cgroup", "busybox",
                *(f"container:{r}" for r in runtimes()),
                *(b for w in workloads.registered().values() for b in w.binaries)]
    assert set(expected) <= set(names) and {"container:runc", "sysbench"} <= set(names)
    for check in checks:
        assert isinstance(check.ok, bool) and check.detail and "\n" not in check.detail
    return {c.name: c for c in checks}


def test_doctor_reads_this_host(monkeypatch):
    monkeypatch.setattr(kvm, "probe",
                        lambda fresh=False: kvm.KvmStatus(False, "stub reason", "kvm_pvm"))
    checks = _check_names(doctor.doctor())
    assert checks["kvm"] == doctor.Check(
        "kvm", False, "stub reason; run guests with TCG; a real KVM, nested in a TCG guest "
        "with emulated AMD-V: vmtax lab run --targets native,vm:kvm")


@pytest.mark.live
def test_doctor_live_within_budget():
    started = time.perf_counter()
    checks = _check_names(doctor.doctor())
    assert time.perf_counter() - started < 3.5
    assert checks["kvm"].ok == kvm.probe().usable
