"""The microVM targets (firecracker, cloud-hypervisor) without KVM: what each VMM is sent,
the binary it is found as, the options it would refuse, and boots that fail, with the VMM
process faked by a script (the process boundary). Their guests boot for real through
`vmtax lab` (tests/test_microvm_live.py)."""

import json
import re
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from vmtax.core import target as targets
from vmtax.core.errors import TargetError, VmtaxError
from vmtax.core.target import TargetContext
from vmtax.guest.image import GuestImage
from vmtax.guest.vmm_guest import GuestFiles, thread_ids
from vmtax.helpers import vmm_build, vsock_relay
from vmtax.host import machine
from vmtax.host.journal import Journal
from vmtax.report import parts
from vmtax.targets import microvm_target


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VMTAX_CACHE", str(tmp_path / "cache"))
    relay = tmp_path / "vmtax-vsock"
    relay.write_bytes(b"\x7fELF fake vsock client")
    monkeypatch.setattr(vsock_relay, "relay", lambda: relay)
    # This host's KVM runs no stock guest; these tests fake the VMM, not KVM's verdict.
    monkeypatch.setattr(microvm_target.MicroVmTarget, "_kvm_problem", classmethod(
        lambda cls: None))


def fake_vmm(tmp_path: Path, body: str, name: str = "fake-vmm") -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def ctx(tmp_path):
    kernel = tmp_path / "vmlinux"
    kernel.write_bytes(b"\x7fELF" + b"\0" * 60 + b"Linux version 6.6.6-fake (x@y) #1\0")
    (tmp_path / "work").mkdir()
    (tmp_path / "journal").mkdir()
    return TargetContext(work_dir=tmp_path / "work", journal=Journal(tmp_path / "journal"),
                         image=GuestImage([], kernel, cache=tmp_path / "cache"))


def make(kind, ctx, tmp_path, body="exit 0", **options):
    return targets.create(kind, kind, {"vmm": fake_vmm(tmp_path, body),
                                       "kernel": str(tmp_path / "vmlinux"),
                                       "memory": "256M", "disk_size": "16M", **options}, ctx)


def files(tmp_path, tap=None) -> GuestFiles:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    return GuestFiles(run_dir=run, console_log=run / "console.log",
                      agent_socket=run / "vsock.sock_1024", disk=tmp_path / "scratch.img",
                      direct_io=True, mem_path=None, network="bridge" if tap else "none",
                      tap=tap)


class Tap:
    name, mac, cidr, gateway = "vt0a1b2c", "52:54:00:12:34:56", "10.213.0.2/24", "10.213.0.1"


def test_firecracker_is_sent_one_configuration_file(ctx, tmp_path):
    t = make("firecracker", ctx, tmp_path, vcpus=2, io_engine="Async", cache_type="Writeback")
    guest = t._new_guest("fc", "bridge", None)
    f = files(tmp_path, Tap())
    argv = guest._launch(f)
    assert argv[1:] == ["--config-file", str(f.run_dir / "firecracker.json"),
                        "--api-sock", str(f.run_dir / "api.sock"),
                        "--log-path", str(f.run_dir / "firecracker.log"), "--level", "Warning"]
    config = json.loads((f.run_dir / "firecracker.json").read_text())
    assert config["machine-config"] == {"vcpu_count": 2, "mem_size_mib": 256, "smt": False,
                                        "huge_pages": "None"}
    assert config["drives"] == [{"drive_id": "scratch", "path_on_host": str(f.disk),
                                 "is_root_device": False, "is_read_only": False,
                                 "io_engine": "Async", "cache_type": "Writeback"}]
    assert config["vsock"] == {"guest_cid": 3, "uds_path": str(f.run_dir / "vsock.sock")}
    assert config["network-interfaces"] == [{"iface_id": "eth0", "host_dev_name": "vt0a1b2c",
                                             "guest_mac": "52:54:00:12:34:56"}]
    boot_args = config["boot-source"]["boot_args"].split()
    # virtio-mmio devices (Firecracker places them itself), the agent over vsock.
    assert {"vmtax.bus=mmio", "vmtax.vsock=1024", "console=ttyS0"} <= set(boot_args)
    # What the fingerprint keeps: the configuration less each boot's paths and tap.
    assert "path_on_host" not in json.dumps(guest.sent)
    assert "vt0a1b2c" not in json.dumps(guest.sent)
    assert guest.sent["machine-config"] == config["machine-config"]


@pytest.mark.parametrize("kind", ["firecracker", "cloud-hypervisor"])
def test_a_microvms_column_says_nested_kvm_in_a_lab(ctx, tmp_path, kind):
    fingerprint = make(kind, ctx, tmp_path).vmm_fingerprint()
    run = SimpleNamespace(host={"lab": machine.LAB_LABEL},
                          targets={kind: {"fingerprint": fingerprint}})
    assert parts.target_label(run, kind) == f"{kind} (nested KVM)"
    assert parts.target_label(SimpleNamespace(host={}, targets=run.targets), kind) == (
        f"{kind} (kvm)")


def test_cloud_hypervisor_command_line(ctx, tmp_path):
    t = make("cloud-hypervisor", ctx, tmp_path, vcpus=4, io_engine="sync", direct=True,
             mergeable=True)
    guest = t._new_guest("ch", "bridge", None)
    f = files(tmp_path, Tap())
    argv = guest._launch(f)

    def value(flag):
        return argv[argv.index(flag) + 1]
    assert value("--cpus") == "boot=4"
    assert value("--memory") == "size=256M,mergeable=on"
    # The type given: autodetected, sector 0 (ext4's superblock) would be read-only.
    assert value("--disk") == (f"path={f.disk},image_type=raw,direct=on,_disable_io_uring=on,"
                               "_disable_aio=on")
    assert value("--vsock") == f"cid=3,socket={f.run_dir / 'vsock.sock'}"
    assert value("--serial") == f"file={f.console_log}" and value("--console") == "off"
    assert value("--net") == "tap=vt0a1b2c,mac=52:54:00:12:34:56"
    assert "vmtax.bus=pci" in value("--cmdline").split()
    assert value("--api-socket") == f"path={f.run_dir / 'api.sock'}"
    assert all(str(f.run_dir) not in arg and "vt0a1b2c" not in arg for arg in guest.sent)


def test_cloud_hypervisor_huge_pages_of_either_size(ctx, tmp_path):
    for size in ("2M", "1G"):
        t = make("cloud-hypervisor", ctx, tmp_path, hugepages=size, memory="1G")
        argv = t._new_guest("ch", "none", None)._launch(files(tmp_path))
        assert argv[argv.index("--memory") + 1] == (
            f"size=1024M,hugepages=on,hugepage_size={size}")


@pytest.mark.parametrize("kind, options, message", [
    ("firecracker", {"vcpus": 3}, "vcpus: expected 1 or an even number up to 32"),
    ("firecracker", {"vcpus": 34}, "vcpus: expected a whole number from 1 to 32"),
    ("firecracker", {"memory": "128M"}, 'memory: expected at least 192M for kernel = "debian"'),
    ("firecracker", {"memory": "262145K"}, "memory: expected a whole number of MiB"),
    ("firecracker", {"hugepages": "1G"}, 'hugepages: expected one of "2M"'),
    ("cloud-hypervisor", {"vcpus": 8193}, "vcpus: expected a whole number from 1 to 8192"),
    ("cloud-hypervisor", {"memory": "32M", "kernel": "minimal"},
     'memory: expected at least 64M for kernel = "minimal"'),
    ("firecracker", {"io_engine": "io_uring"}, 'io_engine: expected one of "Sync", "Async"'),
])
def test_options_the_vmm_would_refuse_are_refused_first(ctx, tmp_path, kind, options,
                                                       message):
    vmm = fake_vmm(tmp_path, "exit 0")
    with pytest.raises(VmtaxError) as err:
        targets.create(kind, kind, {"kernel": "debian", "vmm": vmm, **options}, ctx)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_vmm_that_exits_0_before_the_agent_is_a_failed_boot(ctx, tmp_path):
    """Firecracker exits 0 after its guest triple-faulted (HOST-NOTES): the verdict is the
    agent's READY, never the VMM's status."""
    t = make("firecracker", ctx, tmp_path,
             body='echo "Unexpected exit reason on vcpu run: Shutdown" >&2; exit 0')
    with pytest.raises(TargetError) as err:
        t.prepare()
    message = str(err.value)
    assert "guest failed to boot (Firecracker exited with status 0" in message
    assert "Unexpected exit reason on vcpu run: Shutdown" in message and "\n" not in message
    assert ctx.journal.entries == {} and list(ctx.work_dir.iterdir()) == []


def test_a_kvm_without_a_capability_is_named_and_not_booted_again(ctx, tmp_path,
                                                                  monkeypatch):
    from vmtax.host import machine
    monkeypatch.setattr(machine, "lab", lambda: machine.LAB_LABEL)   # where boots are retried
    calls = tmp_path / "calls"
    body = ('echo x >> ' + str(calls) + '\nwhile [ "$1" != --log-path ]; do shift; done\n'
            'echo "[anonymous-instance:main] Error creating the Kvm object: Missing KVM '
            'capabilities: [0x38]" >> "$2"; exit 1')
    t = make("firecracker", ctx, tmp_path, body=body)
    with pytest.raises(TargetError) as err:
        t.prepare()
    assert str(err.value) == ("firecracker: this host's KVM lacks KVM_CAP_XCRS (KVM reports "
                              "it only on a CPU with XSAVE), which Firecracker needs")
    assert calls.read_text().count("x") == 1


def test_the_binary_is_the_users_then_a_build_then_a_way_to_get_one(tmp_path, monkeypatch):
    from vmtax.targets.firecracker import FirecrackerTarget as Fc
    mine = fake_vmm(tmp_path, "exit 0", "firecracker")
    assert Fc.find_vmm(mine, None) == mine
    with pytest.raises(VmtaxError, match="vmm = '/no/firecracker': no such program"):
        Fc.find_vmm("/no/firecracker", None)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    built = tmp_path / "built" / "firecracker"
    monkeypatch.setattr(vmm_build, "built_from", lambda build, tarball: built)
    assert Fc.find_vmm("firecracker", str(tmp_path / "firecracker-1.16.1.tar.gz")) == str(built)
    monkeypatch.setattr(vmm_build, "cached", lambda build: None)
    with pytest.raises(VmtaxError) as err:
        Fc.find_vmm("firecracker", None)
    assert str(err.value).startswith("firecracker: expected a Firecracker binary: firecracker "
                                     "is not on PATH and vmtax has built none; give vmm = PATH")
    assert "source = firecracker-VERSION.tar.gz" in str(err.value)


def test_a_cached_build_whose_binary_changed_is_not_used(tmp_path):
    from vmtax.targets.firecracker import FirecrackerTarget as Fc
    build = tmp_path / "cache" / "vmm" / "firecracker-1.16.1-0123456789ab"
    build.mkdir(parents=True)
    (build / "firecracker").write_bytes(b"built")
    from vmtax.host import binary
    (build / "meta.json").write_text(json.dumps(
        {"binary_sha256": binary.sha256(build / "firecracker")}))
    assert vmm_build.cached(Fc.source_build) == build / "firecracker"
    (build / "firecracker").write_bytes(b"planted")
    assert vmm_build.cached(Fc.source_build) is None


def test_a_release_tarball_is_known_by_its_name(tmp_path):
    from vmtax.targets.firecracker import FirecrackerTarget as Fc
    assert Fc.source_build.version_of(Path("firecracker-1.16.1.tar.gz")) == "1.16.1"
    with pytest.raises(VmtaxError, match="named firecracker-VERSION.tar.gz"):
        Fc.source_build.version_of(Path("cloud-hypervisor-53.0.tar.gz"))


def test_vcpu_threads_are_found_by_their_names(tmp_path):
    tasks = tmp_path / "proc" / "77" / "task"
    for tid, comm in ((77, "firecracker"), (80, "fc_vcpu 1"), (79, "fc_vcpu 0"),
                      (81, "fc_api"), (90, "vcpu10"), (88, "vcpu2")):
        (tasks / str(tid)).mkdir(parents=True)
        (tasks / str(tid) / "comm").write_text(comm + "\n")
    assert thread_ids(77, re.compile(r"fc_vcpu (\d+)"), tmp_path / "proc") == [79, 80]
    assert thread_ids(77, re.compile(r"vcpu(\d+)"), tmp_path / "proc") == [88, 90]


def test_firecracker_tree_disks_are_found_by_the_id_firecracker_gives(ctx, tmp_path):
    image = tmp_path / "tree.img"
    image.write_bytes(b"")
    st = image.stat()
    t = make("firecracker", ctx, tmp_path)
    assert t.tree_serial(0, image) == f"{st.st_dev}{st.st_rdev}{st.st_ino}"[:20]


def test_a_vmm_that_is_nowhere_is_refused_at_plan_time(ctx, tmp_path, monkeypatch):
    """Neither on PATH, nor given as source, nor built before: the plan says how to get
    one, at the line of the target, before anything runs."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(vmm_build, "cached", lambda build: None)
    with pytest.raises(VmtaxError) as err:
        targets.create("firecracker", "firecracker", {"kernel": "minimal", "memory": "256M"},
                       ctx)
    assert str(err.value).startswith("firecracker: vmm: expected a Firecracker binary: "
                                     "firecracker is not on PATH and vmtax has built none")
    with pytest.raises(VmtaxError, match="vmm: expected a program"):
        targets.create("cloud-hypervisor", "cloud-hypervisor",
                       {"vmm": "/no/cloud-hypervisor", "memory": "256M"}, ctx)
