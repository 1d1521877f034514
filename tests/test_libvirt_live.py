"""Live tests of the libvirt target with the real libvirtd: a transient domain runs cpu; an
existing domain (defined here with virsh, the QEMU guest agent inside a vmtax-made image)
is measured as libvirt:NAME and left exactly as it was; bad input is one line each; kill -9
mid-run leaves no domain, file or libvirtd of vmtax's within 5 s. A libvirtd that was
already running is used and left alone."""

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import processes, start_vmtax, vmtax, wait_for
from test_ssh_live import SSHD, Sshd

from vmtax.guest.image import GuestImage
from vmtax.host import daemon
from vmtax.host.journal import Journal
from vmtax.targets.libvirt import nat
from vmtax.targets.libvirt import virsh as libvirt
from vmtax.targets.libvirt.domain_xml import stable_xml
from vmtax.targets.libvirt.target import LibvirtTarget

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(os.geteuid() != 0, reason="libvirtd and qemu:///system need root"),
    pytest.mark.skipif(LibvirtTarget.unavailable() is not None,
                       reason=str(LibvirtTarget.unavailable())),
]

KILLED_PLAN = """\
runs = 1
warmup = 0
time = 60

[targets.libvirt]

[[workloads]]
name = "cpu"
"""
# The guest of the user's domain: vmtax's image booted into the QEMU guest agent, not
# vmtax's agent (the kernel hands the words after "--" to init).
GUEST_INIT = (
    'mount -t proc p /proc; mount -t sysfs s /sys; mount -t devtmpfs d /dev; '
    'for k in $(cat /vmtax/modules/boot-pci.list); do insmod /vmtax/modules/$k; done; '
    'until [ -n "$p" ]; do for f in /sys/class/virtio-ports/*; do '
    'grep -q org.qemu.guest_agent.0 $f/name 2>/dev/null && p=/dev/${f##*/}; done; '
    'usleep 20000; done; exec qemu-ga -m virtio-serial -p $p -t /tmp')
DOMAIN = """<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>384</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>{dir}/vmlinux</kernel>
    <initrd>{dir}/initramfs.cpio</initrd>
    <cmdline>console=ttyS0 quiet panic=-1 rdinit=/bin/sh -- -c "{init}"</cmdline>
  </os>
  <cpu mode='maximum'/>
  <devices>
    <serial type='file'><source path='{dir}/console.log'/></serial>
    {channel}
  </devices>
</domain>
"""
AGENT_CHANNEL = ("<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/>"
                 "</channel>")


def virsh(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["virsh", "--quiet", "-c", libvirt.DEFAULT_URI, *args],
                          capture_output=True, text=True, timeout=timeout)


def daemons() -> set[int]:
    return processes("libvirtd") | processes("virtlogd")


def leftovers(before: set[int]) -> list[str]:
    """What vmtax's libvirt targets make: domains, their directories, daemons started."""
    found = [f"daemon {pid}" for pid in daemons() - before]
    if daemon.answers(libvirt.LIBVIRTD.socket):
        found += [f"domain {name}" for name in virsh("list", "--all", "--name").stdout.split()
                  if name.startswith("vmtax-libvirt")]
        found += [f"network {name}" for name in virsh("net-list", "--all", "--name").stdout.split()
                  if name.startswith("vmtax-")]
    found += [str(p) for p in libvirt.IMAGES.glob("vmtax-libvirt*")]
    found += [str(p) for p in libvirt.QEMU_LOGS.glob("vmtax-libvirt*")]
    return found


@pytest.fixture
def running_before():
    """libvirtd and virtlogd already running (someone else's, left alone)."""
    return daemons()


@pytest.fixture
def libvirtd(tmp_path):
    """A libvirtd for the test's own virsh calls: the one running, or one started here."""
    journal = Journal(tmp_path / "run")
    libvirt.ensure_daemon(journal, libvirt.DEFAULT_URI, tmp_path / "libvirtd")
    yield
    assert journal.undo_all() == []


TRANSIENT_PLAN = """\
runs = 2
warmup = 0
time = 1

[targets.libvirt]
vcpus = 1
memory = "256M"
pin = [{cpu}]
{hugepages}

[[workloads]]
name = "cpu"
"""


def test_a_transient_domain_pinned_on_huge_pages_runs_cpu_and_leaves_nothing(
        tmp_path, running_before):
    # A libvirtd running already (someone's) knows only the hugetlbfs mounts it found at
    # its start; the one vmtax starts is told of the one the run's pages are on.
    ours = not daemon.answers(libvirt.LIBVIRTD.socket)
    plan = tmp_path / "libvirt.toml"
    plan.write_text(TRANSIENT_PLAN.format(cpu=max(os.sched_getaffinity(0)),
                                          hugepages='hugepages = "2M"' if ours else ""))
    done = vmtax("run", str(plan), "--json", "--results", str(tmp_path / "results"),
                 timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)
    cell = {r["metric"]: r["cells"] for r in data["summary"]["rows"]}["events/s"]["libvirt"]
    assert cell["failed"] == 0 and cell["summary"]["median"] > 0, cell
    fingerprint = data["run"]["targets"]["libvirt"]["fingerprint"]
    assert fingerprint["domain_type"] in ("qemu", "kvm")
    xml = fingerprint["domain_xml"]
    assert xml.startswith(f'<domain type="{fingerprint["domain_type"]}">')
    assert f'<vcpupin vcpu="0" cpuset="{max(os.sched_getaffinity(0))}" />' in xml
    if ours:
        assert '<page size="2048" unit="KiB" />' in xml
        assert fingerprint["host_hugepages"] == {"size": "2M", "granted": 128}
    assert leftovers(running_before) == []


def _boot_users_domain(name: str, directory: Path, channel: str) -> None:
    # No sysbench in the user's guest: vmtax ships the host's own into it.
    image = GuestImage(["qemu-ga"])
    directory.mkdir(mode=0o711)
    shutil.copyfile(image.kernel(), directory / "vmlinux")
    shutil.copyfile(image.initramfs(), directory / "initramfs.cpio")
    xml = directory / "domain.xml"
    xml.write_text(DOMAIN.format(name=name, dir=directory, channel=channel,
                                 init=GUEST_INIT.replace("&", "&amp;")))
    assert virsh("define", str(xml)).returncode == 0


def guest_sh(domain: str, script: str, *args: str) -> tuple[int, bytes]:
    """sh -c script args in the domain's guest, through its agent: (exit code, stdout)."""
    started = virsh("qemu-agent-command", domain, json.dumps(
        {"execute": "guest-exec", "arguments": {"path": "/bin/sh", "arg": [
            "-c", script, *args], "capture-output": True}}))
    pid = json.loads(started.stdout)["return"]
    for _ in range(100):
        status = json.loads(virsh("qemu-agent-command", domain, json.dumps(
            {"execute": "guest-exec-status", "arguments": pid})).stdout)["return"]
        if status["exited"]:
            return status["exitcode"], base64.b64decode(status.get("out-data", ""))
        time.sleep(0.1)
    raise AssertionError(f"{script} did not end in the guest")


def _remove_users_domain(name: str, directory: Path) -> None:
    virsh("destroy", name)
    virsh("undefine", name)
    shutil.rmtree(directory, ignore_errors=True)
    (libvirt.QEMU_LOGS / f"{name}.log").unlink(missing_ok=True)


@pytest.mark.skipif(shutil.which("qemu-ga") is None,
                    reason="the user's guest runs qemu-ga (apt-get install qemu-guest-agent)")
def test_an_existing_domain_is_measured_and_left_exactly_as_it_was(tmp_path, libvirtd):
    name = f"vmtax-test-ga-{os.getpid()}"
    directory = libvirt.IMAGES / name
    try:
        _boot_users_domain(name, directory, AGENT_CHANNEL)
        off = vmtax("run", "--targets", f"libvirt:{name}", "--workloads", "cpu", "--runs", "1",
                    "--results", str(tmp_path / "results"), timeout=120)
        assert off.returncode != 0
        assert off.stderr.strip().splitlines()[-1] == (
            f"vmtax: error: libvirt:{name}: domain '{name}' is shut off; start it first "
            f"(virsh start {name}): vmtax measures a domain of yours as it finds it")
        assert virsh("start", name).returncode == 0
        assert wait_for(lambda: virsh("qemu-agent-command", name, '{"execute":"guest-ping"}',
                                      timeout=30).returncode == 0, 120, step=0.5)
        before = (virsh("dumpxml", name).stdout, virsh("dumpxml", "--inactive", name).stdout)
        done = vmtax("run", "--targets", f"libvirt:{name}", "--workloads", "cpu", "--runs", "2",
                     "--time", "1", "--collect", "host-cpu", "--json",
                     "--results", str(tmp_path / "results"), timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        data = json.loads(done.stdout)
        rows = {r["metric"]: r["cells"] for r in data["summary"]["rows"]}
        cell = rows["events/s"][f"libvirt:{name}"]
        assert cell["failed"] == 0 and cell["summary"]["median"] > 0, cell
        fingerprint = data["run"]["targets"][f"libvirt:{name}"]["fingerprint"]
        pid = int((libvirt.RUN_DIR / "qemu" / f"{name}.pid").read_text())
        assert (fingerprint["qemu_pid"], fingerprint["hypervisor"]) == (pid, "qemu")
        assert re.fullmatch(r"[0-9a-f]{16}", fingerprint["bundle"])
        assert fingerprint["domain_xml"] == stable_xml(before[0])
        assert fingerprint["vcpus"] >= 1 and fingerprint["machine"].startswith("pc-q35")
        assert "no huge pages" in fingerprint["summary"]
        # Its QEMU, found through the target, was measured by the host-side collector.
        assert any(key.startswith("host cpu") for key in rows), sorted(rows)
        after = (virsh("dumpxml", name).stdout, virsh("dumpxml", "--inactive", name).stdout)
        assert after == before
        # The scratch directory vmtax made in the guest is gone again.
        code, out = guest_sh(name, "ls -a /var/tmp")
        assert code == 0 and b".vmtax-" not in out, out
        # It ran the host's sysbench, shipped: the guest has none of its own.
        assert guest_sh(name, 'command -v "$0"', "sysbench")[0] != 0
    finally:
        _remove_users_domain(name, directory)


SSH_PLAN = """\
runs = 1
warmup = 0
time = 1

[targets.guest]
kind = "libvirt"
domain = "{name}"
host = "{host}"
identity = "{identity}"
known_hosts = "{known_hosts}"
workdir = "{workdir}"

[[workloads]]
name = "cpu"
"""


@pytest.mark.skipif(not os.path.exists(SSHD), reason="sshd is missing (openssh-server)")
@pytest.mark.skipif(shutil.which("qemu-ga") is None,
                    reason="the user's guest image carries qemu-ga (qemu-guest-agent)")
def test_bad_input_is_one_line_each_and_ssh_reaches_a_domain_without_agent(tmp_path, libvirtd):
    """Unknown domain, a URI that refuses, XML libvirt rejects, a domain without a guest
    agent or ssh details; given them, the same domain is measured over SSH (an sshd of the
    test's own stands for its guest's)."""
    def error(*args: str) -> str:
        done = vmtax("run", *args, "--workloads", "cpu", "--runs", "1", "--time", "1",
                     "--results", str(tmp_path / "results"), timeout=300)
        assert done.returncode != 0
        lines = done.stderr.strip().splitlines()
        assert "Traceback" not in done.stderr, done.stderr
        return lines[-1]

    assert error("--targets", "libvirt:vmtax-no-such-domain") == (
        "vmtax: error: libvirt:vmtax-no-such-domain: no domain 'vmtax-no-such-domain' at "
        "qemu:///system (`virsh -c qemu:///system list --all` lists them): failed to get "
        "domain 'vmtax-no-such-domain'")
    refused = error("--targets", "libvirt", "--uri",
                    f"qemu+unix:///system?socket={tmp_path}/none.sock")
    assert refused.startswith(f"vmtax: error: libvirt: uri = 'qemu+unix:///system?socket="
                              f"{tmp_path}/none.sock': failed to connect to the hypervisor")
    rejected = error("--targets", "libvirt", "--machine", "vmtax-no-such-machine")
    assert rejected.startswith("vmtax: error: libvirt: libvirt refused the domain (machine = "
                               "'vmtax-no-such-machine'): "), rejected
    name = f"vmtax-test-noga-{os.getpid()}"
    directory = libvirt.IMAGES / name
    try:
        _boot_users_domain(name, directory, "")
        assert virsh("start", name).returncode == 0
        assert error("--targets", f"libvirt:{name}") == (
            f"vmtax: error: libvirt:{name}: domain '{name}' has no QEMU guest agent channel "
            "(org.qemu.guest_agent.0) and no ssh details: give its guest's host (and "
            "identity) to reach it over SSH")
        before = virsh("dumpxml", name).stdout
        server = Sshd(tmp_path).start()
        try:
            options = server.options()
            plan = tmp_path / "ssh.toml"
            plan.write_text(SSH_PLAN.format(name=name, **options))
            done = vmtax("run", str(plan), "--json", "--results", str(tmp_path / "results"),
                         timeout=300)
            assert done.returncode == 0, done.stderr[-2000:]
            data = json.loads(done.stdout)
            cell = {r["metric"]: r["cells"] for r in data["summary"]["rows"]}["events/s"]["guest"]
            assert cell["failed"] == 0 and cell["summary"]["median"] > 0, cell
            fingerprint = data["run"]["targets"]["guest"]["fingerprint"]
            assert (fingerprint["transport"], fingerprint["domain_xml"]) == (
                "ssh", stable_xml(before))
            assert list(server.workdir.iterdir()) == []   # scratch and bundle removed
        finally:
            server.stop()
        assert virsh("dumpxml", name).stdout == before
    finally:
        _remove_users_domain(name, directory)


def test_kill_9_mid_run_leaves_nothing_within_5_s(tmp_path, running_before):
    plan = tmp_path / "libvirt.toml"
    plan.write_text(KILLED_PLAN)
    owner = start_vmtax("run", str(plan), "--results", str(tmp_path / "results"))
    try:
        # Mid-run: sysbench runs in the domain for a minute.
        assert wait_for(lambda: any(line.startswith("domain vmtax-libvirt")
                                    for line in leftovers(running_before)), 240, step=0.2), \
            owner.stderr.read() if owner.poll() is not None else "no domain"
        time.sleep(8)   # booted, and its first job under way
        assert owner.poll() is None
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        # The guardian undoes the journal: QEMU, the domain, its files, then the daemons.
        assert wait_for(lambda: leftovers(running_before) == [], 5, step=0.1), \
            leftovers(running_before)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


NAT_PLAN = """\
runs = 1
warmup = 0
time = 1

[targets.libvirt]
vcpus = 1
memory = "256M"
network = "nat"
disk_bus = "virtio-scsi"

[[workloads]]
name = "iperf3"

[[workloads]]
name = "dd"
params = { size = "8M" }
"""


def _libvirts_marks() -> dict[str, object]:
    """What a libvirt NAT network changes on the host, as iptables-save, ip link, sysctl and
    libvirt's state directories show it (libvirt's lines only: other work may add its own)."""
    rules = {program: sorted(line for line in subprocess.run(
        [f"{program}-save"], capture_output=True, text=True, timeout=60).stdout.splitlines()
        if "LIBVIRT" in line or "vtnat" in line) for program in libvirt.IPTABLES}
    links = sorted(p.name for p in Path("/sys/class/net").iterdir()
                   if p.name.startswith(("vtnat", "vnet")))
    tables = (subprocess.run(["nft", "list", "tables"], capture_output=True, text=True,
                             timeout=60).stdout.split("\n") if shutil.which("nft") else [])
    return {"rules": rules, "links": links, "forwarding": nat.FORWARDING.read_text(),
            "tables": sorted(line for line in tables if line.removeprefix("table ")
                             in libvirt.IPTABLES_TABLES),
            "dnsmasq": libvirt.DNSMASQ_DIR.exists(),
            "network state": sorted(str(p) for p in nat.NETWORK_RUN_DIR.glob("vmtax-*"))}


def test_libvirts_nat_network_serves_iperf3_a_scsi_disk_takes_dd_and_the_host_is_as_it_was(
        tmp_path, running_before):
    before = _libvirts_marks()
    plan = tmp_path / "nat.toml"
    plan.write_text(NAT_PLAN)
    done = vmtax("run", str(plan), "--json", "--results", str(tmp_path / "results"),
                 timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)
    for row in data["summary"]["rows"]:
        if row["metric"] == "throughput":   # iperf3's, dd's buffered and direct
            cell = row["cells"]["libvirt"]
            assert cell["failed"] == 0 and cell["summary"]["median"] > 0, row
    assert {r["workload"] for r in data["summary"]["rows"]} == {"iperf3", "dd"}
    fingerprint = data["run"]["targets"]["libvirt"]["fingerprint"]
    assert fingerprint["network"] == "nat" and fingerprint["disk_bus"] == "virtio-scsi"
    assert '<target dev="sda" bus="scsi" />' in fingerprint["domain_xml"]
    assert '<interface type="network">' in fingerprint["domain_xml"]
    assert '<source network="vmtax-nat-' in fingerprint["domain_xml"]
    # What a libvirtd makes with its first network stays with one of the user's (it needs
    # it for its next); the rest goes.
    after = _libvirts_marks()
    if running_before:
        for key in ("rules", "tables", "dnsmasq"):
            before.pop(key), after.pop(key)
    assert after == before
    assert leftovers(running_before) == []
