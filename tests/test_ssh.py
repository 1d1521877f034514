"""ssh targets without a server: options, names, the remote's fingerprint, the bundle, and
the remote command lines (quoting, the job wrapper and its killer run by the local sh)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from vmtax.core import plugin
from vmtax.core import target as targets
from vmtax.core.errors import TargetError, VmtaxError
from vmtax.guest import remote_bundle
from vmtax.host import ssh_session
from vmtax.host.ssh_session import Session, SshConfig, parse_spec
from vmtax.targets.ssh import DETACH, SshOptions, describe, hypervisor

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
    argv, stdin = session.job_argv(["sh", "-c", 'echo "$V"; pwd'], {"V": "x y"},
                                   str(tmp_path), str(pid_file))
    ran = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=True)
    assert ran.stdout == f"x y\n{tmp_path}\n"
    pid, start = pid_file.read_text().split()
    assert start.isdigit() and pid.isdigit()
    # A job in a session of its own, as sshd starts it, with a child in its group.
    job = subprocess.Popen(session.job_argv(["sh", "-c", "sleep 60 & sleep 61"], {}, "/",
                                            str(pid_file))[0],
                           stdin=subprocess.DEVNULL, start_new_session=True)
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


# Values a job's environment can hold: a secret, and what a line- or quote-based reader
# would get wrong (a newline, both quotes, "=", the wrapper's own syntax, trailing newlines).
SECRET = "hunter2"
AWKWARD_ENV = {"SECRET": SECRET, "ODD": "a\nb'c\"=d $HOME `id` \\ \u00e9", "EMPTY": "",
               "TRAILING": "end\n\n", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def test_a_jobs_environment_values_are_never_on_its_command_line():
    """A remote command line is visible to every user of the remote (ps, /proc/PID/cmdline):
    only the names go there, the values on the wrapper's stdin."""
    session = Session(SshConfig("h"))
    argv, stdin = session.job_argv(["sysbench", "oltp_read_only"], AWKWARD_ENV, "/", "/j.pid")
    command = session.command(argv)
    for value in filter(None, AWKWARD_ENV.values()):
        assert not any(value in arg for arg in argv) and value not in command, argv
        assert value in stdin
    assert argv[-2:] == ["sysbench", "oltp_read_only"]
    with pytest.raises(TargetError, match="environment variable name 'A B'"):
        session.job_argv(["true"], {"A B": "x"}, "/", "/j.pid")


SHELLS = [pytest.param(shell, marks=pytest.mark.skipif(
    not any(os.access(os.path.join(d, shell[0]), os.X_OK) for d in ("/bin", "/usr/bin")),
    reason=f"no {shell[0]} here")) for shell in (["dash"], ["bash"], ["busybox", "sh"])]


@pytest.mark.live
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_the_wrapper_gives_the_job_every_value_as_it_is_in_any_posix_sh(tmp_path, shell):
    """The remote's sh may be dash, bash or busybox ash (minimal guests); run it locally."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    argv, stdin = Session.job_argv(["env"], AWKWARD_ENV, str(scratch), str(scratch / "p"))
    assert argv[0] == "sh"
    ran = subprocess.run(shell + argv[1:], input=stdin, capture_output=True, text=True,
                         timeout=30)
    assert ran.returncode == 0, ran.stderr
    for name, value in AWKWARD_ENV.items():
        assert f"\n{name}={value}\n" in "\n" + ran.stdout, ran.stdout
    # Started detached, as ssh targets start servers: the values go through a 0600 file,
    # removed as soon as the job has it open.
    log = scratch / "server.log"
    detached = subprocess.run(shell + ["-c", DETACH, str(log), *argv], input=stdin,
                              capture_output=True, text=True, timeout=30)
    assert detached.returncode == 0, detached.stderr
    deadline = time.monotonic() + 30
    while f"SECRET={SECRET}" not in (log.read_text() if log.exists() else "") \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    shown = "\n" + log.read_text()
    assert all(f"\n{name}={value}\n" in shown for name, value in AWKWARD_ENV.items()), shown
    assert sorted(os.listdir(scratch)) == ["p", "server.log"]


@pytest.mark.live
def test_a_value_ending_like_the_delimiter_begins_is_kept_whole(monkeypatch):
    """A value ending with the start of the delimiter must not end where a self-overlapping
    delimiter ("abab": "ab" + "abab" holds "abab" from 0) would be found too early."""
    monkeypatch.setattr(ssh_session.secrets, "token_hex", lambda _: "abab")
    env = {"A": "@ab", "B": "x@aba", "C": "@"}
    argv, stdin = Session.job_argv(["env"], env, "/", "/dev/null")
    ran = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    assert all(f"\n{k}={v}\n" in "\n" + ran.stdout for k, v in env.items()), ran.stdout


def _pgid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else int(fields[2])


def test_a_missing_known_hosts_file_is_named(tmp_path):
    missing = tmp_path / "no" / "known_hosts"
    session = Session(SshConfig("192.0.2.1", known_hosts=str(missing)))
    with pytest.raises(TargetError) as caught:
        session.connect()   # refused before any connection is tried
    assert str(caught.value).startswith(
        f"ssh 192.0.2.1:22: the known hosts file {missing} does not exist")
    assert 'host_key_check = "accept-new"' in str(caught.value)


class _NoSftpConnection:
    """An asyncssh connection to a server without an SFTP subsystem: what each exec
    channel is asked to run, with the bytes it was given on stdin."""

    def __init__(self):
        self.commands: list[tuple[str, bytes]] = []

    async def start_sftp_client(self):
        import asyncssh
        raise asyncssh.ChannelOpenError(asyncssh.OPEN_REQUEST_SESSION_FAILED,
                                        "Session request failed")

    async def run(self, command, *, stdin, encoding, check):
        import asyncssh
        data = b"" if stdin == asyncssh.DEVNULL else open(stdin, "rb").read()
        self.commands.append((command, data))
        # The local sh stands in for the remote's shell.
        done = subprocess.run(["sh", "-c", command], input=data, capture_output=True)
        return asyncssh.SSHCompletedProcess(command, None, None, done.returncode, None, None,
                                            done.stdout, done.stderr)


def test_without_sftp_files_go_over_exec_channels_quoted(tmp_path):
    session = Session(SshConfig("192.0.2.1"))
    session.conn = _NoSftpConnection()   # type: ignore[assignment]
    local = tmp_path / "program"
    local.write_bytes(b"\x7fELF\x00\xff binary")
    remote = str(tmp_path / "remote dir" / "$(touch pwned) 'x'")
    session.put({remote: local})
    assert open(remote, "rb").read() == local.read_bytes()
    assert os.stat(remote).st_mode & 0o777 == 0o755
    assert not (tmp_path / "pwned").exists() and not os.path.exists("pwned")
    mkdir, copy = session.conn.commands
    assert mkdir[0].startswith("mkdir -p -- ") and copy[1] == local.read_bytes()
    # A remote path that cannot be written: one line naming the copy.
    session.conn.commands.clear()
    with pytest.raises(TargetError) as caught:
        session.put({"/proc/vmtax-cannot/x": local})
    assert str(caught.value).startswith(
        "ssh 192.0.2.1:22: making /proc/vmtax-cannot over an exec channel")
