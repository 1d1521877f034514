"""rsync: copy a tree of many small files and one large file into another directory of the
target's scratch disk (E3's rsync test).

A prepare job generates the data once per target (vmtax.workloads.macro_util, the same
bytes in every target); each repetition copies the tree and then the large file with
Debian's rsync (`-a`, a local copy: rsync's sender and receiver processes talk over a
pipe), each timed by the target's clock, and deletes the copies untimed.
"""

from __future__ import annotations

from vmtax import plugin
from vmtax.option_types import Size
from vmtax.types import Job, Metric, MetricSpec
from vmtax.workloads.base import Workload
from vmtax.workloads.macro_util import (MAKE_DATA, TIME_RESOLUTION, data_mib, data_prepare_job,
                                        data_prepare_seconds, programs, script_job, times)

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


class RsyncOptions(plugin.Options):
    size: Size = plugin.option("256M", "Size of the large file copied")
    files: int = plugin.option(20000, "Small files in the tree copied (256 B to 16 KiB, "
                               "4 KiB on average)", unit="files", ge=1, le=1000000)


class Rsync(Workload):
    name = "rsync"
    description = ("rsync of a tree of many small files and of one large file into another "
                   "directory of the scratch disk (seconds)")
    Options = RsyncOptions
    options: RsyncOptions
    binaries = ("rsync",)
    packages = ("rsync",)
    metrics = (
        MetricSpec("time", "s", False, "Seconds the copy took, by the target's clock",
                   group="disk I/O", primary=True, dimensions=("part",),
                   resolution=TIME_RESOLUTION),
    )

    def _mib(self) -> float:
        return data_mib(self.options.size, self.options.files)

    def _env(self) -> dict[str, str]:
        # Only the prepare job generates data: a guest's agent decodes every byte of a
        # job's environment before its clock starts, which the host's time would count.
        return programs("rsync")

    def run_seconds(self) -> float:
        return self._mib() / ESTIMATE_MIB_S

    def prepare_seconds(self) -> float:
        return data_prepare_seconds(self._mib(), self.options.files)

    def prepare_jobs(self) -> list[Job]:
        return [data_prepare_job(_PREPARE, self.options.size, self.options.files,
                                 self._env(), self.prepare_seconds())]

    def run_job(self) -> Job:
        return script_job(_RUN, env=self._env(), timeout=self._mib() / SLOWEST_MIB_S + 60)

    def cleanup_jobs(self) -> list[Job]:
        return [script_job("busybox rm -rf big seed tree copy\n", timeout=120)]

    def parse(self, stdout: str) -> list[Metric]:
        seconds = times(stdout, PARTS)
        return [self.metric("time", seconds[part], part=part) for part in PARTS]
