"""ssh targets without a server: options, names, the remote's fingerprint, the bundle, and
the remote command lines (quoting, the job wrapper and its killer run by the local sh)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from vmtax import plugin, remote_bundle, targets
from vmtax.errors import TargetError, VmtaxError
from vmtax.ssh_session import Session, SshConfig, parse_spec
from vmtax.targets.ssh import SshOptions, describe, hypervisor

KVM_GUEST = """@machine
x86_64
@kernel
6.1.0-26-amd64
@cores
4
@meminfo
MemTotal:        8123456 kB
@model
model name\t: AMD EPYC 7B13
@flags
flags\t\t: fpu vme sse2 hypervisor avx2
@detect_virt
kvm
@hypervisor_type
@xen_guest_type
@xen_caps
@dmi_sys_vendor
QEMU
@dmi_product_name
Standard PC (Q35 + ICH9, 2009)
@dmi_bios_vendor
SeaBIOS
"""


def test_fingerprint_of_a_kvm_guest():
    fp = describe(KVM_GUEST)
    assert fp["kernel"] == "6.1.0-26-amd64" and fp["machine"] == "x86_64"
    assert fp["cores"] == 4 and fp["memory_kib"] == 8123456
    assert fp["cpu_model"] == "AMD EPYC 7B13" and "avx2" in fp["cpu_flags"].split()
    assert (fp["hypervisor"], fp["hypervisor_source"]) == ("kvm", "systemd-detect-virt")
    assert fp["dmi"]["sys_vendor"] == "QEMU"


@pytest.mark.parametrize("found, expected", [
    ({"detect_virt": "microsoft"}, ("microsoft", "systemd-detect-virt")),
    ({"detect_virt": "xen", "hypervisor_type": "xen", "xen_guest_type": "PVH"},
     ("xen (PVH)", "systemd-detect-virt")),
    # No systemd: /sys/hypervisor/type; without guest_type only a PV domain lacks the flag.
    ({"hypervisor_type": "xen", "flags": "flags : fpu sse2"}, ("xen (PV)", "/sys/hypervisor/type")),
    ({"hypervisor_type": "xen", "flags": "flags : fpu hypervisor"},
     ("xen (HVM)", "/sys/hypervisor/type")),
    ({"flags": "flags : fpu hypervisor", "dmi_sys_vendor": "innotek GmbH"},
     ("oracle", "cpuinfo hypervisor flag and DMI vendor")),
    ({"flags": "flags : fpu hypervisor", "dmi_sys_vendor": "VMware, Inc."},
     ("vmware", "cpuinfo hypervisor flag and DMI vendor")),
    # QEMU without systemd: TCG (no kvm-clock) is qemu, as systemd-detect-virt says.
    ({"flags": "flags : fpu hypervisor", "dmi_sys_vendor": "QEMU",
      "clocksources": "tsc acpi_pm"}, ("qemu", "cpuinfo hypervisor flag and DMI vendor")),
    ({"flags": "flags : fpu hypervisor", "dmi_sys_vendor": "QEMU",
      "clocksources": "kvm-clock tsc acpi_pm"},
     ("kvm", "cpuinfo hypervisor flag, DMI vendor and kvm-clock")),
    ({"flags": "flags : fpu hypervisor"}, ("unknown", "cpuinfo hypervisor flag")),
    ({"flags": "flags : fpu sse2", "dmi_sys_vendor": "Dell Inc."},
     ("none", "no cpuinfo hypervisor flag")),
])
def test_hypervisor_from_each_source(found, expected):
    assert hypervisor(found) == expected


def test_ssh_host_on_the_command_line_is_a_variant():
    assert targets.parse_name("ssh:bench@10.0.0.2:2222") == (
        "ssh", {"host": "bench@10.0.0.2:2222"})
    assert "ssh:xen-guest" not in targets.known_names()   # any host, none listed
    with pytest.raises(VmtaxError, match="unknown target 'ssh:a b'"):
        targets.parse_name("ssh:a b")


def test_options_are_checked_in_one_line():
    with pytest.raises(VmtaxError, match=r"guest: host: expected the machine to reach"):
        plugin.build(SshOptions, {}, "guest", kind="ssh")
    with pytest.raises(VmtaxError, match=r"guest: user: expected the user in host \(a\)"):
        plugin.build(SshOptions, {"host": "a@h", "user": "b"}, "guest", kind="ssh")
    with pytest.raises(VmtaxError, match=r"workdir: expected an absolute remote path"):
        plugin.build(SshOptions, {"host": "h", "workdir": "tmp"}, "guest", kind="ssh")
    with pytest.raises(VmtaxError, match=r"host_key_check: expected one of \"strict\""):
        plugin.build(SshOptions, {"host": "h", "host_key_check": "no"}, "guest", kind="ssh")


def test_target_takes_user_and_port_from_the_host_or_its_options(tmp_path):
    ctx = targets.TargetContext(work_dir=tmp_path, journal=None)
    one = targets.create("x", "ssh", {"host": "bench@h:2222"}, ctx)
    assert (one.config.user, one.config.host, one.config.port) == ("bench", "h", 2222)
    two = targets.create("y", "ssh", {"host": "h", "user": "u", "port": 2200}, ctx)
    assert (two.config.user, two.config.port) == ("u", 2200)
    assert parse_spec("h") == (None, "h", None)


def test_bundle_starts_host_programs_through_the_bundled_loader():
    bundle = remote_bundle.make(["sysbench"])
    assert bundle.loader is not None and bundle.loader.startswith("lib/ld-linux")
    assert "bin/sysbench" in bundle.files and bundle.sums.keys() == bundle.files.keys()
    assert any(p.startswith("lib/libc.so") for p in bundle.files)
    assert bundle.argv("/w/b", ["sysbench", "cpu", "run"]) == [
        f"/w/b/{bundle.loader}", "--library-path", "/w/b/lib", "/w/b/bin/sysbench", "cpu", "run"]
    assert bundle.argv("/w/b", ["rm", "-f", "x"]) == ["rm", "-f", "x"]
    assert remote_bundle.make(["sysbench"]).digest == bundle.digest
    assert bundle.dir("/var/tmp") == f"/var/tmp/.vmtax-bundle-{bundle.digest[:16]}"


def test_another_architecture_is_refused_in_one_line():
    with pytest.raises(TargetError, match="ssh pi:22: the remote is aarch64, not x86_64"):
        remote_bundle.check_arch("aarch64\n", "ssh pi:22")
    remote_bundle.check_arch("x86_64\n", "ssh h:22")


AWKWARD = ["a b", "it's", "$HOME", "`id`", "*", "--x", "semi;colon", "new\nline", ""]


@pytest.mark.live
def test_remote_command_line_keeps_every_argument_as_it_is():
    command = Session(SshConfig(host="h")).command(["printf", "[%s]", *AWKWARD])
    shown = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert shown.stdout == "".join(f"[{a}]" for a in AWKWARD)
    assert Session(SshConfig(host="h", sudo=True)).command(["true"]) == "sudo -n -- true"


@pytest.mark.live
def test_job_wrapper_records_the_job_and_the_killer_takes_its_whole_group(tmp_path):
    session = Session(SshConfig(host="h"))
    pid_file = tmp_path / "job.pid"
    ran = subprocess.run(session.job_argv(["sh", "-c", 'echo "$V"; pwd'], {"V": "x y"},
                                          str(tmp_path), str(pid_file)),
                         capture_output=True, text=True, check=True)
    assert ran.stdout == f"x y\n{tmp_path}\n"
    pid, start = pid_file.read_text().split()
    assert start.isdigit() and pid.isdigit()
    # A job in a session of its own, as sshd starts it, with a child in its group.
    job = subprocess.Popen(session.job_argv(["sh", "-c", "sleep 60 & sleep 61"], {}, "/",
                                            str(pid_file)), start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while (not pid_file.exists() or pid_file.read_text().split()[0] != str(job.pid)) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        group = [p for p in os.listdir("/proc") if p.isdigit()
                 and _pgid(int(p)) == job.pid]
        assert len(group) >= 2
        subprocess.run(session.kill_argv(str(tmp_path)), check=True, timeout=30)
        assert job.wait(timeout=10) == -9
        deadline = time.monotonic() + 10
        while any(_pgid(int(p)) == job.pid for p in group) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not any(_pgid(int(p)) == job.pid for p in group)
        assert not pid_file.exists()
        # A stale pid file (its process gone) is removed and kills nothing.
        pid_file.write_text(f"{job.pid} 1\n")
        subprocess.run(session.kill_argv(str(pid_file)), check=True, timeout=30)
        assert not pid_file.exists()
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
            job.wait()


def _pgid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else int(fields[2])
