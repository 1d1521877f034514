"""host-cpu and host-mem on real runc and crun containers: a container target's jobs, each
in a container of its own, are counted in the target's cgroup (needs root)."""

import os
import resource
import shutil
import subprocess

import pytest

from vmtax.collectors.host_cpu import HostCpu
from vmtax.collectors.host_mem import HostMem
from vmtax.core import plugin
from vmtax.core import target as targets
from vmtax.core.collector import Subject
from vmtax.core.target import Job, TargetContext
from vmtax.helpers.runtime_cgroup import TargetCgroup
from vmtax.host.journal import Journal

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(os.geteuid() != 0, reason="containers need root"),
    pytest.mark.skipif(TargetCgroup().hierarchy is None,
                       reason=f"no target cgroup here: {TargetCgroup().why_not}"),
]
# A fixed amount of work (~0.3 s of CPU here), so its CPU time does not depend on the load.
BUSY = ["sysbench", "cpu", "--events=8000", "--time=0", "run"]


@pytest.fixture(scope="module", params=["runc", "crun"])
def target(request, tmp_path_factory):
    name = request.param
    if shutil.which(name) is None:
        pytest.skip(f"{name} is not installed")
    base = tmp_path_factory.mktemp(f"cgroup-{name}")
    (base / "journal").mkdir()
    ctx = TargetContext(work_dir=base / "work", journal=Journal(base / "journal"),
                        binaries=("sysbench",))
    target = targets.create(f"container:{name}", "container", {"runtime": name}, ctx)
    target.prepare()
    yield target
    target.cleanup()


def native_cpu_seconds(argv):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def make(cls, tmp_path, **params):
    return cls(plugin.build(cls.Options, params, cls.name), journal=Journal(tmp_path),
               scratch=tmp_path)


def test_host_cpu_counts_each_job_s_container_in_the_target_s_cgroup(target, tmp_path):
    subject = Subject(kind="container", name=target.name, cgroup=target.cgroup())
    assert subject.cgroup is not None and HostCpu.unavailable(subject) is None
    cpu, mem = make(HostCpu, tmp_path), make(HostMem, tmp_path, interval=0.05)
    cpu.start(subject)
    mem.start(subject)
    for rep in range(2):
        assert target.run(Job(BUSY, timeout=60)).ok
        cpu.pause()
        mem.pause()
        if rep == 0:   # another target's turn: its CPU is not this one's
            assert target.run(Job(BUSY, timeout=60)).ok
            cpu.resume()
            mem.resume()
    got = {m.key: m.value for m in cpu.stop()}
    native = native_cpu_seconds(["sysbench", *BUSY[1:]])
    # Two jobs' CPU, each near the same work's on the host (the runtime's start adds some).
    assert 1.5 * native < got["host cpu"] < 2 * native + 1.0, (got, native)
    assert got["host cpu user"] > got["host cpu system"]
    peak = {m.key: m.value for m in mem.stop()}["host pss peak"]
    assert 1 < peak < 200, peak
