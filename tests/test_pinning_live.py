"""CPU placement observed from the host while targets run: a pinned TCG guest's vCPU threads
(and QEMU's other threads), and containers confined to a cpuset or by affinity."""

import os
import shutil
from pathlib import Path

import pytest

from vmtax.core import target as targets
from vmtax.core.target import Job, TargetContext
from vmtax.host.journal import Journal

pytestmark = pytest.mark.live
CPUS = sorted(os.sched_getaffinity(0))


@pytest.fixture
def ctx(tmp_path):
    (tmp_path / "journal").mkdir()
    (tmp_path / "work").mkdir()
    return TargetContext(work_dir=tmp_path / "work", journal=Journal(tmp_path / "journal"),
                         binaries=("sysbench",))


def allowed(pid: int, tid: int) -> str:
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    return next(line.split(":", 1)[1].strip() for line in status.splitlines()
                if line.startswith("Cpus_allowed_list:"))


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two host CPUs")
def test_pinned_vcpu_threads_have_the_asked_affinity(ctx):
    # Reversed, so vCPU order is seen to matter: vCPU 0 on the last CPU.
    pin = [CPUS[-1], CPUS[0]]
    target = targets.create("vm", "vm", {"accel": "tcg", "vcpus": 2, "pin": pin, "memory": "256M"},
                            ctx)
    target.prepare()
    try:
        result = target.run(Job(["sysbench", "cpu", "--threads=2", "--time=1", "run"],
                                timeout=60))
        assert result.ok, result.stderr
        pid = target.host_pids()[0]
        threads = target.vcpu_threads()
        assert [allowed(pid, tid) for tid in threads] == [str(cpu) for cpu in pin]
        assert target.fingerprint()["vcpu_affinity"] == [[cpu] for cpu in pin]
        assert target.fingerprint()["pin"] == pin
    finally:
        target.cleanup()


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two host CPUs")
def test_qemus_other_threads_stay_off_the_pinned_cpu(ctx):
    target = targets.create("vm", "vm", {"accel": "tcg", "vcpus": 1, "pin": [CPUS[-1]],
                                         "memory": "256M"}, ctx)
    target.prepare()
    try:
        pid = target.host_pids()[0]
        (vcpu,) = target.vcpu_threads()
        others = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != vcpu]
        assert allowed(pid, vcpu) == str(CPUS[-1])
        # Main loop, RCU and I/O threads: every CPU vmtax may use but the pinned one.
        assert others and all(os.sched_getaffinity(t) == set(CPUS[:-1]) for t in others)
    finally:
        target.cleanup()


@pytest.mark.skipif(os.geteuid() != 0, reason="containers need root")
@pytest.mark.parametrize("runtime", ["unshare", "runc", "crun"])
def test_container_cpus(ctx, runtime):
    if shutil.which(runtime) is None:
        pytest.skip(f"{runtime} is not installed")
    cpu = CPUS[-1]
    target = targets.create(f"container:{runtime}", "container",
                            {"runtime": runtime, "cpus": [cpu]}, ctx)
    target.prepare()
    try:
        result = target.run(Job(["sh", "-c", "grep Cpus_allowed_list /proc/self/status"]))
        assert result.ok, result.stderr
        assert result.stdout.split() == ["Cpus_allowed_list:", str(cpu)]
        fp = target.fingerprint()
        assert fp["cpus"] == [cpu]
        assert fp["cpu_placement"] == ("affinity" if runtime == "unshare"
                                       or fp["cgroup_workaround"] else "cpuset")
    finally:
        target.cleanup()
