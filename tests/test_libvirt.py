"""The libvirt target without libvirtd: its domain XML (the KVM host's, checked against
libvirt's schema with virt-xml-validate), libvirt's refusals named by option, its options'
checks, the daemon it would start, and the undo of what it makes."""

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from vmtax.core import target as targets
from vmtax.core.errors import VmtaxError
from vmtax.core.target import TargetContext
from vmtax.host import doctor, journal
from vmtax.host.journal import Journal
from vmtax.targets.libvirt import nat, virsh
from vmtax.targets.libvirt import target as libvirt_target
from vmtax.targets.libvirt.domain_xml import DomainSpec, domain_summary, domain_xml, stable_xml
from vmtax.targets.libvirt.existing import ExistingDomain
from vmtax.targets.libvirt.instance import LibvirtInstance, refused_options

FIXTURES = Path(__file__).parent / "fixtures" / "libvirt"
IMAGES = "/var/lib/libvirt/images/vmtax-lv-0123456789ab"


def kvm_spec(**changes) -> DomainSpec:
    """The domain of a KVM host: pinned vCPUs, guest RAM on 2 MiB huge pages."""
    spec = DomainSpec(
        name="vmtax-libvirt-0a1b2c3d", domain_type="kvm", emulator="/usr/bin/qemu-system-x86_64",
        machine="q35", cpu="host-passthrough", vcpus=2, memory=1 << 30,
        kernel=Path(f"{IMAGES}/vmlinux"), initrd=Path(f"{IMAGES}/initramfs.cpio"),
        cmdline="console=ttyS0 quiet panic=-1 vmtax.bus=pci", console_log=Path(
            f"{IMAGES}/console.log"), agent_socket=Path(f"{IMAGES}/agent.sock"),
        agent_port="vmtax.agent", disk=Path(f"{IMAGES}/scratch.img"), disk_cache="none",
        disk_aio="native", pin=(2, 3), emulator_cpus=(0, 1), hugepages="2M",
        tap="vt0a1b2ct2", mac="02:76:0a:1b:2c:02")
    return DomainSpec(**{**spec.__dict__, **changes})


def validate(xml: str, tmp_path: Path) -> subprocess.CompletedProcess:
    if shutil.which("virt-xml-validate") is None or shutil.which("xmllint") is None:
        pytest.skip("virt-xml-validate needs libvirt-clients and libxml2-utils (make deps)")
    path = tmp_path / "domain.xml"
    path.write_text(xml)
    return subprocess.run(["virt-xml-validate", str(path), "domain"], capture_output=True,
                          text=True, timeout=60)


def test_the_kvm_hosts_domain_is_the_fixture_and_libvirts_schema_accepts_it(tmp_path):
    xml = domain_xml(kvm_spec())
    assert xml == (FIXTURES / "kvm-host.xml").read_text()
    assert "<domain type=\"kvm\">" in xml and 'mode="host-passthrough"' in xml
    assert '<vcpupin vcpu="0" cpuset="2" />' in xml and '<vcpupin vcpu="1" cpuset="3" />' in xml
    assert '<emulatorpin cpuset="0,1" />' in xml
    assert '<page size="2048" unit="KiB" />' in xml
    done = validate(xml, tmp_path)
    assert done.returncode == 0, done.stderr


def test_the_schema_check_can_fail(tmp_path):
    """virt-xml-validate really checks: a vcpupin without its cpuset is refused."""
    xml = domain_xml(kvm_spec()).replace(' cpuset="2"', "")
    assert validate(xml, tmp_path).returncode != 0


def test_libvirts_defaults_are_left_alone_unless_asked(tmp_path):
    xml = domain_xml(kvm_spec(domain_type="qemu", cpu="maximum", disk_cache=None,
                              disk_aio=None, pin=None, emulator_cpus=(), hugepages=None,
                              tap=None, mac=None))
    assert '<domain type="qemu">' in xml and '<cpu mode="maximum" />' in xml
    assert '<driver name="qemu" type="raw" />' in xml   # cache and io: libvirt's own
    assert "cputune" not in xml and "memoryBacking" not in xml and "interface" not in xml
    assert validate(xml, tmp_path).returncode == 0


def test_a_named_cpu_model_and_a_1g_page(tmp_path):
    xml = domain_xml(kvm_spec(cpu="Skylake-Server", hugepages="1G"))
    assert '<cpu mode="custom" match="exact">' in xml
    assert '<model fallback="forbid">Skylake-Server</model>' in xml
    assert '<page size="1048576" unit="KiB" />' in xml
    assert validate(xml, tmp_path).returncode == 0


# --- the target's own choices -------------------------------------------------------------

class FakeImage:
    """The guest image's files, without building one."""
    kernel_arg = None
    programs: dict = {}   # vmtax's own programs in it: none beyond the agent's scripts

    def __init__(self, tmp_path: Path):
        self.dir = tmp_path

    def kernel(self) -> Path:
        (self.dir / "vmlinux").write_bytes(b"\x7fELF kernel")
        return self.dir / "vmlinux"

    def initramfs(self) -> Path:
        (self.dir / "initramfs.cpio").write_bytes(b"070701")
        return self.dir / "initramfs.cpio"

    def kernel_info(self):
        return SimpleNamespace(hz=250, params=("lapic_timer_period",))

    def fingerprint(self) -> dict:
        return {"image": "fake"}


def make_target(tmp_path, name="libvirt", **options):
    kind, variant = targets.parse_name(name)
    ctx = TargetContext(work_dir=tmp_path, journal=Journal(tmp_path / "run"))
    ctx.image = FakeImage(tmp_path)
    return targets.create(name, kind, {**variant, **options}, ctx)


def test_on_a_kvm_host_the_target_asks_for_kvm_and_the_hosts_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(libvirt_target, "resolve_accel", lambda accel: "kvm")
    cpus = sorted(os.sched_getaffinity(0))
    target = make_target(tmp_path, pin=cpus[:1], vcpus=1, hugepages="2M", memory="1G",
                         disk_cache="none", disk_aio="native")
    domain_dir = tmp_path / "domain"
    domain_dir.mkdir()
    spec = target.specify("vmtax-libvirt-0a1b2c3d", domain_dir, domain_dir / "scratch.img", None)
    assert (spec.domain_type, spec.cpu, spec.pin, spec.hugepages) == (
        "kvm", "host-passthrough", (cpus[0],), "2M")
    assert spec.emulator_cpus == tuple(cpus[1:])
    # libvirt-qemu reads copies in the domain's directory, never the cache under /root.
    assert spec.kernel.parent == spec.initrd.parent == domain_dir and spec.kernel.exists()
    # Under KVM the kernel calibrates its APIC timer itself (TCG's speed-ups are not given).
    assert "vmtax.bus=pci" in spec.cmdline and "noreplace-smp" not in spec.cmdline
    assert "lapic_timer_period" not in spec.cmdline
    assert validate(domain_xml(spec), tmp_path).returncode == 0


def test_under_tcg_the_domain_is_qemu_with_the_maximum_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(libvirt_target, "resolve_accel", lambda accel: "tcg")
    target = make_target(tmp_path, kernel_args="mitigations=off")
    spec = target.specify("vmtax-x-1", tmp_path, None, None)
    assert (spec.domain_type, spec.cpu, spec.disk_cache, spec.disk_aio) == (
        "qemu", "maximum", None, None)
    assert spec.cmdline.endswith(" mitigations=off")
    assert "noreplace-smp" in spec.cmdline.split()


def test_libvirt_name_measures_an_existing_domain():
    assert targets.parse_name("libvirt:my-guest.1") == ("libvirt", {"domain": "my-guest.1"})
    assert targets.parse_name("libvirt") == ("libvirt", {})
    with pytest.raises(VmtaxError, match="unknown target"):
        targets.parse_name("libvirt:bad/name")


@pytest.mark.parametrize("options, key", [
    ({"vcpus": 2, "pin": [0]}, "pin"),
    ({"machine": "microvm"}, "machine"),
    ({"disk_aio": "native"}, "disk_aio"),
    ({"hugepages": "2M", "memory": "1025M"}, "memory"),
])
def test_options_that_do_not_fit_together_are_refused_by_name(options, key):
    opts = libvirt_target.LibvirtOptions(**options)
    assert key in {k for k, _ in opts.problems()}


def test_the_default_options_fit():
    assert libvirt_target.LibvirtOptions().problems() == []


def test_libvirt_declares_vms_knobs_with_their_safety_notes():
    from vmtax.studies import tune as search
    knobs = search.declared("libvirt")
    assert set(knobs) >= {"machine", "cpu", "vcpus", "pin", "hugepages", "disk_cache",
                          "disk_aio", "kernel_args"}
    assert "uri" not in knobs and "memory" not in knobs and "emulator" not in knobs
    assert "crash" in knobs["disk_cache"].safety("unsafe")
    assert knobs["disk_cache"].safety("none") is None
    assert "side channels" in knobs["kernel_args"].safety("mitigations=off")


def test_knob_values_this_host_cannot_run_are_its_problems(monkeypatch):
    monkeypatch.setattr(libvirt_target, "resolve_accel", lambda accel: "tcg")
    monkeypatch.setattr(libvirt_target, "io_uring_problem", lambda qemu: "no liburing")
    problems = dict(libvirt_target.LibvirtOptions(cpu="host-passthrough",
                                                  disk_aio="io_uring").problems())
    assert "with KVM" in problems["cpu"] and "no liburing" in problems["disk_aio"]
    assert libvirt_target.LibvirtOptions(cpu="host-passthrough", accel="kvm").problems() == []
    monkeypatch.setattr(libvirt_target, "direct_io_works", lambda directory: False)
    assert "O_DIRECT" in dict(libvirt_target.LibvirtOptions(disk_cache="none").problems())[
        "disk_cache"]
    assert libvirt_target.LibvirtOptions(disk_cache="unsafe").problems() == []


@pytest.mark.parametrize("message, options", [
    ("unsupported configuration: native I/O needs either no disk cache or directsync cache "
     "mode, QEMU will fallback to aio=threads", ("disk_aio", "disk_cache")),
    ("unsupported configuration: Emulator '/usr/bin/qemu-system-x86_64' does not support "
     "machine type 'nonexistent'", ("machine",)),
    ("unsupported configuration: CPU model 'Bogus' is unknown", ("cpu",)),
    ("internal error: Unable to find any usable hugetlbfs mount for 2048 KiB", ("hugepages",)),
    ("Cannot find QEMU binary /opt/qemu: No such file or directory", ("emulator",)),
    ("XML error: No PCI buses available", ("machine",)),
    ("operation failed: domain 'x' already exists", ()),
])
def test_libvirts_refusals_name_the_options_they_are_about(message, options):
    assert refused_options(message) == options


def _refusal(tmp_path, opts, said: str) -> str:
    """What vmtax says when libvirt refuses a domain of opts, saying said."""
    guest = LibvirtInstance("libvirt", "vmtax-libvirt-1", opts, lambda *a: None,
                            lambda *a: None, virsh.Virsh(), Journal(tmp_path / "run"))
    return guest._refusal(SimpleNamespace(timed_out=False, exit_code=1, stdout="", stderr=(
        f"error: Failed to create domain from /x/domain.xml\nerror: {said}\n")))


def test_a_refusal_is_one_line_with_libvirts_message_and_the_option(tmp_path):
    message = _refusal(tmp_path, libvirt_target.LibvirtOptions(machine="nonexistent"),
                       "unsupported configuration: Emulator '/usr/bin/qemu-system-x86_64' "
                       "does not support machine type 'nonexistent'")
    assert "\n" not in message
    assert message.startswith("libvirt: libvirt refused the domain (machine = 'nonexistent'): "
                              "Failed to create domain")
    assert "does not support machine type 'nonexistent'" in message


# --- libvirtd and virsh -------------------------------------------------------------------

def test_virshs_errors_become_one_line():
    assert virsh.one_line("error: failed to connect to the hypervisor\nerror: Failed to "
                            "connect socket to '/x': No such file or directory\n") == (
        "failed to connect to the hypervisor; Failed to connect socket to '/x': No such file "
        "or directory")


def test_a_uri_that_hangs_is_a_timeout_in_one_line(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "virsh").write_text("#!/bin/sh\nsleep 30\n")
    (fake / "virsh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    with pytest.raises(VmtaxError, match=r"^lv: uri = 'qemu\+tcp://x/system': libvirt at "
                                         r"qemu\+tcp://x/system did not answer within 1 s$"):
        virsh.Virsh("qemu+tcp://x/system").connect("lv", timeout=1)


def test_where_kvm_runs_no_guest_libvirtd_sees_it_masked(tmp_path, monkeypatch):
    monkeypatch.setattr(virsh, "kvm_masked", lambda: True)
    daemon = virsh.libvirtd(tmp_path, (Path("/tmp/vmtax-hugetlbfs-2M-x"),))
    assert daemon.argv[:5] == ("unshare", "--mount", "--propagation", "slave", "--")
    assert daemon.socket == virsh.LIBVIRTD.socket and daemon.needs == (virsh.VIRTLOGD,)
    conf, mask = Path(daemon.argv[-3]), Path(daemon.argv[-2])
    assert conf.read_text().endswith('namespaces = []\n'
                                     'hugetlbfs_mount = ["/tmp/vmtax-hugetlbfs-2M-x"]\n')
    assert mask.stat().st_size == 0 and mask.stat().st_mode & 0o777 == 0o600
    monkeypatch.setattr(virsh, "kvm_masked", lambda: False)
    assert virsh.libvirtd(tmp_path) == virsh.LIBVIRTD


def test_another_uri_never_starts_a_daemon(tmp_path):
    assert virsh.ensure_daemon(Journal(tmp_path / "run"), "qemu+ssh://h/system",
                                 tmp_path) is False


def test_the_undo_destroys_only_vmtaxs_domains(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls"
    (fake / "virsh").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (fake / "virsh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    journal = Journal(tmp_path / "run")
    virsh.journal_domain(journal, "qemu:///system", "vmtax-libvirt-1")
    journal.add(type="libvirt-domain", undo=virsh.destroy_domain.__module__
                + ":destroy_domain", uri="qemu:///system", name="users-own")
    assert journal.undo_all() == []
    assert calls.read_text() == "--quiet -c qemu:///system destroy vmtax-libvirt-1\n"
    assert journal.entries == {}


def test_a_journal_naming_the_undo_s_old_path_is_undone_by_the_moved_function(tmp_path,
                                                                              monkeypatch):
    # Left by a vmtax that kept libvirt's support in vmtax.host.libvirt, killed, then
    # upgraded: the next start recovers it through journal.MOVED.
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls"
    (fake / "virsh").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (fake / "virsh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    (tmp_path / "run").mkdir()
    dead = Journal(tmp_path / "run", pid=2**22 + 7, start=1)
    dead.add(type="libvirt-domain", undo="vmtax.host.libvirt:destroy_domain",
             uri="qemu+tcp://h/system", name="vmtax-libvirt-1")
    dead.add(type="libvirt-network", undo="vmtax.host.libvirt:destroy_network",
             uri="qemu+tcp://h/system", name="vmtax-nat-0a1b2c3d", bridge="vtnat0a1b2c3d")
    assert journal.recover(tmp_path / "run") == [
        f"undid 2 host change(s) left by vmtax process {2**22 + 7}"]
    assert calls.read_text().splitlines() == [
        "--quiet -c qemu+tcp://h/system net-destroy vmtax-nat-0a1b2c3d",
        "--quiet -c qemu+tcp://h/system destroy vmtax-libvirt-1"]
    assert journal.left_behind(tmp_path / "run") == []


def test_a_lent_tap_is_deleted_only_by_its_name(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(virsh.subprocess, "run", lambda argv, **kw: ran.append(argv))
    monkeypatch.setattr(virsh.Path, "exists", lambda self: True)
    virsh.delete_host_tap(None, {"device": "vt0a1b2ct2"})
    virsh.delete_host_tap(None, {"device": "eth0"})
    assert ran == [["ip", "link", "delete", "vt0a1b2ct2"]]


def test_the_nat_network_and_a_domain_on_it_pass_libvirts_schema(tmp_path):
    import ipaddress
    net = nat.NatNetwork("vmtax-nat-0a1b2c3d", "vtnat0a1b2c3d",
                             ipaddress.IPv4Network("10.201.7.0/24"))
    first, second = net.lease(), net.lease()
    assert (first.cidr, first.gateway, second.address) == ("10.201.7.2/24", "10.201.7.1",
                                                           "10.201.7.3")
    assert first.mac.startswith("52:54:00:") and first.mac != second.mac
    if shutil.which("virt-xml-validate") is None:
        pytest.skip("virt-xml-validate needs libvirt-clients (make deps)")
    (tmp_path / "net.xml").write_text(net.xml())
    done = subprocess.run(["virt-xml-validate", str(tmp_path / "net.xml"), "network"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "<forward mode='nat'/>" in net.xml() and "dhcp" not in net.xml()
    xml = domain_xml(kvm_spec(tap=None, network=first.network, mac=first.mac))
    assert '<source network="vmtax-nat-0a1b2c3d" />' in xml
    assert validate(xml, tmp_path).returncode == 0


def test_a_scsi_disk_is_on_a_virtio_scsi_controller_and_passes_the_schema(tmp_path):
    xml = domain_xml(kvm_spec(disk_bus="virtio-scsi"))
    assert '<target dev="sda" bus="scsi" />' in xml
    assert '<controller type="scsi" index="0" model="virtio-scsi" />' in xml
    assert validate(xml, tmp_path).returncode == 0
    with pytest.raises(VmtaxError, match="disk_bus: expected \"virtio-blk\" with kernel"):
        libvirt_target.plugin.build(libvirt_target.LibvirtOptions,
                                    {"disk_bus": "virtio-scsi", "kernel": "minimal"}, "lv")


def test_the_nat_subnet_avoids_every_route_of_the_host():
    import ipaddress
    everything_but_one = [n for n in ipaddress.IPv4Network("10.200.0.0/13").subnets(
        new_prefix=24) if str(n) != "10.207.255.0/24"]
    assert str(nat.free_subnet(everything_but_one)) == "10.207.255.0/24"
    with pytest.raises(VmtaxError, match="no free /24"):
        nat.free_subnet([ipaddress.IPv4Network("10.0.0.0/8")])
    taken = nat.host_subnets()
    assert not any(nat.free_subnet(taken).overlaps(t) for t in taken)


def test_the_nat_networks_undo_touches_only_vmtaxs_own(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(nat.subprocess, "run", lambda argv, **kw: ran.append(argv))
    state = tmp_path / "network"
    monkeypatch.setattr(nat, "NETWORK_RUN_DIR", state)
    (state / "vmtax-nat-0a1b2c3d" / "ports").mkdir(parents=True)
    (state / "vmtax-nat-0a1b2c3d.pid").write_text("1")
    for entry in ({"name": "default", "bridge": "virbr0"},
                  {"name": "vmtax-nat-0a1b2c3d", "bridge": "eth0"}):
        nat.destroy_network(None, {"uri": "qemu:///system", **entry})
    assert ran == []
    nat.destroy_network(None, {"uri": "qemu:///system", "name": "vmtax-nat-0a1b2c3d",
                               "bridge": "vtnat0a1b2c3d"})
    assert ran[0][-2:] == ["net-destroy", "vmtax-nat-0a1b2c3d"] and list(state.iterdir()) == []
    # The chains go only with the libvirtd that made them, and only when empty.
    ran.clear()
    monkeypatch.setattr(virsh, "iptables_save", lambda program: "*filter\nCOMMIT\n")
    monkeypatch.setattr(virsh.daemon, "answers", lambda socket: False)
    virsh.remove_chains(None, {"tables": ["ip filter"]})   # it made none: nothing to do
    monkeypatch.setattr(virsh.daemon, "answers", lambda socket: True)
    virsh.remove_chains(None, {"tables": ["ip filter"]})
    monkeypatch.setattr(virsh.daemon, "answers", lambda socket: False)
    monkeypatch.setattr(virsh, "iptables_save", lambda program: "*filter\n:LIBVIRT_FWI - "
                        "[0:0]\n-A LIBVIRT_FWI -o vtnat1 -j REJECT\nCOMMIT\n")
    virsh.remove_chains(None, {"tables": ["ip filter"]})
    nat.restore_forwarding(None, {"value": "0"})
    assert ran == []
    # Empty chains: removed, then the table they alone were in.
    monkeypatch.setattr(virsh, "iptables_save", lambda program: "*filter\n:INPUT ACCEPT "
                        "[0:0]\n" + ("" if any("-X" in argv for argv in ran)
                                      else ":LIBVIRT_FWI - [0:0]\n") + "COMMIT\n")
    virsh.remove_chains(None, {"tables": ["ip filter", "inet users"]})
    assert ["iptables", "-w", "-t", "filter", "-D", "INPUT", "-j", "LIBVIRT_INP"] in ran
    assert ["ip6tables", "-w", "-t", "mangle", "-X", "LIBVIRT_PRT"] in ran
    assert ran[-1] == ["nft", "delete", "table", "ip", "filter"]


def test_doctor_has_a_libvirt_line_saying_what_is_missing(monkeypatch):
    monkeypatch.setattr(libvirt_target, "startable", lambda: "virsh is not installed; install "
                                                       "libvirt-clients")
    check = doctor._target_check(libvirt_target.LibvirtTarget)
    assert (check.name, check.ok, check.detail) == (
        "libvirt", False, "virsh is not installed; install libvirt-clients")


# --- an existing domain through the guest agent, against a fake virsh ----------------------

FAKE_VIRSH = """#!{python}
import base64, json, sys
calls = open({calls!r}, "a")
calls.write(json.dumps(sys.argv[1:]) + "\\n")
args = sys.argv[1:]
if "qemu-agent-command" in args:
    request = json.loads(args[-1])
    if request["execute"] == "guest-exec":
        print(json.dumps({{"return": {{"pid": 7}}}}))
    elif request["execute"] == "guest-exec-status":
        print(json.dumps({{"return": {status}}}))
"""


def fake_virsh(tmp_path, monkeypatch, status: dict) -> Path:
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls"
    (fake / "virsh").write_text(FAKE_VIRSH.format(python=sys.executable, calls=str(calls),
                                                  status=repr(status)))
    (fake / "virsh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    return calls


def test_a_guest_agent_job_gives_its_output_and_status(tmp_path, monkeypatch):
    calls = fake_virsh(tmp_path, monkeypatch, {
        "exited": True, "exitcode": 3, "out-data": base64.b64encode(b"out\n").decode(),
        "err-data": base64.b64encode(b"err\n").decode()})
    domain = ExistingDomain("libvirt:g", "g", virsh.Virsh(), Journal(tmp_path / "run"),
                            "/var/tmp")
    result = domain.exec(["sysbench", "cpu", "run"], "/work dir", 30, {"LC_ALL": "C"})
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    request = json.loads(json.loads(calls.read_text().splitlines()[0])[-1])
    # The working directory and argv are arguments of a fixed script, never part of it.
    assert request["arguments"]["path"] == "/bin/sh"
    assert request["arguments"]["arg"] == ["-c", 'cd "$0" && exec "$@"', "/work dir",
                                           "sysbench", "cpu", "run"]
    assert "LC_ALL=C" in request["arguments"]["env"]


def test_a_guest_agent_job_past_its_timeout_is_killed(tmp_path, monkeypatch):
    calls = fake_virsh(tmp_path, monkeypatch, {"exited": False})
    domain = ExistingDomain("libvirt:g", "g", virsh.Virsh(), Journal(tmp_path / "run"),
                            "/var/tmp")
    result = domain.exec(["sleep", "60"], "/", 0.3)
    assert result.timed_out and result.exit_code is None
    last = json.loads(json.loads(calls.read_text().splitlines()[-1])[-1])
    assert last == {"execute": "guest-exec", "arguments": {"path": "kill", "arg": ["-9", "7"]}}


def test_show_all_prints_the_domains_xml_as_a_block_escaped_and_json_has_it(tmp_path):
    """The domain's XML is kept in the target's fingerprint: `show --all` prints it as an
    indented block under its key (markup and control characters as text), `--json` whole."""
    from vmtax.results.store import Store
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(Path(__file__).parent / "fixtures" / "golden" / "golden.sqlite",
                results / "vmtax.sqlite")
    xml = domain_xml(kvm_spec()).replace("quiet", "[bold]quiet\x1b]0;x\x07")
    store = Store(results)
    run_id = store.resolve("golden-a")
    store.set_target(run_id, "libvirt", "libvirt", {
        "kind": "libvirt", "domain_type": "kvm", "host_hugepages": {"size": "2M",
                                                                    "granted": 512},
        "boots_seconds": [4.5, 4.25], "domain_xml": xml})
    store.close()
    env = {**os.environ, "COLUMNS": "100", "TERM": "dumb", "NO_COLOR": "1"}
    vmtax = Path(sys.executable).parent / "vmtax"
    shown = subprocess.run([str(vmtax), "show", "golden-a", "--all", "--results", str(results)],
                           capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    section = shown.stdout[shown.stdout.index("target fingerprints"):]
    mine = section[section.index("libvirt (libvirt)"):].splitlines()
    assert mine[1].split() == ["domain_type", "kvm"]
    assert ["host_hugepages.size", "2M"] in [line.split() for line in mine]
    assert ["boots_seconds", "4.5,", "4.25"] in [line.split() for line in mine]
    block = mine.index("  domain_xml")
    assert mine[block + 1] == "    <domain type=\"kvm\">"
    assert mine[block + 2] == "      <name>vmtax-libvirt-0a1b2c3d</name>"
    assert "[bold]quiet\\x1b]0;x\\x07" in section and "\x1b" not in shown.stdout
    assert mine[-1] == "    </domain>"
    shown = subprocess.run([str(vmtax), "show", "golden-a", "--json", "--results", str(results)],
                           capture_output=True, text=True, env=env, timeout=120)
    assert json.loads(shown.stdout)["run"]["targets"]["libvirt"]["fingerprint"][
        "domain_xml"] == xml


def test_a_program_goes_into_the_guest_in_chunks_that_fit_one_virsh_argument(tmp_path):
    """libvirt:NAME through the guest agent ships the host's programs (one archive) as the
    ssh path does: guest-file-write takes base64 in virsh's argv, one word of which Linux
    caps at 128 KiB."""
    domain = ExistingDomain("libvirt:g", "g", virsh.Virsh(), Journal(tmp_path / "run"),
                            "/var/tmp")
    program = os.urandom(150 << 10)
    sent: list[dict] = []

    def agent(command, timeout=30.0, **arguments):
        request = {"execute": command, "arguments": arguments}
        assert len(json.dumps(request)) < 128 << 10
        sent.append(request)
        if command == "guest-file-write":
            return {"count": len(base64.b64decode(arguments["buf-b64"])), "eof": False}
        return 5 if command == "guest-file-open" else {}
    domain.agent = agent   # type: ignore[method-assign]
    domain._write("/var/tmp/.vmtax-1/bundle/bin/sysbench", program)
    assert [r["execute"] for r in sent] == ["guest-file-open", *["guest-file-write"] * 3,
                                           "guest-file-close"]
    assert sent[0]["arguments"] == {"path": "/var/tmp/.vmtax-1/bundle/bin/sysbench",
                                    "mode": "w"}
    assert b"".join(base64.b64decode(r["arguments"]["buf-b64"])
                    for r in sent[1:-1]) == program

    # A short write is an error, and the file is closed all the same.
    sent.clear()
    domain.agent = lambda command, timeout=30.0, **a: (   # type: ignore[method-assign]
        sent.append(command) or ({"count": 1} if command == "guest-file-write" else 5))
    with pytest.raises(VmtaxError, match="1 of 65536 bytes written"):
        domain._write("/x", program)
    assert sent == ["guest-file-open", "guest-file-write", "guest-file-close"]


def test_a_file_open_in_the_guest_is_journaled_and_a_killed_vmtaxs_undo_closes_it(
        tmp_path, monkeypatch):
    """Found on a user's domain: vmtax killed -9 while copying its programs left qemu-ga
    holding an open handle to a deleted file (its blocks stayed in use on the guest's disk).
    The handle is in the journal while it is open; the journal's undo (the guardian's, or
    `vmtax cleanup`'s) closes it."""
    calls = fake_virsh(tmp_path, monkeypatch, {})
    journal = Journal(tmp_path / "run")
    domain = ExistingDomain("libvirt:g", "g", virsh.Virsh("qemu:///system"), journal,
                            "/var/tmp")
    held: list[dict] = []

    def agent(command, timeout=30.0, **arguments):
        if command == "guest-file-write":
            held.extend(journal.entries.values())
            raise SystemExit("killed")   # nothing after this runs in a vmtax killed -9
        return 9 if command == "guest-file-open" else {}
    domain.agent = agent   # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        domain._write("/var/tmp/.vmtax-1/bundle.tgz", b"x" * 10)
    assert [(e["type"], e["handle"]) for e in held] == [("libvirt-guest-file", 9)]
    # Closed by its owner: forgotten. Left (as by kill -9): the undo closes it.
    assert journal.entries == {}
    token = virsh.journal_guest_file(journal, "qemu:///system", "g", 9)
    journal.undo(token)
    closed = [json.loads(json.loads(line)[-1]) for line in calls.read_text().splitlines()]
    assert closed == [{"execute": "guest-file-close", "arguments": {"handle": 9}}]
    assert json.loads(calls.read_text().splitlines()[0])[:5] == [
        "--quiet", "-c", "qemu:///system", "qemu-agent-command", "g"]


# A user's running q35 domain with 2 MiB pages, as `virsh dumpxml` gives it in one boot;
# the next boot differs in BOOT's fields only.
RUNNING = """<domain type='kvm' id='{id}'>
  <name>db</name>
  <memory unit='KiB'>2097152</memory>
  <currentMemory unit='KiB'>2097152</currentMemory>
  <memoryBacking><hugepages><page size='2048' unit='KiB'/></hugepages></memoryBacking>
  <vcpu placement='static'>4</vcpu>
  <os><type arch='x86_64' machine='pc-q35-7.2'>hvm</type></os>
  <cpu mode='host-passthrough' check='none' migratable='on'/>
  <devices>
    <interface type='network'><target dev='vnet{id}'/></interface>
    <serial type='pty'><source path='/dev/pts/{pty}'/></serial>
    <console type='pty' tty='/dev/pts/{pty}'><source path='/dev/pts/{pty}'/></console>
    <channel type='unix'>
      <source mode='bind'
              path='/var/lib/libvirt/qemu/channel/target/domain-{id}-db/org.qemu.ga.0'/>
      <target type='virtio' name='org.qemu.ga.0' state='{state}'/>
    </channel>
    <graphics type='vnc' port='{port}' autoport='yes' listen='127.0.0.1'/>
  </devices>
  <seclabel type='dynamic' model='selinux' relabel='yes'>
    <label>system_u:system_r:svirt_t:s0:c{id},c{pty}</label>
    <imagelabel>system_u:object_r:svirt_image_t:s0:c{id},c{pty}</imagelabel>
  </seclabel>
</domain>
"""


def test_an_existing_domains_fingerprint_sums_it_up_and_ignores_what_each_boot_changes(
        tmp_path):
    one = RUNNING.format(id=3, pty=2, state="connected", port=5900)
    two = RUNNING.format(id=17, pty=5, state="disconnected", port=5901)
    assert one != two and stable_xml(one) == stable_xml(two)
    assert "domain-N-db" in stable_xml(one) and "id=" not in stable_xml(one)
    # The domain's QEMU maps 1024 pages of 2 MiB from hugetlbfs: all granted.
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "smaps_rollup").write_text(
        "Rss:              102400 kB\nShared_Hugetlb:         0 kB\n"
        "Private_Hugetlb:  2097152 kB\nSwap:                  0 kB\n")
    summary = domain_summary(one, 77, proc_root=tmp_path)
    assert summary["summary"] == ("pc-q35-7.2 · kvm · cpu host-passthrough · 4 vCPUs · "
                                  "2048 MiB · 2 MiB huge pages: 1024 of 1024 granted")
    assert (summary["machine"], summary["vcpus"], summary["memory_bytes"]) == (
        "pc-q35-7.2", 4, 2 << 30)
    assert summary["host_hugepages"] == {"size": "2M", "granted": 1024}
    # Not granted (a pool too small: QEMU fell back, or the pid is unknown) says so.
    (tmp_path / "77" / "smaps_rollup").write_text("Private_Hugetlb:  0 kB\n")
    assert "0 of 1024 granted" in domain_summary(one, 77, tmp_path)["summary"]
    assert "granted unknown" in domain_summary(one, None, tmp_path)["summary"]
    plain = one.replace("<memoryBacking><hugepages><page size='2048' unit='KiB'/>"
                        "</hugepages></memoryBacking>", "")
    assert domain_summary(plain, 77, tmp_path)["summary"].endswith("no huge pages")


def test_fileios_prepare_in_a_users_guest_is_refused_in_one_line_without_room(tmp_path):
    """The scratch directory is made under the guest's workdir (/var/tmp): fileio's prepare
    needs its 2 GiB free there, checked before it starts writing."""
    from vmtax.core.types import JobResult
    from vmtax.workloads.sysbench import Fileio, FileioOptions

    prepare = Fileio(FileioOptions()).prepare_jobs()[0]
    assert prepare.scratch_bytes == 2 << 30 and prepare.in_scratch
    domain = ExistingDomain("libvirt:db", "db", virsh.Virsh(), Journal(tmp_path / "run"),
                            "/var/tmp")
    domain.scratch = "/var/tmp/.vmtax-0a1b2c3d4e5f"
    ran: list[list[str]] = []
    free_kib = 1 << 20

    def exec_(argv, cwd, timeout, env=None):
        ran.append(argv)
        if argv[0] == "df":
            return JobResult(0, "Filesystem 1024-blocks Used Available Capacity Mounted on\n"
                             f"/dev/vda1 8000000 6000000 {free_kib} 80% /\n", "", 0.1)
        return JobResult(0, "", "", 0.1)
    domain.exec = exec_   # type: ignore[method-assign]
    done = domain.run(prepare)
    assert not done.ok and ran == [["df", "-Pk", "--", domain.scratch]]
    assert done.stderr == ("libvirt:db: 2.0 GiB must be free in workdir = '/var/tmp' in the "
                           "guest of 'db', which has 1.0 GiB; free some, or give workdir a "
                           "directory with room")
    free_kib = 3 << 20
    assert domain.run(prepare).ok and ran[-1][0] != "df"


def test_a_libvirtd_without_hugetlbfs_is_named_in_the_refusal_and_by_doctor(tmp_path,
                                                                            monkeypatch):
    """A libvirtd the user started before any hugetlbfs mount never sees vmtax's: every
    domain with <hugepages> fails. libvirt's refusal and doctor say what to do."""
    message = _refusal(tmp_path, libvirt_target.LibvirtOptions(hugepages="2M", memory="256M"),
                       "internal error: hugetlbfs filesystem is not mounted or disabled by "
                       "administrator config")
    assert "\n" not in message and "(hugepages = '2M')" in message
    assert message.endswith("a libvirtd finds hugetlbfs mounts only when it starts: mount one "
                            "for 2M pages before starting it (mount -t hugetlbfs -o "
                            "pagesize=2M hugetlbfs /dev/hugepages), then restart it, or stop "
                            "it and vmtax starts its own")
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\n")
    assert not virsh.hugetlbfs_mounted(mounts)
    mounts.write_text("proc /proc proc rw 0 0\nhugetlbfs /dev/hugepages hugetlbfs rw 0 0\n")
    assert virsh.hugetlbfs_mounted(mounts)
    # doctor, with a libvirtd of the user's answering and no hugetlbfs mounted
    monkeypatch.setattr(libvirt_target, "startable", lambda: None)
    monkeypatch.setattr(libvirt_target.daemon, "answers", lambda path, timeout=2.0: True)
    monkeypatch.setattr(libvirt_target, "hugetlbfs_mounted", lambda: False)
    check = doctor._target_check(libvirt_target.LibvirtTarget)
    assert check.ok and "no hugetlbfs is mounted, so hugepages domains fail" in check.detail
    assert "mount -t hugetlbfs" in check.detail and "\n" not in check.detail
    monkeypatch.setattr(libvirt_target, "hugetlbfs_mounted", lambda: True)
    assert "hugetlbfs" not in doctor._target_check(libvirt_target.LibvirtTarget).detail
