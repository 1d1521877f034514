"""Live tests of gVisor: build runsc (once, about 3 minutes; cached afterwards) and run real
jobs in it through the container target (needs root)."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_for

from vmtax.core import target as targets
from vmtax.core import workload as workloads
from vmtax.core.target import TargetContext
from vmtax.core.types import Job
from vmtax.host import journal
from vmtax.host.journal import Journal
from vmtax.targets import runsc

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(os.geteuid() != 0, reason="containers need root"),
    pytest.mark.skipif(runsc.Runsc.unavailable() is not None,
                       reason=str(runsc.Runsc.unavailable())),
]


@pytest.fixture(scope="module")
def binary() -> Path:
    return runsc.build()


def runsc_processes(binary: Path) -> list[int]:
    """Processes running the runsc binary: runsc itself, its sandbox and its gofer."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.readlink(entry / "exe") == str(binary):
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


def none_left(binary: Path, within: float = 5.0) -> bool:
    """No runsc process is left (SIGKILL takes effect asynchronously)."""
    return wait_for(lambda: not runsc_processes(binary), within, step=0.05)


def host_leftovers(base: Path) -> list[str]:
    """Cgroup directories of vmtax containers, and mounts (a pinned namespace) under base."""
    return ([str(p) for p in Path("/sys/fs/cgroup").glob("*/vmtax-*")]
            + [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
               if str(base) in line])


@pytest.mark.parametrize("runtime", ["runsc", "runsc-ptrace"])
def test_sysbench_runs_and_leaves_nothing(binary, runtime, tmp_path):
    (tmp_path / "journal").mkdir()
    ctx = TargetContext(work_dir=tmp_path / "work", journal=Journal(tmp_path / "journal"),
                        binaries=("sysbench",))
    t = targets.create(f"container:{runtime}", "container", {"runtime": runtime}, ctx)
    with t:
        r = t.run(Job(["sysbench", "cpu", "--time=1", "run"], timeout=60))
        fp = t.fingerprint()
    assert r.ok, r.stderr
    assert re.search(r"events per second:\s+[0-9.]+", r.stdout)
    assert fp["runtime"] == runtime
    assert fp["runtime_version"] == f"runsc version {runsc.GVISOR_VERSION}"
    assert none_left(binary)
    assert host_leftovers(tmp_path) == []
    assert ctx.journal.entries == {} and list(ctx.work_dir.iterdir()) == []


def test_jobs_share_work_and_see_only_loopback(binary, tmp_path):
    (tmp_path / "journal").mkdir()
    ctx = TargetContext(work_dir=tmp_path / "work", journal=Journal(tmp_path / "journal"),
                        binaries=("sysbench",))
    with targets.create("container:runsc", "container", {"runtime": "runsc"}, ctx) as t:
        # fileio prepares its files in one container and measures in the next.
        assert t.run(Job(["sysbench", "fileio", "--file-total-size=4M", "prepare"],
                         in_scratch=True, timeout=60)).ok
        files = t.run(Job(["sh", "-c", "ls /work | wc -l"], in_scratch=True))
        assert files.ok and int(files.stdout) == 128
        assert len(list((t.dir / "rootfs" / "work").glob("test_file.*"))) == 128
        net = t.run(Job(["cat", "/proc/net/dev"]))
        interfaces = {line.split(":")[0].strip() for line in net.stdout.splitlines()
                      if ":" in line and "|" not in line}
        assert interfaces == {"lo"}
        assert t.run(Job(["sh", "-c", "exit 3"])).exit_code == 3
        # A timeout kills the sandbox and its gofer, and the target stays usable.
        slow = t.run(Job(["sleep", "4711"], timeout=1))
        assert slow.timed_out and slow.host_elapsed < 5
        assert none_left(binary)
        assert t.run(Job(["true"])).ok
    assert none_left(binary) and host_leftovers(tmp_path) == []
    assert ctx.journal.entries == {} and list(ctx.work_dir.iterdir()) == []


CRASHING_VMTAX = """
import sys
from pathlib import Path
from vmtax.core import target as targets
from vmtax.host.journal import Journal
from vmtax.core.target import TargetContext
from vmtax.core.types import Job
base = Path(sys.argv[1])
t = targets.create("container:runsc", "container", {"runtime": "runsc"},
                   TargetContext(base / "work", Journal(base / "journal")))
t.prepare()
print("ready", flush=True)
t.run(Job(["sleep", "4713"]))
"""


def test_journal_recovers_a_killed_vmtax(binary, tmp_path):
    (tmp_path / "journal").mkdir()
    vmtax = subprocess.Popen([sys.executable, "-c", CRASHING_VMTAX, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    assert vmtax.stdout.readline() == "ready\n"
    deadline = time.monotonic() + 10
    while len(runsc_processes(binary)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(runsc_processes(binary)) >= 3            # runsc, its sandbox and gofer
    vmtax.kill()
    vmtax.wait()
    assert journal.recover(tmp_path / "journal") == [
        # with the target's own cgroup (helpers/runtime_cgroup), one more than before
        f"undid 4 host change(s) left by vmtax process {vmtax.pid}"]
    assert none_left(binary)
    assert list((tmp_path / "work").iterdir()) == []
    assert host_leftovers(tmp_path) == []


def test_cyclictest_cannot_run_at_any_priority_as_the_plan_check_says(binary, tmp_path):
    # Why the plan check refuses cyclictest under gVisor: rt-tests exits at start unless it
    # may switch to SCHED_FIFO, even when it is to measure at normal scheduling.
    cyclictest = workloads.get("cyclictest").make(
        {"priority": "none", "interval": 1000, "loops": 100})
    (tmp_path / "journal").mkdir()
    ctx = TargetContext(work_dir=tmp_path / "work", journal=Journal(tmp_path / "journal"),
                        binaries=cyclictest.binaries)
    with targets.create("container:runsc", "container", {"runtime": "runsc"}, ctx) as t:
        result = t.run(cyclictest.run_job())
    assert result.exit_code == 1
    assert result.stderr.startswith("Unable to change scheduling policy!")
