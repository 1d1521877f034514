"""fio on the target's scratch disk: random and sequential I/O, read from fio's JSON report.

One fio invocation runs the chosen jobs one after another (`--stonewall`, no job file):
random read and write in small blocks at a queue depth, sequential read and write in large
blocks. A prepare job lays the files out once (`--create_only`), so repetitions do not
rewrite them; `--overwrite=1` fills the write jobs' files too, so every repetition writes
over allocated blocks instead of converting ext4's unwritten extents in the first one. The
cleanup job deletes the files with fio itself (targets may carry no `rm`).

The parser reads fio 3.x JSON (Debian 12: 3.33): completion latency in `clat_ns`, and
`bw_bytes` (fio 3.2+; 3.0 and 3.1 give only `bw` in KiB/s). fio may print lines such as
"note: ..." or "fio: pid=..., err=22/..." on stdout before the report, so the report is
the first line-leading JSON object that has `jobs`.
"""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence, get_args

from pydantic import AfterValidator

from vmtax.core import plugin
from vmtax.core.errors import ParseError
from vmtax.core.option_types import Size
from vmtax.core.types import Job, Metric, MetricSpec
from vmtax.core.workload import Outcome, Workload

FioJob = Literal["randread", "randwrite", "read", "write"]
IoEngine = Literal["libaio", "io_uring", "psync", "sync"]
JOBS: tuple[str, ...] = get_args(FioJob)
# Which side of fio's per-job report holds each job's numbers.
DIRECTION = {"randread": "read", "randwrite": "write", "read": "read", "write": "write"}
# Engines that keep several I/Os in flight; fio caps the others at one (and says so).
ASYNC_ENGINES = ("libaio", "io_uring")
PERCENTILES = ("50", "99", "99.9")
# Rate at which the prepare job writes the files, for plan estimates.
PREPARE_MIB_S = 150.0
CLEANUP_TIMEOUT = 120.0

_SIZE_SHIFT = {"K": 10, "M": 20, "G": 30, "T": 40}
_REPORT_START = re.compile(r"^\{", re.MULTILINE)


def _bytes(size: str) -> int:
    """A checked Size ("256M"; fio reads K, M, G, T as powers of 1024) in bytes."""
    return int(size[:-1]) << _SIZE_SHIFT[size[-1].upper()]


def _distinct(jobs: list[str]) -> list[str]:
    if len(set(jobs)) != len(jobs):
        raise ValueError("a job is named twice")
    return jobs


Jobs = Annotated[list[FioJob], AfterValidator(_distinct),
                 plugin.Expect('a non-empty list of distinct jobs from "randread", '
                               '"randwrite", "read", "write"')]


class FioOptions(plugin.Options):
    jobs: Jobs = plugin.option(list(JOBS), "Jobs to run, one after another", min_length=1)
    size: Size = plugin.option("256M", "File size of each job (each of its numjobs clones "
                               "has its own file)")
    runtime: int = plugin.option(10, "Seconds each job runs, looping over its file; the "
                                 "plan's time fills it", unit="s", ge=1)
    iodepth: int = plugin.option(32, "I/Os in flight per job (libaio and io_uring; psync "
                                 "and sync do one at a time)", unit="I/Os", ge=1, le=1024)
    ioengine: IoEngine = plugin.option("libaio", "How fio issues I/O")
    direct: bool = plugin.option(True, "O_DIRECT: bypass the target's page cache (libaio "
                                 "without it completes each I/O before submitting the next)")
    block_size_random: Size = plugin.option("4K", "Block size of randread and randwrite")
    block_size_seq: Size = plugin.option("1M", "Block size of read and write")
    numjobs: int = plugin.option(1, "Clones of each job running at once, reported together",
                                 unit="processes", ge=1)

    def problems(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        for key, random in (("block_size_random", True), ("block_size_seq", False)):
            used = any(job.startswith("rand") == random for job in self.jobs)
            if used and _bytes(getattr(self, key)) > _bytes(self.size):
                found.append((key, f"a block size no larger than size ({self.size})"))
        return found


@functools.cache
def _host_engines() -> frozenset[str]:
    """I/O engines the host's fio has (targets run the host's binary)."""
    if shutil.which("fio") is None:
        return frozenset()
    done = subprocess.run(["fio", "--enghelp"], capture_output=True, text=True, timeout=30)
    return frozenset(re.findall(r"^\s+(\S+)$", done.stdout, re.MULTILINE))


def _report(stdout: str) -> dict[str, Any]:
    """fio's JSON report, after whatever notes fio printed before it."""
    decoder = json.JSONDecoder()
    problem = "no JSON report in fio's output"
    for start in _REPORT_START.finditer(stdout):
        try:
            report, _ = decoder.raw_decode(stdout, start.start())
        except (ValueError, RecursionError) as exc:
            problem = f"fio's JSON report is cut off or garbled: {exc}"
            continue
        if isinstance(report, dict) and "jobs" in report:
            return report
    raise ParseError(problem)


def _field(obj: Any, key: str, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise ParseError(f"{where}: fio's report has no {key!r}")
    return obj[key]


def _number(obj: Any, key: str, where: str) -> float:
    value = _field(obj, key, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise ParseError(f"{where}: {key} is {value!r}, not a finite number >= 0")
    return float(value)


class Fio(Workload):
    name = "fio"
    description = ("fio on the scratch disk: 4 KiB random read/write at queue depth 32 and "
                   "1 MiB sequential read/write, with O_DIRECT.")
    Options = FioOptions
    binaries = ("fio",)
    packages = ("fio",)
    time_option = "runtime"
    metrics = (
        MetricSpec("IOPS", "ops/s", True, "I/O operations completed per second",
                   group="disk I/O", primary=True, dimensions=("job",)),
        MetricSpec("bandwidth", "MiB/s", True, "Data moved per second", group="disk I/O",
                   dimensions=("job",)),
        MetricSpec("completion latency", "µs", False, "Percentile of the time from "
                   "submitting one I/O to its completion", group="latency",
                   dimensions=("job", "percentile")),
        MetricSpec("mean completion latency", "µs", False, "Mean time from submitting one "
                   "I/O to its completion", group="latency", dimensions=("job",)),
    )
    options: FioOptions

    def _file_mib(self) -> float:
        o = self.options
        return _bytes(o.size) * o.numjobs * len(o.jobs) / 2**20

    def _argv(self, *extra: str) -> list[str]:
        """fio with global options (before the first --name), `extra`, then one section
        per job. Prepare, run and cleanup share it, so they name the same files."""
        o = self.options
        argv = ["fio", "--output-format=json", "--eta=never", "--group_reporting",
                f"--percentile_list={':'.join(PERCENTILES)}", f"--size={o.size}",
                f"--ioengine={o.ioengine}"]
        if o.ioengine in ASYNC_ENGINES:
            argv.append(f"--iodepth={o.iodepth}")
        argv += [f"--direct={int(o.direct)}", f"--numjobs={o.numjobs}", "--overwrite=1",
                 *extra]
        for job in o.jobs:
            bs = o.block_size_random if job.startswith("rand") else o.block_size_seq
            argv += [f"--name={job}", "--stonewall", f"--rw={job}", f"--bs={bs}"]
        return argv

    def run_seconds(self) -> float:
        return float(self.options.runtime * len(self.options.jobs))

    def prepare_seconds(self) -> float:
        return self._file_mib() / PREPARE_MIB_S

    def prepare_jobs(self) -> list[Job]:
        # Bounded by the disk, not the runtime: allow 1 MiB/s.
        return [Job(self._argv("--create_only=1"), timeout=self._file_mib() + 60,
                    in_scratch=True)]

    def run_job(self) -> Job:
        # Three times the run plus a minute covers start-up and fio's own file checks
        # under TCG without letting a hung guest hold the plan up for long.
        return Job(self._argv(f"--runtime={self.options.runtime}", "--time_based"),
                   timeout=self.run_seconds() * 3 + 60, in_scratch=True)

    def cleanup_jobs(self) -> list[Job]:
        # allow_file_create=0: files already gone are not laid out just to be deleted.
        return [Job(self._argv("--create_only=1", "--unlink=1", "--allow_file_create=0"),
                    timeout=CLEANUP_TIMEOUT, in_scratch=True)]

    def host_problems(self) -> list[tuple[str, str]]:
        engine = self.options.ioengine
        engines = _host_engines()
        if engines and engine not in engines:
            usable = sorted(engines & set(get_args(IoEngine)))
            return [("ioengine", f"an engine the host's fio has ({', '.join(usable)})")]
        disabled = Path("/proc/sys/kernel/io_uring_disabled")
        if engine == "io_uring" and disabled.exists() and disabled.read_text().strip() == "2":
            return [("ioengine", "an engine the host's kernel allows (io_uring is switched "
                                 "off: kernel.io_uring_disabled = 2)")]
        return []

    @classmethod
    def explain_win(cls, win: Outcome, others: Sequence[Outcome], baseline: str) -> str | None:
        """A read beating the bare host although fio asks for O_DIRECT: the target serves
        it from the host's page cache. gVisor's sentry bypasses its own cache for an
        O_DIRECT read, but reads through a host file descriptor its gofer opened without
        O_DIRECT (it passes on only the access mode and O_TRUNC), so the read comes from
        the host's page cache (google/gvisor#7506: fio --direct=1 at memory speed in runsc,
        at disk speed in runc); a VM disk that is a host file opened without cache=none is
        read through the host's page cache too. The files are laid out once, by the
        prepare job, and read again in every repetition, so they are cached by then. A
        write's win is left to the generic explanation of disk I/O."""
        job = win.dimensions.get("job", "")
        if "read" not in job:
            return None
        # Writes that do not win show the disk itself is no faster.
        writes = [f"{o.dimensions.get('job')} ×{o.ratio:.3g}" for o in others
                  if o.metric == win.metric and o.ratio is not None
                  and "write" in o.dimensions.get("job", "") and not o.beats_baseline]
        return ("likely the host's page cache: O_DIRECT stops at the target, which reads "
                "its file through the host's cache (gVisor's gofer opens host files "
                "without O_DIRECT, google/gvisor#7506; so does a VM disk without "
                "cache=none), and the files, laid out once, are read again every repetition"
                + (f"; its writes do not win ({', '.join(writes)})" if writes else ""))

    def parse(self, stdout: str) -> list[Metric]:
        entries = _field(_report(stdout), "jobs", "report")
        if not isinstance(entries, list):
            raise ParseError("fio's report: jobs is not a list")
        by_name: dict[str, Any] = {}
        for entry in entries:
            name = _field(entry, "jobname", "job")
            if not isinstance(name, str):
                raise ParseError(f"fio's report: jobname {name!r} is not a string")
            if name in by_name:
                raise ParseError(f"fio reported job {name!r} twice")
            by_name[name] = entry
        if set(by_name) != set(self.options.jobs):
            raise ParseError(f"fio reported jobs {sorted(by_name)}, expected "
                             f"{sorted(self.options.jobs)}")
        return [m for job in self.options.jobs for m in self._job_metrics(job, by_name[job])]

    def _job_metrics(self, job: str, entry: Any) -> list[Metric]:
        error = _field(entry, "error", job)
        if type(error) is not int or error != 0:
            raise ParseError(f"{job}: {self._error_text(error)}")
        side = _field(entry, DIRECTION[job], job)
        where = f"{job} {DIRECTION[job]}"
        iops = _number(side, "iops", where)
        if iops <= 0:
            raise ParseError(f"{where}: fio completed no I/O")
        if "bw_bytes" in side:
            bandwidth = _number(side, "bw_bytes", where) / 2**20
        else:
            bandwidth = _number(side, "bw", where) / 2**10
        clat = _field(side, "clat_ns", where)
        metrics = [self.metric("IOPS", iops, job=job),
                   self.metric("bandwidth", bandwidth, job=job),
                   self.metric("mean completion latency",
                               _number(clat, "mean", f"{where} clat_ns") / 1000, job=job)]
        percentiles = _field(clat, "percentile", f"{where} clat_ns")
        if not isinstance(percentiles, dict):
            raise ParseError(f"{where}: clat_ns percentile is not an object")
        try:
            by_value = {float(key): key for key in percentiles}
        except ValueError:
            raise ParseError(f"{where}: clat_ns percentiles have a key that is not a "
                             "number") from None
        for pct in PERCENTILES:
            key = by_value.get(float(pct))
            if key is None:
                raise ParseError(f"{where}: no {pct}th percentile of completion latency")
            value = _number(percentiles, key, f"{where} clat_ns percentile")
            metrics.append(self.metric("completion latency", value / 1000, job=job,
                                       percentile=pct))
        return metrics

    def _error_text(self, error: Any) -> str:
        if type(error) is not int or not 0 < error < 4096:
            return f"fio reported error {error!r}"
        text = f"fio failed with error {error} ({os.strerror(error)})"
        if error == errno.EINVAL and self.options.direct:
            text += ("; the scratch file system may not support direct=1 (O_DIRECT; tmpfs "
                     "before Linux 6.6, ramfs): set direct = false")
        return text
