"""The minimal guest kernel for real: built from Debian's linux-source (minutes, once: the
result is cached in vmtax's cache by the content hash of source and configuration), then
booted under TCG, where it needs no module to reach the agent, mount the scratch disk and
run a job; its boot is timed against Debian's kernel."""

import glob
import statistics

import pytest

from vmtax.core import paths
from vmtax.core import target as targets
from vmtax.core.target import TargetContext
from vmtax.core.types import Job
from vmtax.guest import minimal_kernel
from vmtax.host.journal import Journal

pytestmark = pytest.mark.live

GUEST = {"accel": "tcg", "vcpus": 1, "memory": "256M", "disk_size": "64M"}


def boot_times(ctx, kernel, count):
    times = []
    for _ in range(count):
        target = targets.create("vm:tcg", "vm", {**GUEST, **kernel}, ctx)
        try:
            target.prepare()
            times.append(target.guest.boot_seconds)
            result = target.run(Job(["/bin/sh", "-c", "uname -r; ls /vmtax/modules; "
                                     "mount | grep -c ' /work '"], timeout=30))
            assert result.ok, result.stderr
        finally:
            target.cleanup()
    return times, result.stdout.split()


@pytest.mark.skipif(not glob.glob(minimal_kernel.SOURCE_GLOB),
                    reason="Debian's linux-source is not installed (make deps installs it)")
def test_the_minimal_kernel_builds_and_boots_without_modules(tmp_path):
    kernel = minimal_kernel.minimal_kernel(paths.cache_dir())   # cached after the first
    assert kernel.modules == {} and kernel.path.stat().st_size < 40 << 20
    for sub in ("journal", "work"):
        (tmp_path / sub).mkdir()
    ctx = TargetContext(work_dir=tmp_path / "work", journal=Journal(tmp_path / "journal"))
    minimal, shown = boot_times(ctx, {"kernel": str(kernel.path)}, 2)
    # The guest runs the kernel built here, loaded no module, and mounted its scratch disk.
    assert shown == [kernel.version, "1"]
    debian, _ = boot_times(ctx, {}, 2)
    assert ctx.journal.entries == {}
    print(f"TCG boot to agent READY, median of 2: minimal {statistics.median(minimal):.2f} s, "
          f"Debian's {statistics.median(debian):.2f} s")
