"""VM target without booting a guest: QEMU argv, accel choice, the agent protocol (host half
against canned bytes, guest half run by busybox on the host), and boot-failure handling."""

import contextlib
import os
import pty
import re
import shutil
import socket
import stat
import subprocess
import time
import tty
from pathlib import Path

import pytest

from vmtax.core import plugin
from vmtax.core import target as targets
from vmtax.core.errors import TargetError, VmtaxError
from vmtax.core.target import TargetContext
from vmtax.core.types import Job
from vmtax.guest.agent import Channel, encode_job, read_result
from vmtax.guest.image import GuestImage, guest_file
from vmtax.guest.qemu import VmConfig, kernel_cmdline, parse_size, qemu_argv, resolve_accel
from vmtax.host import kvm
from vmtax.host import binary
from vmtax.host.journal import Journal
from vmtax.targets import vm


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Images these tests make (fake kernels) stay out of the user's cache."""
    monkeypatch.setenv("VMTAX_CACHE", str(tmp_path / "default-cache"))


def config(accel: str, machine: str, cpu: str) -> VmConfig:
    return VmConfig(qemu="/usr/bin/qemu-system-x86_64", accel=accel, machine=machine, cpu=cpu,
                    vcpus=2, memory="1G", kernel=Path("/c/vmlinux"),
                    initramfs=Path("/c/initrd.cpio"), append="console=ttyS0 quiet",
                    agent_socket=Path("/r/agent.sock"), qmp_socket=Path("/r/qmp.sock"),
                    console_log=Path("/r/console.log"), disk=Path("/w/scratch.img"),
                    disk_cache="none")


def expected(accel_arg: str, machine_arg: str, cpu: str, bus: str) -> list[str]:
    return [
        "/usr/bin/qemu-system-x86_64", "-nodefaults", "-no-user-config", "-display", "none",
        "-no-reboot", "-accel", accel_arg, "-machine", machine_arg, "-cpu", cpu,
        "-smp", "2", "-m", "1G", "-kernel", "/c/vmlinux", "-initrd", "/c/initrd.cpio",
        "-append", "console=ttyS0 quiet",
        "-chardev", "file,id=console,path=/r/console.log", "-serial", "chardev:console",
        "-chardev", "socket,id=agent,path=/r/agent.sock",
        "-device", f"virtio-serial-{bus},id=vser",
        "-device", "virtserialport,bus=vser.0,chardev=agent,name=vmtax.agent",
        "-drive", "if=none,id=scratch,format=raw,file=/w/scratch.img,cache=none",
        "-device", f"virtio-blk-{bus},drive=scratch",
        "-qmp", "unix:/r/qmp.sock,server=on,wait=off"]


@pytest.mark.parametrize("accel,accel_arg,cpu", [("kvm", "kvm", "host"),
                                                 ("tcg", "tcg,thread=multi", "max")])
@pytest.mark.parametrize("machine,machine_arg,bus", [
    ("microvm", "microvm,x-option-roms=off", "device"), ("q35", "q35", "pci")])
def test_qemu_argv_exact(accel, accel_arg, cpu, machine, machine_arg, bus):
    assert qemu_argv(config(accel, machine, cpu)) == expected(accel_arg, machine_arg, cpu, bus)


def test_qemu_argv_escapes_commas_in_paths():
    cfg = VmConfig(**{**config("tcg", "microvm", "max").__dict__,
                      "disk": Path("/w/a,b/scratch.img"), "console_log": Path("/r,1/c.log")})
    argv = qemu_argv(cfg)
    assert "if=none,id=scratch,format=raw,file=/w/a,,b/scratch.img,cache=none" in argv
    assert "file,id=console,path=/r,,1/c.log" in argv


def test_qemu_argv_without_disk():
    argv = qemu_argv(VmConfig(**{**config("tcg", "microvm", "max").__dict__, "disk": None}))
    assert "-drive" not in argv and not any("virtio-blk" in a for a in argv)


SCSI_HD = "scsi-hd,drive=scratch,bus=scsi0.0"


@pytest.mark.parametrize("machine,bus,devices", [
    ("microvm", "virtio-scsi", ["virtio-scsi-device,id=scsi0", SCSI_HD]),
    ("q35", "virtio-scsi", ["virtio-scsi-pci,id=scsi0", SCSI_HD]),
    ("q35", "nvme", ["nvme,drive=scratch,serial=vmtax-scratch"]),
    ("microvm", "nvme", ["nvme,drive=scratch,serial=vmtax-scratch"]),
])
def test_qemu_argv_scratch_disk_on_its_bus(machine, bus, devices):
    cfg = VmConfig(**{**config("tcg", machine, "max").__dict__, "disk_bus": bus})
    argv = qemu_argv(cfg)
    drive = argv.index("if=none,id=scratch,format=raw,file=/w/scratch.img,cache=none")
    assert argv[drive + 1:drive + 1 + 2 * len(devices)] == [
        a for device in devices for a in ("-device", device)]
    assert not any(a.startswith("virtio-blk") for a in argv)


def test_qemu_argv_virtio_scsi_controller_on_the_iothread():
    cfg = VmConfig(**{**config("kvm", "q35", "host").__dict__, "disk_bus": "virtio-scsi",
                      "iothread": True})
    assert "virtio-scsi-pci,id=scsi0,iothread=iothread0" in qemu_argv(cfg)


@pytest.mark.parametrize("machine, bus, machine_arg", [
    ("microvm", "nvme", "microvm,x-option-roms=off,pcie=on"),
    ("microvm", "virtio-scsi", "microvm,x-option-roms=off"),
    ("q35", "nvme", "q35"),
])
def test_qemu_argv_microvm_gets_a_pcie_bus_for_nvme_alone(machine, bus, machine_arg):
    argv = qemu_argv(VmConfig(**{**config("tcg", machine, "max").__dict__, "disk_bus": bus}))
    assert argv[argv.index("-machine") + 1] == machine_arg


def test_nvme_on_a_microvm_without_pcie_is_refused(monkeypatch):
    monkeypatch.setattr(vm, "qemu_properties", lambda qemu, option, name: frozenset({"acpi"}))
    with pytest.raises(VmtaxError, match='disk_bus: expected "virtio-blk" or "virtio-scsi" on '
                                         'machine = "microvm" .* has no PCIe bus'):
        plugin.build(vm.VmOptions, {"disk_bus": "nvme"}, "vm")


@pytest.mark.parametrize("options, problem", [
    ({"disk_bus": "virtio-scsi", "kernel": "minimal"},
     'disk_bus: expected "virtio-blk" with kernel = "minimal"'),
    ({"disk_bus": "nvme", "machine": "q35", "kernel": "minimal"},
     'disk_bus: expected "virtio-blk" with kernel = "minimal"'),
])
def test_a_disk_bus_the_guest_cannot_have_is_refused(options, problem):
    with pytest.raises(VmtaxError, match=re.escape(problem)):
        plugin.build(vm.VmOptions, options, "vm")


@pytest.mark.parametrize("options", [{"disk_bus": "virtio-scsi"}, {"disk_bus": "nvme"},
                                     {"disk_bus": "nvme", "machine": "q35"}])
def test_a_disk_bus_the_guest_can_have_is_accepted(options):
    assert plugin.build(vm.VmOptions, options, "vm").disk_bus == options["disk_bus"]


def test_nvme_with_an_iothread_needs_a_qemu_whose_nvme_takes_one(monkeypatch):
    monkeypatch.setattr(vm, "qemu_properties",
                        lambda qemu, option, name: frozenset({"serial", "pcie"}))
    monkeypatch.setattr(vm, "resolve_accel", lambda accel: "kvm")
    with pytest.raises(VmtaxError, match="iothread: expected false with disk_bus = \"nvme\""):
        plugin.build(vm.VmOptions, {"disk_bus": "nvme", "machine": "q35", "iothread": True},
                     "vm")


def test_kernel_cmdline():
    micro = kernel_cmdline("microvm", 2596122, 250).split()
    assert micro[:4] == ["console=ttyS0", "quiet", "panic=-1", "vmtax.bus=mmio"]
    assert "tsc_early_khz=2596122" in micro and "lpj=10384488" in micro
    assert "acpi=off" not in micro and "tsc=reliable" in micro
    q35 = kernel_cmdline("q35", 2596122, 250).split()
    assert "vmtax.bus=pci" in q35 and not any(a.startswith("tsc_early_khz") for a in q35)
    unknown = kernel_cmdline("microvm", None, None)
    assert "lpj=" not in unknown and "tsc_early_khz" not in unknown
    assert "lpj=" not in kernel_cmdline("microvm", 2596122, None)


def test_kernel_cmdline_under_tcg_and_with_the_minimal_kernels_parameters():
    assert "noreplace-smp" not in kernel_cmdline("microvm", 2596122, 1000).split()
    assert "noreplace-smp" in kernel_cmdline("microvm", 2596122, 1000, tcg=True).split()
    # QEMU's APIC timer: 1 GHz, in bus cycles per tick; only to a kernel that takes it.
    assert "lapic_timer_period=1000000" in kernel_cmdline(
        "q35", None, 1000, tcg=True, params=("lapic_timer_period",)).split()
    assert "lapic_timer_period" not in kernel_cmdline(   # KVM calibrates it, cheaply
        "q35", None, 1000, params=("lapic_timer_period",))
    assert "lapic_timer_period" not in kernel_cmdline("q35", None, 1000)
    assert "lapic_timer_period" not in kernel_cmdline("q35", None, None,
                                                      params=("lapic_timer_period",))


def test_parse_size():
    assert parse_size("4G") == 4 << 30
    assert parse_size("512M") == 512 << 20
    assert parse_size("1GiB") == 1 << 30
    assert parse_size("4096") == 4096
    with pytest.raises(VmtaxError, match="bad size"):
        parse_size("lots")


# --- accel -------------------------------------------------------------------------------

def fake_probe(monkeypatch, usable: bool, reason: str = "KVM is present but unusable: test"):
    calls = []

    def probe():
        calls.append(1)
        return kvm.KvmStatus(usable, reason, "kvm_pvm")
    monkeypatch.setattr(kvm, "probe", probe)
    return calls


def test_accel_tcg_never_probes(monkeypatch):
    calls = fake_probe(monkeypatch, True)
    assert resolve_accel("tcg") == "tcg"
    assert calls == []


@pytest.mark.parametrize("usable,want", [(True, "kvm"), (False, "tcg")])
def test_accel_auto(monkeypatch, usable, want):
    fake_probe(monkeypatch, usable)
    assert resolve_accel("auto") == want


def test_accel_kvm_unusable_is_one_line_error(monkeypatch):
    fake_probe(monkeypatch, False, "KVM is present but unusable: kvm_pvm boots only PVM guests")
    with pytest.raises(VmtaxError) as err:
        resolve_accel("kvm")
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("--accel kvm: KVM is present but unusable: kvm_pvm")
    assert msg.endswith("use --accel tcg or auto")


def test_accel_kvm_usable(monkeypatch):
    fake_probe(monkeypatch, True)
    assert resolve_accel("kvm") == "kvm"


def test_accel_unknown():
    with pytest.raises(VmtaxError, match="unknown accel"):
        resolve_accel("hvf")


# --- host half of the protocol -----------------------------------------------------------

def test_encode_job_tokens():
    line = encode_job(7, Job(["sysbench", "cpu", "--cpu-max-prime=2000", "two words", "$HOME",
                              "*", "a\nb\n"], env={"LANG": "C", "X": "1 2"}, timeout=5,
                             in_scratch=True)).decode()
    assert line.endswith("\n") and line.count("\n") == 1
    fields = line.split()
    assert fields[:5] == ["JOB", "7", "5.000", "1", "2"]
    tokens = fields[5:]
    assert tokens[0] == "p:LANG=C"
    assert tokens[2:5] == ["p:sysbench", "p:cpu", "p:--cpu-max-prime=2000"]
    import base64
    decoded = [base64.b64decode(t[2:]).decode() for t in (tokens[1], *tokens[5:])]
    assert decoded == ["X=1 2", "two words", "$HOME", "*", "a\nb\n"]
    assert all(t[:2] in ("p:", "b:") for t in tokens)


def test_encode_job_rejects_bad_env_name_and_empty_argv():
    with pytest.raises(VmtaxError, match="environment variable"):
        encode_job(1, Job(["true"], env={"A B": "x"}))
    with pytest.raises(VmtaxError, match="command"):
        encode_job(1, Job([]))


def frame(job_id, status, out: bytes, err: bytes, timed_out=0, elapsed=123) -> bytes:
    return (f"RESULT {job_id} {status} {timed_out} {elapsed} {len(out)} {len(err)}\n".encode()
            + out + err)


def test_read_result_payload_that_looks_like_protocol():
    tricky = b"RESULT 1 0 0 5 3 3\nabcdef\nREADY x\n"
    a, b = socket.socketpair()
    with a, b:
        a.sendall(frame(1, 3, tricky, b"RESULT 2 0 0 0 0 0\n"))
        res = read_result(Channel(b), 1, time.monotonic() + 5)
    assert (res.exit_code, res.timed_out, res.elapsed_ns) == (3, False, 123)
    assert res.stdout == tricky
    assert res.stderr == b"RESULT 2 0 0 0 0 0\n"


def test_read_result_skips_stale_answers_and_splits_frames():
    a, b = socket.socketpair()
    with a, b:
        data = frame(4, 0, b"old\n", b"") + frame(5, 0, b"new", b"e", timed_out=1)
        channel = Channel(b)
        for i in range(0, len(data), 3):   # arbitrary chunking must not matter
            a.sendall(data[i:i + 3])
        res = read_result(channel, 5, time.monotonic() + 5)
    assert (res.stdout, res.stderr, res.timed_out) == (b"new", b"e", True)


def test_read_result_errors():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"hello world\n")
        with pytest.raises(TargetError, match="protocol error"):
            read_result(Channel(b), 1, time.monotonic() + 5)
        with pytest.raises(TimeoutError):
            read_result(Channel(b), 1, time.monotonic() + 0.2)
        a.close()
        with pytest.raises(EOFError):
            read_result(Channel(b), 1, time.monotonic() + 5)


def test_channel_check_gives_up_early():
    def dead():
        raise EOFError("QEMU exited")
    a, b = socket.socketpair()
    with a, b:
        start = time.monotonic()
        with pytest.raises(EOFError, match="QEMU exited"):
            Channel(b, dead).readline(time.monotonic() + 30)
        assert time.monotonic() - start < 2


# --- guest half: the real agent script, run by busybox on the host over a raw pty ---------

APPLETS = ("sh", "base64", "setsid", "sleep", "wc", "cat", "rm", "printf", "echo", "true",
           "false", "kill", "pwd", "env", "yes", "head")


class PtyEnd:
    """The master side of a pty, shaped like the socket Channel expects."""

    def __init__(self, fd: int):
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def recv(self, n: int) -> bytes:
        try:
            return os.read(self.fd, n)
        except OSError:   # EIO once the agent has gone
            return b""

    def sendall(self, data: bytes) -> None:
        while data:
            data = data[os.write(self.fd, data):]


@pytest.fixture
def slow_setsid():
    """Whether setsid starts late (a busy guest): the agent's fixture then delays it."""
    return False


@pytest.fixture
def agent(tmp_path, slow_setsid):
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox is not installed")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for applet in APPLETS:
        (bindir / applet).symlink_to(busybox)
    shell = [busybox, "sh"]
    if slow_setsid:
        # The watchdog's setsid (of `sh -c`) starts late, the job's does not. busybox's sh
        # runs its own setsid whatever PATH says, so dash runs the agent here.
        shell = [shutil.which("dash") or pytest.skip("dash is not installed")]
        (bindir / "setsid").unlink()
        (bindir / "setsid").write_text(f'#!{busybox} sh\n[ "$1" = sh ] && sleep 0.3\n'
                                       f'exec {busybox} setsid "$@"\n')
        (bindir / "setsid").chmod(0o755)
    script = tmp_path / "agent"
    script.write_bytes(guest_file("agent"))
    master, slave = pty.openpty()
    tty.setraw(slave)
    proc = subprocess.Popen(
        [*shell, str(script), os.ttyname(slave)], start_new_session=True,
        env={"PATH": str(bindir), "HOME": str(tmp_path), "VMTAX_AGENT_TMP": str(tmp_path)},
        stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    channel = Channel(PtyEnd(master))
    ids = iter(range(1, 1000))

    def run(job: Job):
        job_id = next(ids)
        channel.send(encode_job(job_id, job))
        return read_result(channel, job_id, time.monotonic() + job.timeout + 10)
    ready = channel.readline(time.monotonic() + 10).split()
    assert ready[0] == b"READY" and float(ready[2]) > 0
    yield run
    os.killpg(proc.pid, 9)
    proc.wait()
    # The agent's watchdogs run in sessions of their own (as they must in a guest): kill
    # this agent's, which name its files, so no test leaves them sleeping.
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        if str(tmp_path).encode() in _cmdline(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(pid), 9)
    os.close(master)
    os.close(slave)   # open until now: a pty with no slave open reads as EIO


def test_agent_runs_argv_without_a_shell(agent):
    res = agent(Job(["printf", "%s|", "two words", "$HOME", "*", "a\nb\n", "", "-n"]))
    assert res.exit_code == 0 and not res.timed_out
    assert res.stdout == b"two words|$HOME|*|a\nb\n||-n|"
    assert res.elapsed_ns > 0


def test_agent_exit_status_stderr_and_env(agent):
    res = agent(Job(["sh", "-c", 'echo "$GREETING" >&2; exit 3'],
                    env={"GREETING": "hi there; $(rm -rf /)"}))
    assert (res.exit_code, res.stdout, res.stderr) == (3, b"", b"hi there; $(rm -rf /)\n")


def test_agent_output_that_looks_like_protocol(agent):
    text = "RESULT 1 0 0 0 999 0\nREADY\nJOB 1 1 0 0 p:x\n"
    res = agent(Job(["printf", "%s", text]))
    assert res.stdout == text.encode()
    assert agent(Job(["echo", "still in sync"])).stdout == b"still in sync\n"


def test_agent_large_binary_output(agent):
    res = agent(Job(["head", "-c", "200000", "/dev/urandom"]))
    assert len(res.stdout) == 200000


def test_agent_kills_job_and_its_children_at_timeout(agent):
    start = time.monotonic()
    res = agent(Job(["sh", "-c", "sleep 30 & sleep 30; echo never"], timeout=0.5))
    assert res.timed_out and res.stdout == b""
    assert time.monotonic() - start < 5
    assert 0.4e9 < res.elapsed_ns < 5e9
    assert agent(Job(["echo", "alive"])).stdout == b"alive\n"


def test_agent_kills_what_a_job_leaves_behind(agent, tmp_path):
    marker = tmp_path / "leftover"
    res = agent(Job(["sh", "-c", f"(sleep 1; echo late > {marker}) & echo started"]))
    assert (res.exit_code, res.stdout) == (0, b"started\n")
    time.sleep(1.5)
    assert not marker.exists()


def test_agent_missing_command(agent):
    res = agent(Job(["no-such-command-here"]))
    assert res.exit_code == 127 and not res.timed_out


# --- target lifecycle without a real guest -----------------------------------------------

def fake_kernel(tmp_path: Path) -> Path:
    kernel = tmp_path / "vmlinux"
    kernel.write_bytes(b"\x7fELF" + b"\0" * 60 + b"Linux version 6.6.6-fake (x@y) #1\0")
    return kernel


def fake_qemu(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-qemu"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def ctx(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    journal = Journal(tmp_path / "journal")
    (tmp_path / "journal").mkdir(exist_ok=True)
    image = GuestImage([], fake_kernel(tmp_path), cache=tmp_path / "cache")
    return TargetContext(work_dir=work, journal=journal, image=image)


def target(ctx, tmp_path, qemu_body: str, **options):
    return targets.create("vm:test", "vm", {
        "accel": "tcg", "kernel": str(tmp_path / "vmlinux"), "disk_size": "64M",
        "qemu": fake_qemu(tmp_path, qemu_body), **options}, ctx)


def assert_clean(ctx, t):
    assert ctx.journal.entries == {}
    assert list(ctx.work_dir.iterdir()) == []
    assert not t.alive()


def test_boot_failure_when_qemu_exits(ctx, tmp_path):
    t = target(ctx, tmp_path, 'echo "qemu-system-x86_64: cannot frobnicate" >&2; exit 1')
    with pytest.raises(TargetError) as err:
        t.prepare()
    msg = str(err.value)
    assert "\n" not in msg
    assert "QEMU exited with status 1" in msg and "cannot frobnicate" in msg
    assert_clean(ctx, t)


def test_boot_failure_says_how_to_see_more(ctx, tmp_path):
    t = target(ctx, tmp_path, "exec sleep 60", boot_timeout=0.5, icount="shift=0", vcpus=2)
    with pytest.raises(TargetError) as err:
        t.prepare()
    assert str(err.value).endswith(
        '; console: empty; kernel_args = "loglevel=7" shows the kernel\'s messages; icount '
        'with several vCPUs can hang bringing up the second vCPU; try vcpus = 1')


def test_boot_timeout_kills_qemu(ctx, tmp_path):
    t = target(ctx, tmp_path, "exec sleep 60", boot_timeout=0.5)
    start = time.monotonic()
    with pytest.raises(TargetError, match=r"no agent READY within 0.5 s"):
        t.prepare()
    assert time.monotonic() - start < 10
    assert_clean(ctx, t)
    t.cleanup()   # idempotent


@pytest.mark.parametrize("options, message", [
    ({"qemu": "/nonexistent/qemu"}, "vm: qemu: expected an executable program (a path, or a "
                                    "name found on PATH), got '/nonexistent/qemu'"),
    ({"kernel": "/nonexistent/vmlinuz"}, "vm: kernel: expected \"debian\" (Debian's kernel), "
                                         "\"debian-rt\" (its PREEMPT_RT kernel), \"minimal\" "
                                         "(built by vmtax) or the path "
                                         "of a vmlinux or bzImage file, got "
                                         "'/nonexistent/vmlinuz'"),
    ({"machine": "isapc"}, 'vm: machine: expected one of "microvm", "q35", got \'isapc\''),
    ({"kernel_args": "quiet\ninit=/bin/sh"}, "vm: kernel_args: expected a non-empty string, "
                                             "without control characters"),
])
def test_bad_options_are_one_line_errors_before_anything_starts(ctx, options, message):
    with pytest.raises(VmtaxError) as err:
        targets.create("vm", "vm", {"accel": "tcg", **options}, ctx)
    assert str(err.value).startswith(message)
    assert list(ctx.work_dir.iterdir()) == []


def test_fingerprint_without_boot(ctx, tmp_path, monkeypatch):
    monkeypatch.setattr(vm, "host_tsc_khz", lambda: 2000000)
    t = target(ctx, tmp_path, 'echo "QEMU emulator version 9.9.9"')
    fp = t.fingerprint()
    assert fp["qemu_version"] == "QEMU emulator version 9.9.9"
    assert (fp["accel"], fp["machine"], fp["cpu"], fp["vcpus"], fp["memory"]) == (
        "tcg", "microvm", "max", 2, "1G")
    assert fp["kernel_version"] == "6.6.6-fake"
    # What QEMU and the kernel are, not only where (issue 48.4): a rebuild is told apart.
    assert fp["qemu_sha256"] == binary.short_id(t.opts.qemu) and len(fp["qemu_sha256"]) == 16
    assert len(fp["kernel_sha256"]) == 16
    assert "tsc_early_khz=2000000" in fp["append"] and "noreplace-smp" in fp["append"]
    assert fp["initramfs"] and fp["binaries"] == []
    assert fp["transparent_hugepages"] is False   # under TCG: vm_instance.qemu_preexec


def thp_enabled(preexec) -> str:
    status = subprocess.run(["cat", "/proc/self/status"], preexec_fn=preexec,
                            capture_output=True, text=True, check=True).stdout
    return re.search(r"^THP_enabled:\s+(\d)", status, re.MULTILINE)[1]


def test_qemu_goes_without_transparent_hugepages_under_tcg_only():
    from vmtax.targets.vm_instance import qemu_preexec
    assert thp_enabled(qemu_preexec(config("tcg", "microvm", "max"), None)) == "0"
    assert qemu_preexec(config("kvm", "microvm", "host"), None) is None
    assert thp_enabled(None) == "1"
    entered = []
    in_network = qemu_preexec(config("kvm", "q35", "host"), lambda: entered.append(1))
    assert in_network is not None
    in_network()
    assert entered == [1]


# --- huge pages and pinning ----------------------------------------------------------------

def hugepage_config(machine: str, size: str | None) -> VmConfig:
    return VmConfig(**{**config("tcg", machine, "max").__dict__, "hugepages": size,
                       "mem_path": Path("/tmp/vmtax-hugetlbfs-x") if size else None})


@pytest.mark.parametrize("machine,machine_arg", [("microvm", "microvm,x-option-roms=off"),
                                                 ("q35", "q35")])
@pytest.mark.parametrize("size", ["2M", "1G"])
def test_qemu_argv_guest_ram_on_host_huge_pages(machine, machine_arg, size):
    argv = qemu_argv(hugepage_config(machine, size))
    assert argv[argv.index("-machine") + 1] == f"{machine_arg},memory-backend=ram"
    i = argv.index("-m")
    # The page size is the mount's: the backend only names the hugetlbfs directory.
    assert argv[i:i + 4] == ["-m", "1G", "-object",
                             "memory-backend-file,id=ram,size=1G,mem-path=/tmp/vmtax-hugetlbfs-x,"
                             "prealloc=on,share=off"]
    assert argv.count("-object") == 1 and "-numa" not in argv


@pytest.mark.parametrize("machine", ["microvm", "q35"])
def test_qemu_argv_without_huge_pages_is_plain_memory(machine):
    argv = qemu_argv(hugepage_config(machine, None))
    assert "-object" not in argv and "memory-backend" not in " ".join(argv)
    assert argv[argv.index("-m"):argv.index("-m") + 2] == ["-m", "1G"]


def test_qemu_argv_escapes_commas_in_the_hugetlbfs_path():
    cfg = VmConfig(**{**hugepage_config("microvm", "2M").__dict__, "mem_path": Path("/t/a,b")})
    assert "mem-path=/t/a,,b,prealloc=on" in qemu_argv(cfg)[qemu_argv(cfg).index("-object") + 1]


def test_kernel_args_come_last_so_a_repeated_one_wins():
    line = kernel_cmdline("microvm", 2596122, 250, 0, " tsc_early_khz=5192244 mitigations=off ")
    assert line.split()[-2:] == ["tsc_early_khz=5192244", "mitigations=off"]
    assert line.split().index("tsc_early_khz=2596122") < line.split().index("tsc_early_khz=5192244")


def test_kernel_cmdline_guest_hugepages():
    assert kernel_cmdline("microvm", 2596122, 250, 48).split()[-1] == "hugepages=48"
    assert "hugepages=" not in kernel_cmdline("q35", None, None, 0)
    assert "hugepages=" not in kernel_cmdline("microvm", 2596122, 250)


def problems(**options):
    return vm.VmOptions.model_validate(options).problems()


@pytest.mark.parametrize("options,problem", [
    (dict(hugepages="1G", memory="1536M"),
     ("memory", 'a whole number of 1 GiB huge pages (hugepages = "1G")')),
    (dict(memory="1G", guest_hugepages=385),
     ("guest_hugepages", "at most 384 2 MiB pages, which leaves the guest 256 MiB of its "
                         "memory (1G); or more memory")),
    (dict(vcpus=2, pin=[0]), ("pin", "one host CPU per vCPU (vcpus = 2)")),
    (dict(memory="99T"), ("memory", "at most the host's memory (")),
])
def test_option_problems(options, problem):
    [(option, expected)] = problems(**options)
    assert option == problem[0] and expected.startswith(problem[1])


@pytest.mark.parametrize("option, value, expected", [
    ("hugepages", "4M", 'one of "2M", "1G", "none"'),
    ("guest_hugepages", -1, "a whole number from 0 to 1000000000"),
    ("pin", [0, 0], "distinct host CPUs vmtax may use"),
    ("pin", [4096], "distinct host CPUs vmtax may use"),
    ("pin", "0-4096", "distinct host CPUs vmtax may use"),
])
def test_each_value_is_checked_by_its_option(option, value, expected):
    with pytest.raises(plugin.Invalid, match=re.escape(expected)):
        plugin.option_infos(vm.VmOptions)[option].check(value)


def test_options_that_fit_together():
    cpu = min(os.sched_getaffinity(0))
    assert problems(hugepages="2M", memory="1G", guest_hugepages=384, vcpus=1, pin=[cpu]) == []
    assert problems(hugepages="1G", memory="2G") == []
    assert plugin.option_infos(vm.VmOptions)["pin"].check(f"{cpu}") == [cpu]


def test_pinning_several_vcpus_with_icount_is_refused():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two host CPUs")
    assert problems(vcpus=2, pin=cpus[:2], icount="shift=0") == [
        ("pin", "no pinning of several vCPUs with icount (TCG then runs them all in one "
                "thread)")]


def test_target_refuses_options_that_do_not_fit_in_one_line(tmp_path):
    (tmp_path / "j").mkdir()
    ctx = TargetContext(work_dir=tmp_path, journal=Journal(tmp_path / "j"))
    with pytest.raises(VmtaxError) as err:
        targets.create("vm", "vm", {"vcpus": 2, "pin": [0]}, ctx)
    assert str(err.value) == "vm: pin: expected one host CPU per vCPU (vcpus = 2), got [0]"


def test_defaults_include_huge_pages_and_pinning():
    d = vm.VmOptions()
    assert (d.hugepages, d.guest_hugepages, d.pin) == (None, 0, None)


def test_agent_leaves_no_zombies_behind(agent, tmp_path):
    """A watchdog per job: over many jobs none may linger as a zombie (a guest's pid space
    is finite and the agent is its init)."""
    for _ in range(30):
        assert agent(Job(["true"])).exit_code == 0
    script = str(tmp_path / "agent")
    agents = [p for p in os.listdir("/proc") if p.isdigit()
              and script.encode() in _cmdline(p)]
    children = [p for p in os.listdir("/proc") if p.isdigit() and _ppid(p) in agents]
    zombies = [p for p in children if _state(p) == "Z"]
    assert len(zombies) <= 1, zombies   # at most the last job's, until the next command


def _cmdline(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return b""


def _stat(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return ["?", "0"]


def _ppid(pid):
    return _stat(pid)[1]


def _state(pid):
    return _stat(pid)[0]


@pytest.mark.parametrize("console, why", [
    ("[   17.2] Out of memory: Killed process 312 (sysbench) total-vm:1024kB, anon-rss:5kB\n",
     "exit status 137: killed by the guest's OOM killer (its memory ran out): Out of memory: "
     "Killed process 312 (sysbench)"),
    ("", "exit status 137: killed by SIGKILL inside the guest; its kernel said nothing of it "
         "on the console"),
])
def test_a_job_killed_inside_the_guest_says_by_what(tmp_path, monkeypatch, console, why):
    """q35's fileio prepare ended "exit status 137" and nothing else."""
    from types import SimpleNamespace

    from vmtax.guest.agent import AgentResult
    from vmtax.studies.runner import _failure
    from vmtax.guest import agent_session
    from vmtax.targets import vm_instance
    log = tmp_path / "console.log"
    log.write_text("[    0.5] an old OOM line: Out of memory: Killed process 1 (init)\n")

    def killed(channel, job_id, deadline):
        with open(log, "a") as f:    # what the kernel prints while the job runs
            f.write(console)
        return AgentResult(137, False, 10**9, b"Creating file test_file.77\n", b"")
    monkeypatch.setattr(agent_session, "read_result", killed)
    guest = object.__new__(vm_instance.VmInstance)
    session = agent_session.AgentSession("vm", SimpleNamespace(send=lambda data: None), log,
                                         kill=lambda: None, host_margin=1)
    guest.__dict__.update(_proc=SimpleNamespace(poll=lambda: None), session=session)
    job = Job(["sysbench", "fileio", "prepare"], timeout=60)
    assert _failure(guest.run(job), job) == why


@pytest.mark.parametrize("slow_setsid", [True])
def test_a_watchdog_slower_to_start_than_its_job_never_kills_a_later_job(agent):
    """A job done before its watchdog's setsid left the watchdog alive, and it killed the
    job running when its timeout came: q35's fileio prepare, exit 137, 30 s after the
    boot's 30-second jobs."""
    fast = agent(Job(["true"], timeout=1))
    assert fast.exit_code == 0
    later = agent(Job(["sleep", "3"], timeout=10))
    assert (later.exit_code, later.timed_out) == (0, False)


def test_the_agent_speaks_on_the_descriptor_its_vsock_client_leaves_it(tmp_path):
    """Under Firecracker and Cloud Hypervisor the guest's vsock client connects, puts the
    connection on fd 3 and executes the agent with "fd:3" (guest/init): the agent then
    speaks there as on a virtio-serial port. A socketpair stands in for the vsock."""
    busybox = shutil.which("busybox") or pytest.skip("busybox is not installed")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for applet in APPLETS:
        (bindir / applet).symlink_to(busybox)
    script = tmp_path / "agent"
    script.write_bytes(guest_file("agent"))
    host, guest = socket.socketpair()
    proc = subprocess.Popen(
        [busybox, "sh", str(script), "fd:3"], start_new_session=True, pass_fds=(3,),
        preexec_fn=lambda: os.dup2(guest.fileno(), 3),
        env={"PATH": str(bindir), "HOME": str(tmp_path), "VMTAX_AGENT_TMP": str(tmp_path)},
        stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    guest.close()
    try:
        channel = Channel(host)
        assert channel.readline(time.monotonic() + 10).startswith(b"READY")
        channel.send(encode_job(1, Job(["echo", "over vsock"], timeout=10)))
        result = read_result(channel, 1, time.monotonic() + 20)
        assert (result.exit_code, result.stdout) == (0, b"over vsock\n")
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
        host.close()
