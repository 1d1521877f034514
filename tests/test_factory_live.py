"""The instance factory for real: 8 TCG guests and 8 runc containers at once on one vmtax
network, each answering at its own address; then nothing left, after a normal stop and
after kill -9 of the process that made them."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from vmtax.core import target as targets
from vmtax.core.errors import TargetError
from vmtax.core.target import TargetContext
from vmtax.host import proc
from vmtax.host.journal import Journal
from vmtax.host.network import PREFIX, Network
from vmtax.studies.factory import InstanceFactory

pytestmark = pytest.mark.live

GUEST = {"accel": "tcg", "vcpus": 1, "memory": "256M", "disk_size": "64M"}


def host_state(base: Path, net_id: str) -> dict[str, set[str]]:
    """What the test's instances could leave behind: the network's namespaces and devices,
    QEMU processes of guests under base, the containers' idle payloads."""
    def lines(argv):
        return subprocess.run(argv, capture_output=True, text=True).stdout.splitlines()
    netns = {line.split()[0] for line in lines(["ip", "netns", "list"])
             if line.startswith(f"vmtax-{net_id}")}
    devices = {line.split(":")[1].strip().split("@")[0]
               for ns in [None, *netns]
               for line in lines(["ip", *(["-n", ns] if ns else []), "-o", "link"])
               if f": vt{net_id}" in line}
    procs = set()
    for pid in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if ("qemu-system" in cmdline and str(base) in cmdline
                or cmdline.startswith("sleep 2147483647")):
            procs.add(pid)
    mounts = {line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
              if str(base) in line or f"vmtax-{net_id}" in line}
    return {"netns": netns, "devices": devices, "processes": procs, "mounts": mounts}


NOTHING: dict[str, set[str]] = {"netns": set(), "devices": set(), "processes": set(),
                                "mounts": set()}


def reachable(net: Network, address: str) -> bool:
    """One ICMP echo from the host, inside the network's namespace (the kernel answers)."""
    done = proc.run(["busybox", "ping", "-c", "1", "-W", "5", address], timeout=30,
                    preexec=net.client_preexec())
    return done.exit_code == 0


def ctx_at(base: Path) -> TargetContext:
    for sub in ("journal", "work"):
        (base / sub).mkdir(exist_ok=True)
    return TargetContext(work_dir=base / "work", journal=Journal(base / "journal"))


def test_eight_guests_and_eight_containers_each_at_its_own_address(tmp_path):
    ctx = ctx_at(tmp_path)
    net = Network(ctx.journal).create()
    guests_target = targets.create("vm:tcg", "vm", GUEST, ctx)
    containers_target = targets.create("container:runc", "container", {"runtime": "runc"}, ctx)
    try:
        with InstanceFactory(guests_target, net) as guests, \
                InstanceFactory(containers_target, net) as containers:
            started = time.monotonic()
            vms = guests.start(8, parallel=4)
            boot = time.monotonic() - started
            cts = containers.start(8)
            everyone = [*vms, *cts]
            addresses = [i.address for i in everyone]
            assert len(set(addresses)) == 16 and all(addresses)
            assert [i.name for i in everyone if not (i.alive() and i.host_pids())] == []
            assert all(0 < i.boot_seconds < 120 for i in everyone)
            # Every one answers at its own address, through the bridge.
            assert [a for a in addresses if not reachable(net, a)] == []
            # Each guest runs jobs of its own, and sees the address it was given.
            for vm in vms:
                shown = vm.run(vm_job(["ip", "-4", "-o", "addr", "show", "eth0"]))
                assert f"inet {vm.address}/{PREFIX}" in shown.stdout
            print(f"8 guests booted in {boot:.1f} s (4 at a time); boot seconds "
                  f"{sorted(round(v.boot_seconds, 1) for v in vms)}")
        assert all(not i.alive() for i in everyone)
    finally:
        containers_target.cleanup()
        guests_target.cleanup()
        net.destroy()
    assert ctx.journal.entries == {}
    assert host_state(tmp_path, net.id) == NOTHING
    assert [d.name for d in (tmp_path / "work").iterdir() if d.name.startswith("vm-")] == []


def vm_job(argv):
    from vmtax.core.types import Job
    return Job(argv, timeout=30)


def test_a_kind_without_instances_says_so(tmp_path):
    ctx = ctx_at(tmp_path)
    native = targets.create("native", "native", {}, ctx)
    with pytest.raises(TargetError, match="native targets cannot start instances"):
        InstanceFactory(native, network=object()).start(1)


SCRIPT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from vmtax.host import guardian
    from vmtax.core import target as targets
    from vmtax.studies.factory import InstanceFactory
    from vmtax.host.journal import Journal
    from vmtax.host.network import PREFIX, Network
    from vmtax.core.target import TargetContext

    base = Path(sys.argv[1])
    journal = Journal(base / "journal")
    with guardian.guard(journal.path):
        ctx = TargetContext(work_dir=base / "work", journal=journal)
        net = Network(journal).create()
        guests = InstanceFactory(targets.create("vm:tcg", "vm", {GUEST}, ctx), net)
        containers = InstanceFactory(
            targets.create("container:runc", "container", {{"runtime": "runc"}}, ctx), net)
        guests.start(2, parallel=2)
        containers.start(2)
        print("READY", net.id, flush=True)
        time.sleep(600)
""")


def test_kill_9_of_the_owner_leaves_nothing(tmp_path):
    for sub in ("journal", "work"):
        (tmp_path / sub).mkdir()
    owner = subprocess.Popen([sys.executable, "-c", SCRIPT.format(GUEST=GUEST), str(tmp_path)],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        ready, net_id = owner.stdout.readline().split()
        assert ready == "READY"
        deadline = time.monotonic() + 10   # runc execs the payload after the container runs
        while len((during := host_state(tmp_path, net_id))["processes"]) < 4:
            assert time.monotonic() < deadline, during
            time.sleep(0.05)
        assert len(during["processes"]) == 4   # 2 QEMU, 2 idle container payloads
        assert len(during["netns"]) == 3       # the network's, the 2 containers'
        assert len(during["devices"]) == 5     # the bridge, 2 taps, 2 veths
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        deadline = time.monotonic() + 5
        while host_state(tmp_path, net_id) != NOTHING and time.monotonic() < deadline:
            time.sleep(0.1)
        # The guardian undid it all, without a new start of vmtax.
        assert host_state(tmp_path, net_id) == NOTHING
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)
            owner.wait()
