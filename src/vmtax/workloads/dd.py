"""dd: copy one large file on the target's scratch disk, through the page cache and with
O_DIRECT.

E3's dd test. A prepare job writes the source file once (zeros: dd copies bytes, their
values do not matter); each repetition copies it twice with GNU dd from Debian, first
buffered (the copy ends when the target's page cache has the data, as a user's plain `dd`
does) and then with `oflag=direct`, which writes through to the target's disk. A guest
whose disk is a host file can "beat" the physical machine on the buffered copy alone; the
direct copy is what tells a host page-cache effect from a faster disk.

The parser reads GNU dd's summary ("N bytes (...) copied, S s, R MB/s"), recomputing the
rate from bytes and seconds rather than taking dd's rounded one.
"""

from __future__ import annotations

import re
from typing import Sequence

from vmtax.core import plugin
from vmtax.core.errors import ParseError
from vmtax.core.option_types import Size
from vmtax.core.types import Job, Metric, MetricSpec
from vmtax.core.workload import Outcome, Workload
from vmtax.helpers.macro_data import programs, script_job, size_bytes

MODES = ("buffered", "direct")
# For estimates: both copies at this rate (this host's buffered copies: 300-400 MB/s).
ESTIMATE_MIB_S = 200.0
# A disk slower than 1 MiB/s is broken, not slow: the bound for prepare and run timeouts.
SLOWEST_MIB_S = 1.0
# GNU dd prints its summary in the C locale's format only under LC_ALL=C.
LOCALE = {"LC_ALL": "C"}

_PREPARE = """"$DD_BIN" if=/dev/zero of=dd.src bs="$1" count="$2" conv=fsync status=none
"""
_RUN = """for mode in buffered direct; do
    # notrunc changes nothing here (dd.dst is new): it fills the flag's place.
    case $mode in buffered) flag=conv=notrunc ;; *) flag=oflag=direct ;; esac
    echo "vmtax-mode $mode"
    "$DD_BIN" if=dd.src of=dd.dst bs="$1" "$flag" 2>&1
    busybox rm -f dd.dst
done
"""
_MODE = re.compile(r"vmtax-mode (\S+)")
_SUMMARY = re.compile(r"([0-9]+) bytes (?:\(.*\) )?copied, ([0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)"
                      r" s, .*")


class DdOptions(plugin.Options):
    size: Size = plugin.option("1G", "Size of the file copied")
    block_size: Size = plugin.option("1M", "Bytes dd reads and writes at a time (bs)")

    def problems(self) -> list[tuple[str, str]]:
        if size_bytes(self.size) % size_bytes(self.block_size):
            return [("size", f"a multiple of block_size ({self.block_size})")]
        return []


class Dd(Workload):
    name = "dd"
    description = ("dd copy of a large file on the scratch disk, buffered and with "
                   "oflag=direct (MB/s)")
    Options = DdOptions
    options: DdOptions
    binaries = ("dd",)
    packages = ("coreutils",)
    metrics = (
        MetricSpec("throughput", "MB/s", True, "Bytes copied per second (10^6 bytes), by "
                   "dd's own clock", group="disk I/O", primary=True, dimensions=("mode",)),
    )

    def _mib(self) -> float:
        return size_bytes(self.options.size) / 2**20

    def _args(self) -> tuple[str, int]:
        bs = size_bytes(self.options.block_size)
        return str(bs), size_bytes(self.options.size) // bs

    def _env(self) -> dict[str, str]:
        return {**LOCALE, **programs("dd")}

    def run_seconds(self) -> float:
        return 2 * self._mib() / ESTIMATE_MIB_S

    def prepare_seconds(self) -> float:
        return self._mib() / 150

    def prepare_jobs(self) -> list[Job]:
        bs, count = self._args()
        return [script_job(_PREPARE, bs, count, env=self._env(),
                           timeout=self._mib() / SLOWEST_MIB_S + 60)]

    def run_job(self) -> Job:
        bs, _ = self._args()
        return script_job(_RUN, bs, env=self._env(),
                          timeout=2 * self._mib() / SLOWEST_MIB_S + 60)

    def cleanup_jobs(self) -> list[Job]:
        return [script_job("busybox rm -f dd.src dd.dst\n", timeout=60)]

    def parse(self, stdout: str) -> list[Metric]:
        expected = size_bytes(self.options.size)
        found: dict[str, Metric] = {}
        mode = None
        for line in stdout.splitlines():
            line = line.strip()
            if m := _MODE.fullmatch(line):
                mode = m[1]
                if mode not in MODES or mode in found:
                    raise ParseError(f"unexpected copy {mode!r} in dd's output")
            elif m := _SUMMARY.fullmatch(line):
                if mode is None or mode in found:
                    raise ParseError("a dd summary outside a copy")
                copied, seconds = int(m[1]), float(m[2])
                if copied != expected:
                    raise ParseError(f"dd {mode} copied {copied} bytes, expected {expected}")
                if seconds <= 0:
                    raise ParseError(f"dd {mode} took {m[2]} s: too short to time")
                found[mode] = self.metric("throughput", copied / seconds / 1e6, mode=mode)
        missing = [m for m in MODES if m not in found]
        if missing:
            raise ParseError(f"no dd summary for the {', '.join(missing)} copy")
        return [found[m] for m in MODES]

    @classmethod
    def explain_win(cls, win: Outcome, others: Sequence[Outcome], baseline: str) -> str | None:
        """A buffered copy beating the bare host: the host's page cache when the direct copy
        does not win, else a host that caches even direct writes (or a faster disk). A
        direct copy's win is left to the generic explanation of disk I/O."""
        if win.dimensions.get("mode") != "buffered":
            return None
        direct = next((o for o in others if o.metric == "throughput"
                       and o.dimensions.get("mode") == "direct"), None)
        if direct is not None and direct.ratio is not None and not direct.beats_baseline:
            return (f"host page cache: the buffered copy beats {baseline} but the "
                    f"oflag=direct copy does not (×{direct.ratio:.3g}); the target's disk is "
                    "a host file, and its buffered writes end in the host's memory")
        return ("its O_DIRECT copy wins too: the host caches the target's disk even for "
                "direct writes (a VM disk without cache=none), or the disk is faster")
