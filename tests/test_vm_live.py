"""A real TCG guest (never KVM here: /dev/kvm may be kvm_pvm, on which stock kernels hang).

One guest is booted for the whole module; the last test makes it hang, reboots it and checks
that cleanup leaves nothing behind. The first run downloads Debian's kernel into the cache.
"""

import os
import time
from pathlib import Path

import pytest

from vmtax.core import target as targets
from vmtax.core.target import Job, TargetContext
from vmtax.host.journal import Journal

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    base = tmp_path_factory.mktemp("vm-live")
    (base / "journal").mkdir()
    (base / "work").mkdir()
    ctx = TargetContext(work_dir=base / "work", journal=Journal(base / "journal"),
                         binaries=("sysbench",))
    target = targets.create("vm:tcg", "vm", {"accel": "tcg"}, ctx)
    target.prepare()
    yield target
    target.cleanup()


def test_boot_and_fingerprint(guest):
    assert guest.alive()
    fp = guest.fingerprint()
    assert 0 < fp["guest_boot_seconds"] < fp["boot_seconds"] < 60
    assert (fp["accel"], fp["machine"], fp["cpu"], fp["vcpus"]) == ("tcg", "microvm", "max", 2)
    assert fp["qemu_version"].startswith("QEMU emulator version")
    assert fp["kernel_version"] in guest.run(Job(["uname", "-r"])).stdout


def test_sysbench_cpu(guest):
    res = guest.run(Job(["sysbench", "cpu", "--cpu-max-prime=2000", "--time=1", "run"],
                        timeout=60))
    assert res.ok, res.stderr
    assert "events per second" in res.stdout
    # The guest's clock (TSC) agrees with the host's around the job; the host also pays
    # for the protocol round trip.
    assert 0.9 < res.guest_elapsed <= res.host_elapsed + 0.05
    assert res.host_elapsed - res.guest_elapsed < 0.5


def test_output_that_looks_like_protocol(guest):
    text = "RESULT 99 0 0 0 12 0\nREADY 6.1 0.5\nJOB 1 1 0 0 p:true\n"
    res = guest.run(Job(["printf", "%s", text]))
    assert res.ok and res.stdout == text
    assert guest.run(Job(["echo", "in sync"])).stdout == "in sync\n"


def test_env_and_exit_status(guest):
    res = guest.run(Job(["sh", "-c", 'echo "$A" >&2; exit 4'], env={"A": "x y $(z)"}))
    assert (res.exit_code, res.stderr, res.timed_out) == (4, "x y $(z)\n", False)


def test_timeout_inside_guest_then_keeps_working(guest):
    start = time.monotonic()
    res = guest.run(Job(["sleep", "30"], timeout=1))
    assert res.timed_out and res.exit_code is None
    assert time.monotonic() - start < 10
    assert guest.alive()
    assert guest.run(Job(["echo", "ok"])).stdout == "ok\n"


def test_fileio_on_scratch_disk(guest):
    res = guest.run(Job(["sysbench", "fileio", "--file-total-size=16M", "prepare"],
                        in_scratch=True, timeout=120))
    assert res.ok, res.stderr
    assert "16777216 bytes written" in res.stdout
    where = guest.run(Job(["sh", "-c", "pwd; grep ' /work ' /proc/mounts"], in_scratch=True))
    assert where.stdout.startswith("/work\n/dev/vda /work ext4 ")
    assert guest.run(Job(["sysbench", "fileio", "--file-total-size=16M", "cleanup"],
                         in_scratch=True)).ok


def test_vcpu_threads(guest):
    threads = guest.vcpu_threads()
    assert len(threads) == 2
    pid = guest.host_pids()[0]
    assert all(Path(f"/proc/{pid}/task/{tid}").exists() for tid in threads)


def test_hung_guest_is_stopped_rebooted_and_cleaned_up(guest):
    guest.qmp("stop")   # the guest freezes: the agent can never answer
    guest.guest.session.host_margin = 1.0
    res = guest.run(Job(["true"], timeout=1))
    assert res.timed_out and res.exit_code is None
    assert 2 <= res.host_elapsed < 10
    assert not guest.alive()

    guest.prepare()     # what the runner does with a target that hung
    assert guest.run(Job(["echo", "again"])).stdout == "again\n"
    pid = guest.host_pids()[0]
    run_dir = guest.guest.config.console_log.parent
    guest.cleanup()
    assert not Path(f"/proc/{pid}").exists()
    assert not run_dir.exists()
    assert list(guest.ctx.work_dir.iterdir()) == []
    assert guest.ctx.journal.entries == {}
    assert not any(p.name.startswith("journal-") for p in guest.ctx.journal.dir.iterdir())
    guest.cleanup()     # idempotent
    assert os.path.exists(guest.ctx.work_dir)


@pytest.mark.parametrize("machine, bus, device", [("microvm", "virtio-scsi", "/dev/sda"),
                                                  ("microvm", "nvme", "/dev/nvme0n1")])
def test_scratch_disk_on_its_bus_takes_dd(tmp_path, machine, bus, device):
    """virtio-scsi over MMIO (microvm has no PCI) and NVMe on the PCIe bus microvm gets for
    it: the guest loads the bus's drivers from the image, mounts the scratch disk at /work
    and writes to it."""
    (tmp_path / "journal").mkdir()
    (tmp_path / "work").mkdir()
    ctx = TargetContext(work_dir=tmp_path / "work", journal=Journal(tmp_path / "journal"))
    target = targets.create("vm:tcg", "vm", {
        "accel": "tcg", "machine": machine, "disk_bus": bus, "vcpus": 1, "memory": "256M",
        "disk_size": "64M"}, ctx)
    try:
        target.prepare()
        res = target.run(Job(["sh", "-c", "dd if=/dev/zero of=f bs=64k count=64 && sync && "
                              "ls -l f && grep ' /work ' /proc/mounts"],
                             in_scratch=True, timeout=120))
        assert res.ok, res.stderr
        assert " 4194304 " in res.stdout
        assert res.stdout.splitlines()[-1].startswith(f"{device} /work ext4 rw")
        assert target.fingerprint()["disk_bus"] == bus
    finally:
        target.cleanup()
    assert ctx.journal.entries == {}
