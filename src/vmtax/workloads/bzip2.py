"""bzip2: compress one large file and a tarred tree of many small files (E3's bzip2 test).

A prepare job generates the data once per target (vmtax.helpers.macro_data: text that
compresses like real text, the same bytes in every target): a file of `size` bytes and a
tree of `files` small files, which GNU tar packs into one archive with fixed names, order,
owners and times, so the archive too is byte-identical everywhere. Each repetition runs
Debian's bzip2 on both, timed by the target's clock; the page cache holds the inputs after
the prepare job, so what is measured is compression, CPU-bound.
"""

from __future__ import annotations

import re

from vmtax.core import plugin
from vmtax.core.errors import ParseError
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

INPUTS = ("file", "tree")
# Rates for estimates and timeouts: bzip2 -9 compressed 2-10 MiB/s natively on this
# (shared) host, and TCG is several times slower; a timeout allows 0.1 MiB/s.
ESTIMATE_MIB_S = 5.0
SLOWEST_MIB_S = 0.1

_PREPARE = MAKE_DATA + """
"$TAR_BIN" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf tree.tar tree
busybox rm -rf tree seed
"""
_RUN = """begin; "$BZIP2_BIN" -c -"$1" big > big.bz2; end file
begin; "$BZIP2_BIN" -c -"$1" tree.tar > tree.tar.bz2; end tree
for f in big tree.tar; do
    echo "vmtax-bytes $f $(busybox stat -c %s $f) $(busybox stat -c %s $f.bz2)"
done
busybox rm -f big.bz2 tree.tar.bz2
"""
_BYTES = re.compile(r"vmtax-bytes (big|tree\.tar) ([0-9]+) ([0-9]+)")


class Bzip2Options(DataOptions):
    size: Size = plugin.option("256M", "Size of the large file compressed")
    files: int = plugin.option(20000, "Small files in the tree (256 B to 16 KiB, 4 KiB on "
                               "average) tarred and compressed", unit="files", ge=1,
                               le=1000000)
    level: int = plugin.option(9, "bzip2's block size in 100 kB steps (-1 .. -9)", ge=1, le=9)


class Bzip2(DataWorkload):
    name = "bzip2"
    description = ("bzip2 compressing a large generated text file and a tarred tree of many "
                   "small files (seconds, MiB/s)")
    Options = Bzip2Options
    options: Bzip2Options
    prepare_script = _PREPARE
    estimate_mib_s = ESTIMATE_MIB_S
    slowest_mib_s = SLOWEST_MIB_S
    binaries = ("bzip2", "tar")
    packages = ("bzip2", "tar")
    metrics = (
        MetricSpec("time", "s", False, "Seconds to compress the input, by the target's "
                   "clock", group="CPU", primary=True, dimensions=("input",),
                   resolution=TIME_RESOLUTION),
        MetricSpec("throughput", "MiB/s", True, "Input bytes compressed per second",
                   group="CPU", dimensions=("input",)),
        MetricSpec("compression ratio", "x", True, "Input size over compressed size (the "
                   "same in every target: a check on the data)", secondary=True,
                   dimensions=("input",)),
    )

    def run_job(self) -> Job:
        return script_job(_RUN, self.options.level, env=self.tool_env(),
                          timeout=self.run_timeout())

    def cleanup_jobs(self) -> list[Job]:
        return [script_job("busybox rm -rf big seed tree tree.tar big.bz2 tree.tar.bz2\n",
                           timeout=120)]

    def parse(self, stdout: str) -> list[Metric]:
        seconds = times(stdout, INPUTS)
        sizes: dict[str, tuple[int, int]] = {}
        for line in stdout.splitlines():
            if m := _BYTES.fullmatch(line.strip()):
                sizes["file" if m[1] == "big" else "tree"] = (int(m[2]), int(m[3]))
        metrics: list[Metric] = []
        for name in INPUTS:
            if name not in sizes:
                raise ParseError(f"no sizes for the {name} input in the output")
            raw, packed = sizes[name]
            if raw <= 0 or packed <= 0:
                raise ParseError(f"the {name} input or its compressed form is empty")
            metrics += [self.metric("time", seconds[name], input=name),
                        self.metric("throughput", raw / 2**20 / seconds[name], input=name),
                        self.metric("compression ratio", raw / packed, input=name)]
        return metrics
