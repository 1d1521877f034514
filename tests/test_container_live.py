"""Live tests of the container target: real unshare, runc and crun containers (needs root)."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_for

from vmtax.core import target as targets
from vmtax.core.target import Job, TargetContext
from vmtax.helpers.runtime_cgroup import TargetCgroup
from vmtax.host import journal
from vmtax.host.journal import Journal

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(os.geteuid() != 0, reason="containers need root"),
]
RUNTIMES = ["unshare", "runc", "crun"]


def processes_with(marker: bytes) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


def gone(marker: bytes, within: float = 2.0) -> bool:
    """No process shows marker in its command line (SIGKILL takes effect asynchronously)."""
    return wait_for(lambda: not processes_with(marker), within)


def host_leftovers(target_dir: Path) -> list[str]:
    """Cgroup directories, runtime state and mounts of vmtax containers on the host."""
    found = [str(p) for p in Path("/sys/fs/cgroup").glob("*/vmtax-*")]
    found += [str(p) for d in ("/run/runc", "/run/crun") for p in Path(d).glob("vmtax-*")]
    # crun's cgroup workaround must stay inside its private mount namespace.
    found += [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if str(target_dir) in line or " /sys/fs/cgroup/unified " in line
              and " - tmpfs " in line]
    return found


@pytest.fixture(scope="module", params=RUNTIMES)
def target(request, tmp_path_factory):
    name = request.param
    if shutil.which(name) is None:
        pytest.skip(f"{name} is not installed")
    base = tmp_path_factory.mktemp(f"container-{name}")
    (base / "journal").mkdir()
    ctx = TargetContext(work_dir=base / "work", journal=Journal(base / "journal"),
                        binaries=("sysbench",))
    target = targets.create(f"container:{name}", "container", {"runtime": name}, ctx)
    target.prepare()
    yield target
    target.cleanup()


def test_sysbench_cpu(target):
    result = target.run(Job(["sysbench", "cpu", "--cpu-max-prime=2000", "--time=1", "run"],
                            timeout=30))
    assert result.ok, result.stderr
    assert re.search(r"events per second:\s+[0-9.]+", result.stdout)
    assert 0.9 < result.host_elapsed < 10 and result.guest_elapsed is None
    assert target.ctx.journal.entries.keys() == {target._dir_token, *target._cgroup_tokens}


def test_timeout_kills_the_whole_tree(target):
    marker = b"sleep\x004711"
    result = target.run(Job(["sh", "-c", "sleep 4711 & sleep 4711"], timeout=1))
    assert result.timed_out and result.exit_code is None and not result.ok
    assert 1 <= result.host_elapsed < 5
    assert gone(marker)
    assert target.alive()
    assert target.run(Job(["true"])).ok          # still usable afterwards


def test_fileio_writes_into_the_copy(target):
    result = target.run(Job(["sysbench", "fileio", "--file-total-size=16M", "prepare"],
                            in_scratch=True, timeout=60))
    assert result.ok, result.stderr
    work = target.dir / "rootfs" / "work"
    files = sorted(work.glob("test_file.*"))
    assert files and sum(f.stat().st_size for f in files) == 16 * 1024 * 1024
    # The copy is of the cached rootfs the fingerprint names: its record's key.
    cached = json.loads(Path(target.dir, "rootfs", ".complete").read_text())
    assert cached["key"] == target.fingerprint()["rootfs"]
    assert target.run(Job(["sysbench", "fileio", "--file-total-size=16M", "cleanup"],
                          in_scratch=True)).ok


def test_own_pid_and_network_namespaces(target):
    result = target.run(Job(["sh", "-c", "echo $$; ls /proc; cat /proc/net/dev"]))
    assert result.ok, result.stderr
    lines = result.stdout.split()
    pids = [int(w) for w in lines[1:] if w.isdigit()]
    assert lines[0] == "1" and 1 in pids and max(pids) < 50
    interfaces = {line.split(":")[0].strip() for line in result.stdout.splitlines()
                  if ":" in line and "|" not in line}
    assert interfaces == {"lo"}
    assert target.run(Job(["sh", "-c", "exit 3"])).exit_code == 3


def test_cleanup_leaves_nothing(target):
    target_dir = target.dir
    target.run(Job(["true"]))
    target.cleanup()
    target.cleanup()
    assert not target_dir.exists()
    assert target.ctx.journal.entries == {}
    assert host_leftovers(target_dir) == []
    assert gone(str(target_dir).encode())



CRASHING_VMTAX = """
import sys
from pathlib import Path
from vmtax.host import journal
from vmtax.core import target as targets
from vmtax.host.journal import Journal
from vmtax.core.target import Job, TargetContext
base = Path(sys.argv[2])
target = targets.create("container:" + sys.argv[1], "container", {"runtime": sys.argv[1]},
                        TargetContext(base / "work", Journal(base / "journal"),
                                      binaries=("sysbench",)))
target.prepare()
print("ready", flush=True)
target.run(Job(["sleep", "4713"]))
"""


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_journal_recovers_a_killed_vmtax(runtime, tmp_path):
    """The container is outside vmtax's process group: only the journal can delete it."""
    if shutil.which(runtime) is None:
        pytest.skip(f"{runtime} is not installed")
    (tmp_path / "journal").mkdir()
    vmtax = subprocess.Popen([sys.executable, "-c", CRASHING_VMTAX, runtime,
                              str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert vmtax.stdout.readline() == "ready\n"
    deadline = time.monotonic() + 10
    while not processes_with(b"sleep\x004713") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(b"sleep\x004713")
    vmtax.kill()
    vmtax.wait()
    assert processes_with(b"sleep\x004713"), "expected the container to outlive vmtax"
    # the copy, the container's delete and cgroups, and the target's cgroup where it has one
    changes = 3 + bool(TargetCgroup().dirs())
    assert journal.recover(tmp_path / "journal") == [
        f"undid {changes} host change(s) left by vmtax process {vmtax.pid}"]
    assert gone(b"sleep\x004713")
    assert list((tmp_path / "work").iterdir()) == []
    assert host_leftovers(tmp_path) == []


def test_auto_picks_runc_here(tmp_path):
    if shutil.which("runc") is None:
        pytest.skip("runc is not installed")
    (tmp_path / "journal").mkdir()
    ctx = TargetContext(work_dir=tmp_path / "work", journal=Journal(tmp_path / "journal"),
                        binaries=("sysbench",))
    with targets.create("container", "container", {}, ctx) as target:
        fp = target.fingerprint()
        assert target.run(Job(["true"])).ok
    assert fp["runtime"] == "runc" and fp["runtime_version"].startswith("runc version")
    assert ctx.journal.entries == {} and list(ctx.work_dir.iterdir()) == []
