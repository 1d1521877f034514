"""kill -9 of `vmtax run` with a container payload running: within 5 seconds, and without
vmtax started again, the guardian has left nothing of that run (issue 16). Only what this
run made is looked at: other tests may run containers at the same time."""

import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from conftest import start_vmtax

from vmtax.host import machine as host

# The process table as make torture reads it (scripts/torture_kit/host.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from torture_kit.host import descendants, processes  # noqa: E402

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(os.geteuid() != 0, reason="OCI runtimes need root here"),
]


def alive(found: dict[tuple[int, int], str]) -> list[str]:
    table = processes()
    return [cmd for (pid, start), cmd in found.items()
            if pid in table and table[pid][1] == start]


def guardian_of(pid: int) -> list[int]:
    return [p for p, (_, _, cmd) in processes().items()
            if "vmtax.host.guardian" in cmd and f"journal-{pid}-" in cmd]


def cgroups(containers: list[str]) -> list[Path]:
    return [Path(root) / name for root, _ in host.cgroup_mounts() for name in containers
            if (Path(root) / name).exists()]


def mounts(results: Path) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if str(results) in line]


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_kill_9_mid_container_run_leaves_nothing_within_5_s(tmp_path, runtime):
    if shutil.which(runtime) is None:
        pytest.skip(f"{runtime} is not installed")
    results = tmp_path / "results"
    started = time.monotonic()
    vmtax = start_vmtax("run", "--targets", f"container:{runtime}", "--workloads", "cpu",
                        "--runs", "1", "--time", "30", "--results", str(results))
    try:
        deadline = started + 60
        while not any(cmd.startswith("sysbench") for cmd in descendants(vmtax.pid).values()):
            assert vmtax.poll() is None, vmtax.communicate()
            assert time.monotonic() < deadline, "sysbench did not start in a container"
            time.sleep(0.1)
        time.sleep(max(0.0, started + 6 - time.monotonic()))
        # The guardian is a child of vmtax too, until it is orphaned.
        payload = {k: cmd for k, cmd in descendants(vmtax.pid).items()
                   if "vmtax.host.guardian" not in cmd}
        containers = [p.name for p in results.glob(".work-*/container-*/state/vmtax-*")]
        assert containers
        made = cgroups(containers)
        vmtax.kill()
        killed = time.monotonic()
        vmtax.wait()
    finally:
        if vmtax.poll() is None:
            vmtax.kill()
    while (alive(payload) or cgroups(containers) or mounts(results) or guardian_of(vmtax.pid)
           or list(Path(os.environ["VMTAX_RUNTIME"]).glob("journal-*"))):
        assert time.monotonic() - killed < 5, (alive(payload), cgroups(containers))
        time.sleep(0.05)
    clean = time.monotonic() - killed
    print(f"{runtime}: {len(made)} cgroups, clean {clean:.2f} s after kill -9")
    assert not list(results.glob(".work-*"))
