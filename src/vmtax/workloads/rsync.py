"""rsync: copy a tree of many small files and one large file into another directory of the
target's scratch disk (E3's rsync test).

A prepare job generates the data once per target (vmtax.helpers.macro_data, the same
bytes in every target); each repetition copies the tree and then the large file with
Debian's rsync (`-a`, a local copy: rsync's sender and receiver processes talk over a
pipe), each timed by the target's clock, and deletes the copies untimed.
"""

from __future__ import annotations

from vmtax.core import plugin
from vmtax.core.option_types import Size
from vmtax.core.types import Job, Metric, MetricSpec
from vmtax.helpers.macro_data import (
    MAKE_DATA,
    TIME_RESOLUTION,
    DataOptions,
    DataWorkload,
    script_job,
    times,
)

PARTS = ("tree", "file")
# For estimates and timeouts: a local rsync of the tree moved 2-20 MiB/s on this (shared)
# host, of the file far more; a timeout allows 0.5 MiB/s.
ESTIMATE_MIB_S = 10.0
SLOWEST_MIB_S = 0.5

_PREPARE = MAKE_DATA + "busybox rm -f seed\n"
_RUN = """busybox rm -rf copy
busybox mkdir copy
begin; "$RSYNC_BIN" -a tree copy/; end tree
begin; "$RSYNC_BIN" -a big copy/; end file
busybox rm -rf copy
"""


class RsyncOptions(DataOptions):
    size: Size = plugin.option("256M", "Size of the large file copied")
    files: int = plugin.option(20000, "Small files in the tree copied (256 B to 16 KiB, "
                               "4 KiB on average)", unit="files", ge=1, le=1000000)


class Rsync(DataWorkload):
    name = "rsync"
    description = ("rsync of a tree of many small files and of one large file into another "
                   "directory of the scratch disk (seconds)")
    Options = RsyncOptions
    options: RsyncOptions
    prepare_script = _PREPARE
    estimate_mib_s = ESTIMATE_MIB_S
    slowest_mib_s = SLOWEST_MIB_S
    binaries = ("rsync",)
    packages = ("rsync",)
    metrics = (
        MetricSpec("time", "s", False, "Seconds the copy took, by the target's clock",
                   group="disk I/O", primary=True, dimensions=("part",),
                   resolution=TIME_RESOLUTION),
    )

    def run_job(self) -> Job:
        return script_job(_RUN, env=self.tool_env(), timeout=self.run_timeout())

    def cleanup_jobs(self) -> list[Job]:
        return [script_job("busybox rm -rf big seed tree copy\n", timeout=120)]

    def parse(self, stdout: str) -> list[Metric]:
        seconds = times(stdout, PARTS)
        return [self.metric("time", seconds[part], part=part) for part in PARTS]
