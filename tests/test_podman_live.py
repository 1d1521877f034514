"""Live tests of container:podman: real rootful podman containers, and what they leave."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_for

from vmtax.core import target as targets
from vmtax.core.target import TargetContext
from vmtax.core.types import Job
from vmtax.host import journal
from vmtax.host.journal import Journal
from vmtax.targets.podman import RUNC_ROOT, Podman

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(os.geteuid() != 0, reason="rootful podman needs root"),
]
# Where rootful podman keeps state unless told otherwise, and runc's default state directory.
HOST_STATE = ("/run/libpod", "/run/containers", "/var/lib/containers", "/run/runc")
RUNROOT_LINKS = "/run/vmtax-podman-*"
CGROUPS = Path("/sys/fs/cgroup")


@pytest.fixture(scope="module", autouse=True)
def installed():
    why = Podman.unavailable()
    if why is not None:
        pytest.skip(f"container:podman is unavailable here: {why}")


def host_state() -> set[str]:
    """Everything in and under podman's and runc's host-wide directories."""
    found = set()
    for top in HOST_STATE:
        if os.path.lexists(top):
            found.add(top)
            found.update(str(p) for p in Path(top).rglob("*"))
    return found | {str(p) for p in Path("/").glob(RUNROOT_LINKS.lstrip("/"))}


def cgroups(names: list[str]) -> list[str]:
    """Cgroup directories of these containers (others' tests may run beside these), and
    any podman made, at any depth it would make them."""
    patterns = [*names, *(f"*/{name}" for name in names), "libpod*", "*/libpod*",
                "*/*/libpod*"]
    return sorted(str(p) for pattern in patterns for p in CGROUPS.glob(pattern))


def running(marker: bytes, exact: bool = False) -> list[int]:
    """Live processes showing marker in their command line (a zombie's is empty), or with
    exactly that command line (not podman's, which ends in the job's)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
        except OSError:
            continue
        if cmdline == marker if exact else marker in cmdline:
            pids.append(int(entry.name))
    return pids


def gone(marker: bytes, within: float = 5.0) -> bool:
    return wait_for(lambda: not running(marker), within, step=0.05)


def mounts_under(path: Path) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if str(path) in line]


def containers(target) -> list[str]:
    """Containers in the target's private podman storage, running or not."""
    runtime = target.runtime
    runtime.link()               # podman reaches its runroot only through the link
    try:
        out = subprocess.run([*runtime.base(), "ps", "--all", "--format={{.Names}}"],
                             capture_output=True, text=True, check=True)
    finally:
        runtime.unlink()
    return out.stdout.split()


def leftovers(target, before: set[str], names: list[str]) -> list[str]:
    """What a finished job may not leave: processes, host state (runc's, the runroot link),
    containers, cgroups, mounts."""
    found = [f"process {pid}" for pid in running(str(target.dir).encode())]
    # runc's state directory stays while the target is attached (journaled, removed after).
    found += sorted(host_state() - before - {str(RUNC_ROOT)})
    found += [f"container {name}" for name in containers(target)]
    found += cgroups(names) + mounts_under(target.dir)
    return found


@pytest.fixture(scope="module")
def before():
    assert cgroups([]) == [], "podman cgroups of an earlier run are in the way"
    return host_state()


@pytest.fixture(scope="module")
def launched():
    """Names of the containers podman is asked to make in this process."""
    names: list[str] = []
    launch = Podman.launch

    def spy(self, job):
        made = launch(self, job)
        names.append(made.container)
        return made
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Podman, "launch", spy)
        yield names


@pytest.fixture(scope="module")
def target(before, launched, tmp_path_factory):
    base = tmp_path_factory.mktemp("podman")
    (base / "journal").mkdir()
    ctx = TargetContext(work_dir=base / "work", journal=Journal(base / "journal"),
                        binaries=("sysbench",))
    target = targets.create("container:podman", "container", {"runtime": "podman"}, ctx)
    target.prepare()
    yield target
    target.cleanup()


def test_sysbench_cpu(target, before, launched):
    result = target.run(Job(["sysbench", "cpu", "--time=1", "run"], timeout=60))
    assert result.ok, result.stderr
    assert re.search(r"events per second:\s+[0-9.]+", result.stdout)
    assert 0.9 < result.host_elapsed < 10
    fp = target.fingerprint()
    assert fp["runtime"] == "podman"
    assert re.fullmatch(r"podman version \d+\.\d+\.\d+, runc version \S+",
                        fp["runtime_version"]), fp["runtime_version"]
    assert target.ctx.journal.entries.keys() == {target._dir_token,
                                                 target.runtime._state_token}
    assert leftovers(target, before, launched) == []


def test_timeout_kills_and_removes_the_container(target, before, launched):
    result = target.run(Job(["sleep", "30"], timeout=1))
    assert result.timed_out and result.exit_code is None and not result.ok
    assert 1 <= result.host_elapsed < 5
    assert gone(b"sleep\x0030\x00")
    assert leftovers(target, before, launched) == []
    assert target.ctx.journal.entries.keys() == {target._dir_token,
                                                 target.runtime._state_token}
    assert target.alive() and target.run(Job(["true"])).ok


def test_the_job_sees_what_other_runtimes_give(target):
    result = target.run(Job(["sh", "-c", "echo $$; pwd; hostname; echo $A; ls /proc; "
                                         "cat /proc/net/dev; grep CapEff /proc/self/status"],
                            env={"A": "x y"}, in_scratch=True,
                            capabilities=("CAP_SYS_NICE",)))
    assert result.ok, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:4] == ["1", "/work", "vmtax", "x y"]
    pids = [int(w) for w in " ".join(lines[4:]).split() if w.isdigit()]
    assert 1 in pids and max(pids) < 50
    interfaces = {line.split(":")[0].strip() for line in lines
                  if ":" in line and "|" not in line and not line.startswith("CapEff")}
    assert interfaces == {"lo"}
    # Docker's default set (bits 0, 1, 3-8, 10, 13, 18, 27, 29, 31) plus CAP_SYS_NICE (23).
    assert lines[-1].split() == ["CapEff:", "00000000a88425fb"]
    assert target.run(Job(["sh", "-c", "exit 3"])).exit_code == 3


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable CPUs")
def test_cpus_become_the_cpuset(before, launched, tmp_path):
    cpu = max(os.sched_getaffinity(0))
    (tmp_path / "journal").mkdir()
    ctx = TargetContext(work_dir=tmp_path / "work", journal=Journal(tmp_path / "journal"))
    with targets.create("container:podman", "container",
                        {"runtime": "podman", "cpus": [cpu]}, ctx) as target:
        result = target.run(Job(["grep", "Cpus_allowed_list", "/proc/self/status"]))
        assert result.stdout.split() == ["Cpus_allowed_list:", str(cpu)]
        assert target.fingerprint()["cpu_placement"] == "cpuset"
    # runc's state directory is the module's target's until it is cleaned up.
    assert cgroups(launched) == [] and host_state() ^ before <= {str(RUNC_ROOT)}


def test_cleanup_leaves_nothing(target, before, launched):
    target_dir = target.dir
    target.run(Job(["true"]))
    target.cleanup()
    target.cleanup()
    assert not target_dir.exists()
    assert target.ctx.journal.entries == {}
    assert len(launched) > 5 and cgroups(launched) == []
    assert mounts_under(target_dir) == []
    assert gone(str(target_dir).encode())
    assert host_state() == before


CRASHING_VMTAX = """
import sys
from pathlib import Path
from vmtax.core import target as targets
from vmtax.host.journal import Journal
from vmtax.core.target import TargetContext
from vmtax.core.types import Job
base = Path(sys.argv[1])
ctx = TargetContext(base / "work", Journal(base / "journal"), binaries=("sysbench",))
target = targets.create("container:podman", "container", {"runtime": "podman"}, ctx)
target.prepare()
print("ready", flush=True)
target.run(Job(["sleep", "4714"]))
"""


def test_journal_recovers_a_killed_vmtax(tmp_path, before):
    """conmon keeps the container alive outside vmtax's process group: only the journal's
    `podman rm` can remove it."""
    (tmp_path / "journal").mkdir()
    vmtax = subprocess.Popen([sys.executable, "-c", CRASHING_VMTAX, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    assert vmtax.stdout.readline() == "ready\n"
    job = b"sleep\x004714\x00"
    deadline = time.monotonic() + 10
    while not running(job, exact=True) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running(job, exact=True)
    vmtax.kill()
    vmtax.wait()
    assert running(job, exact=True), "expected the container to outlive vmtax"
    entries = json.loads(next((tmp_path / "journal").glob("journal-*.json")).read_text())
    names = [Path(p).name for e in entries.values() if e["type"] == "rmdir" for p in e["paths"]]
    assert names
    assert journal.recover(tmp_path / "journal") == [
        f"undid 4 host change(s) left by vmtax process {vmtax.pid}"]
    assert gone(job)
    assert gone(str(tmp_path / "work").encode())
    assert list((tmp_path / "work").iterdir()) == []
    assert cgroups(names) == [] and mounts_under(tmp_path) == []
    # The runroot link and runc's state directory were journaled too: nothing is left.
    assert host_state() == before

