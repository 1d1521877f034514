"""E1's five sysbench workloads (cpu, threads, memory, fileio, mutex) and their parsers.

Every workload parameter is a sysbench option and becomes `--key=value` in sorted order,
so a plan can sweep any of them and equal parameters always give the same command line.

The parsers read the end-of-run report every test prints (vmtax.helpers.sysbench_report
says which releases and spellings) and each test's own lines, matched alike; memory's
older "Operations performed: N (X ops/sec)" and "MB transferred (X MB/sec)" lines are
accepted too.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator

from vmtax.core import plugin
from vmtax.core.errors import ParseError
from vmtax.core.types import Job, Metric, MetricSpec
from vmtax.core.workload import Workload
from vmtax.helpers.sysbench_report import (
    LATENCY_RESOLUTION,
    Report,
    find,
    hugetlb_pages,
    number,
    stripped_lines,
)

# sysbench's own --time default, in force when a plan sets no time.
SYSBENCH_DEFAULT_TIME = 10
# mutex runs to completion: E1's parameters take ~0.06 s natively and a few seconds under
# TCG, so ten minutes leaves room for sweeps that raise mutex-locks or mutex-loops a lot.
MUTEX_TIMEOUT = 600.0
# What a mutex run costs, measured here (2 cores, sysbench 1.0.20, 4 threads): one empty
# loop ~0.8 ns, one lock about as long as 50 loops; for estimates and derived timeouts.
MUTEX_LOOP_SECONDS = 0.8e-9
MUTEX_LOCK_LOOPS = 50
# fileio cleanup only unlinks the test files.
CLEANUP_TIMEOUT = 120.0
# Rate at which fileio's prepare step writes its files, for plan estimates (90-280 here).
PREPARE_MIB_S = 150.0
# memory's default data volume: beyond what any --time moves, so that time bounds the run
# (E1's fixed 1 GiB lasts ~50 ms natively here, too short to time). 1 TiB takes ~2 min at
# 8 GiB/s; at 8 KiB blocks it is 2^27 operations, well inside the int sysbench counts
# them in (a much larger total could wrap it and print a wrong ops/s).
MEMORY_TOTAL_SIZE = "1T"

_SIZE = re.compile(r"([0-9]+)([bkmgt]?)", re.IGNORECASE)
_SIZE_SHIFT = {"": 0, "b": 0, "k": 10, "m": 20, "g": 30, "t": 40}

# Each test's own report lines, matched against each stripped line as a whole.
_CPU_EPS = re.compile(r"events per second:\s+(\S+)")
_MEM_OPS = re.compile(r"(?:Total operations|Operations performed):\s+(\S+)\s+"
                      r"\(\s*(\S+)\s+(?:per second|ops/sec)\)")
# sysbench before 1.0 printed "MB" for 2^20 bytes (20G total -> "20480.00 MB transferred").
_MEM_TRANSFER = re.compile(r"(\S+)\s+Mi?B transferred\s+\(\s*(\S+)\s+Mi?B/sec\)")
_FILE_RATES = {name: re.compile(rf"{re.escape(label)}:\s+(\S+)") for name, label in (
    ("reads/s", "reads/s"), ("writes/s", "writes/s"), ("fsyncs/s", "fsyncs/s"),
    ("read MiB/s", "read, MiB/s"), ("written MiB/s", "written, MiB/s"))}
_PREPARE = re.compile(r"(\S+) bytes written in (\S+) seconds \((\S+) MiB/sec\)\.")
_PREPARE_NOTHING = re.compile(r"No bytes written\.")

# Which of reads/s and writes/s a fileio mode must move; the others may rightly be 0.
_FILE_MODE_RATES = {"seqwr": ("writes/s",), "seqrewr": ("writes/s",), "rndwr": ("writes/s",),
                    "seqrd": ("reads/s",), "rndrd": ("reads/s",),
                    "rndrw": ("reads/s", "writes/s")}


def _positive(value: float, name: str) -> float:
    if value <= 0:
        raise ParseError(f"{name} is {value:g}: the run measured no throughput")
    return value


def _arg(key: str, value: Any) -> str:
    if isinstance(value, bool):
        text = "on" if value else "off"
    elif isinstance(value, float) and value.is_integer():
        text = str(int(value))
    else:
        text = str(value)
    return f"--{key}={text}"


def _bytes(value: str) -> int:
    """A sysbench SIZE option ("2G", "512m", "1048576") in bytes."""
    m = _SIZE.fullmatch(value.strip())
    if m is None:
        raise ValueError(f"{value!r} is not a size")
    return int(m[1]) << _SIZE_SHIFT[m[2].lower()]


@functools.cache
def _host_options(test: str) -> frozenset[str]:
    """Options the host's sysbench lists for a test (targets run the host's binary)."""
    if shutil.which("sysbench") is None:
        return frozenset()
    done = subprocess.run(["sysbench", test, "help"], capture_output=True, text=True,
                          timeout=30)
    return frozenset(re.findall(r"^\s+--([a-z][a-z0-9-]*)", done.stdout, re.MULTILINE))


# -- options -------------------------------------------------------------------------------

def _on_off(value: Any) -> Any:
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


def _size_text(value: Any) -> Any:
    # sysbench takes a byte count or a number with a unit suffix.
    if type(value) is int and value >= 0:
        return str(value)
    if isinstance(value, str) and _SIZE.fullmatch(value):
        return value
    raise ValueError("not a size")


OnOff = Annotated[Literal["on", "off"], BeforeValidator(_on_off),
                  plugin.Expect('"on", "off", true or false')]
SysbenchSize = Annotated[str, BeforeValidator(_size_text),
                         plugin.Expect('a size like "8K" or "1G", or a number of bytes')]


def _option(default: Any, doc: str, key: str, **kw: Any) -> Any:
    return plugin.option(default, doc, alias=key, **kw)


class SysbenchOptions(plugin.Options):
    """sysbench's general options, shared by every test (`sysbench --help`)."""
    threads: int | None = plugin.option(None, "Worker threads (sysbench's default: 1)",
                                        unit="threads", ge=1)
    time: int | None = plugin.option(None, "Stop after this long (sysbench --time); the "
                                     "plan's time fills it", unit="s", ge=1)
    events: int | None = plugin.option(None, "Stop after this many events (0: no limit)",
                                       unit="events", ge=0)
    rate: int | None = plugin.option(None, "Average transaction rate (0: unlimited)",
                                     unit="events/s", ge=0)
    # Only the 95th: the manifest's "latency p95"; 0 turns the percentile off.
    percentile: Literal[0, 95] | None = plugin.option(None, "Latency percentile to report "
                                                      "(0: none)")
    rand_type: Literal["uniform", "gaussian", "special", "pareto"] | None = _option(
        None, "Random numbers distribution", "rand-type")
    rand_seed: int | None = _option(None, "Seed of the random number generator (0: time)",
                                    "rand-seed", ge=0)
    thread_stack_size: SysbenchSize | None = _option(None, "Stack size of each thread",
                                                     "thread-stack-size")


class _Sysbench(Workload):
    binaries = ("sysbench",)
    packages = ("sysbench",)
    time_option: ClassVar[str | None] = "time"
    # Each test's options narrow some general ones (threads: int, not int | None).
    Options: ClassVar[type[SysbenchOptions]] = SysbenchOptions
    # Metrics every test reports; each test adds its throughput metrics in front.
    common_metrics = (
        MetricSpec("total events", "events", True, "Events completed", secondary=True),
        MetricSpec("total time", "s", False, "Wall time sysbench reports", secondary=True),
        # Latencies are printed in 0.01 ms steps (a 4 µs event is "0.00"); the minimum is
        # mostly rounding, so kept out of the verdicts.
        MetricSpec("latency min", "ms", False, "Fastest event",
                   resolution=LATENCY_RESOLUTION),
        MetricSpec("latency avg", "ms", False, "Mean event latency", group="latency",
                   resolution=LATENCY_RESOLUTION),
        MetricSpec("latency max", "ms", False, "Slowest event: the clearest sign of "
                   "preemption by the host", group="latency", resolution=LATENCY_RESOLUTION),
        MetricSpec("latency p95", "ms", False, "95th percentile of event latency",
                   group="latency", resolution=LATENCY_RESOLUTION),
        # Both stddevs are printed with two decimals ("1004323.0000/0.00").
        MetricSpec("fairness events stddev", "events", False, "Spread of events per thread",
                   secondary=True, spread=True, resolution=0.01),
        MetricSpec("fairness time stddev", "s", False, "Spread of run time per thread",
                   secondary=True, spread=True, resolution=0.01),
    )

    def _argv(self, options: dict[str, Any], command: str) -> list[str]:
        return ["sysbench", self.name, *(_arg(k, options[k]) for k in sorted(options)), command]

    def _run_timeout(self) -> float:
        # sysbench stops starting events at --time, then waits for the events in flight
        # (500 threads yielding, fileio's final fsync of every file) and exits; under TCG
        # start-up and that tail take seconds. Three times the run plus a minute covers
        # both without letting a hung guest hold the plan up for long.
        time = self.params.get("time")
        if time is None and self.time_option is None:
            return MUTEX_TIMEOUT
        return float(time or SYSBENCH_DEFAULT_TIME) * 3 + 60

    def _run_options(self) -> dict[str, Any]:
        return self.params

    def run_job(self) -> Job:
        return Job(argv=self._argv(self._run_options(), "run"), timeout=self._run_timeout())

    def parse(self, stdout: str) -> list[Metric]:
        report = Report(stdout, self.metric)
        return [*self._throughput(report), *report.metrics()]

    def _throughput(self, report: Report) -> list[Metric]:
        return []

    def host_problems(self) -> list[tuple[str, str]]:
        # Options a sysbench build may lack: named as such, not as a typo.
        known = _host_options(self.name)
        if not known:
            return []
        return [(key, f"an option the host's sysbench has (its `sysbench {self.name} help` "
                      f"has no --{key}: {why})")
                for key, why in BUILD_OPTIONS.items() if key in self.params and key not in known]


# Options a sysbench build may lack, and why.
BUILD_OPTIONS = {
    "memory-hugetlb": "it was built without large-page support (HAVE_LARGE_PAGES, Linux "
                      "only); Debian's 1.0.20 has it",
}


class CpuOptions(SysbenchOptions):
    cpu_max_prime: int = _option(2000, "Search primes up to this number", "cpu-max-prime",
                                 ge=3)


class Cpu(_Sysbench):
    name = "cpu"
    description = "Prime-number search: events/s is raw CPU speed; max latency shows preemption."
    Options = CpuOptions
    metrics = (MetricSpec("events/s", "events/s", True, "Prime searches per second",
                          group="CPU", primary=True), *_Sysbench.common_metrics)

    def _throughput(self, report: Report) -> list[Metric]:
        eps = find(report.lines, _CPU_EPS, "events per second")[1]
        return [self.metric("events/s", _positive(number(eps, "events per second"),
                                                  "events/s"))]


class ThreadsOptions(SysbenchOptions):
    threads: int = plugin.option(500, "Worker threads", unit="threads", ge=1)
    thread_yields: int = _option(100, "Yields per lock request", "thread-yields", ge=0)
    thread_locks: int = _option(4, "Locks per thread", "thread-locks", ge=1)


class Threads(_Sysbench):
    name = "threads"
    description = "500 threads yielding and taking locks: scheduler and futex cost."
    Options = ThreadsOptions
    metrics = (MetricSpec("events/s", "events/s", True, "Events per second (derived from "
                          "total events and time)", group="threads/scheduling", primary=True),
               *_Sysbench.common_metrics)

    def _throughput(self, report: Report) -> list[Metric]:
        # sysbench prints no rate for this test; the study compared events in a fixed time.
        if report.total_time <= 0:
            raise ParseError("total time is 0 s: no events/s can be derived")
        return [self.metric("events/s", _positive(report.total_events / report.total_time,
                                                  "events/s"))]


class MemoryOptions(SysbenchOptions):
    memory_block_size: SysbenchSize = _option("8k", "Size of the block each event moves",
                                              "memory-block-size")
    memory_total_size: SysbenchSize = _option(
        MEMORY_TOTAL_SIZE, "Data moved in all; the run stops at this or at `time`, whichever "
        "comes first. The default (~2 min at 8 GiB/s) outlasts a plan's time, so time bounds "
        'the run; E1 moved a fixed 1 GiB: memory-total-size = "1G"', "memory-total-size")
    memory_scope: Literal["global", "local"] | None = _option(
        None, "One buffer for all threads, or one each", "memory-scope")
    memory_hugetlb: OnOff | None = _option(
        None, "Allocate the buffers from huge pages (the target must reserve them)",
        "memory-hugetlb")
    memory_oper: Literal["read", "write", "none"] | None = _option(
        None, "Memory operation", "memory-oper")
    memory_access_mode: Literal["seq", "rnd"] | None = _option(
        None, "Memory access pattern", "memory-access-mode")


class Memory(_Sysbench):
    name = "memory"
    description = ("Writes 8 KiB blocks for `time` seconds: memory bandwidth (MiB/s) and "
                   "operations/s.")
    Options = MemoryOptions
    metrics = (MetricSpec("MiB/s", "MiB/s", True, "Memory bandwidth", group="memory",
                          primary=True),
               MetricSpec("ops/s", "ops/s", True, "Block operations per second",
                          group="memory"),
               *_Sysbench.common_metrics)

    def hugepages_needed(self) -> tuple[int, str]:
        if self.params.get("memory-hugetlb") != "on":
            return 0, ""
        local = self.params.get("memory-scope") == "local"
        buffers = int(self.params.get("threads") or 1) if local else 1
        block = self.params["memory-block-size"]
        pages = hugetlb_pages(_bytes(block), buffers)
        each = f"{buffers} threads' buffers of" if local else "a buffer of"
        return pages, (f'memory-hugetlb = "on" with {each} "{block}" takes {pages} 2 MiB huge '
                       "pages (sysbench rounds each up by up to 4 MiB)")

    def _throughput(self, report: Report) -> list[Metric]:
        ops = find(report.lines, _MEM_OPS, "total operations")
        number(ops[1], "total operations")
        metrics = [self.metric("ops/s", _positive(number(ops[2], "operations per second"),
                                                  "ops/s"))]
        # With --memory-oper=none sysbench moves no data and prints no transfer line.
        moves_data = self.params.get("memory-oper", "write") != "none"
        transfer = find(report.lines, _MEM_TRANSFER, "MiB transferred", required=moves_data)
        if transfer:
            number(transfer[1], "MiB transferred")
            metrics.insert(0, self.metric("MiB/s", _positive(number(transfer[2], "MiB/sec"),
                                                             "MiB/s")))
        return metrics


class FileioOptions(SysbenchOptions):
    # E1 creates the files with 16 threads and measures with 20. sysbench has a single
    # --threads, so the prepare step's count is the one option that is not sysbench's;
    # prepare and cleanup pass it as --threads.
    threads: int = plugin.option(20, "Threads of the measured run", unit="threads", ge=1)
    prepare_threads: int = _option(16, "Threads that create the files", "prepare-threads",
                                   unit="threads", ge=1)
    file_total_size: SysbenchSize = _option("2G", "Size of all test files together",
                                            "file-total-size")
    file_test_mode: Literal["seqwr", "seqrewr", "seqrd", "rndrd", "rndwr", "rndrw"] = _option(
        "rndrw", "I/O pattern", "file-test-mode")
    file_num: int | None = _option(None, "Number of files", "file-num", ge=1)
    file_block_size: SysbenchSize | None = _option(None, "Block size of each I/O",
                                                   "file-block-size")
    file_io_mode: Literal["sync", "async", "mmap"] | None = _option(
        None, "File operations mode", "file-io-mode")
    file_async_backlog: int | None = _option(None, "Asynchronous operations per thread",
                                             "file-async-backlog", ge=1)
    file_extra_flags: Literal["sync", "dsync", "direct"] | None = _option(
        None, "Extra flags to open files with", "file-extra-flags")
    file_fsync_freq: int | None = _option(None, "fsync() after this many requests (0: never)",
                                          "file-fsync-freq", ge=0)
    file_fsync_all: OnOff | None = _option(None, "fsync() after every write",
                                           "file-fsync-all")
    file_fsync_end: OnOff | None = _option(None, "fsync() at the end of the test",
                                           "file-fsync-end")
    file_fsync_mode: Literal["fsync", "fdatasync"] | None = _option(
        None, "How to synchronize", "file-fsync-mode")
    file_merged_requests: int | None = _option(None, "Merge at most this many requests "
                                               "(0: do not merge)", "file-merged-requests",
                                               ge=0)
    file_rw_ratio: float | None = _option(None, "Reads per write in combined tests",
                                          "file-rw-ratio", gt=0)


class Fileio(_Sysbench):
    name = "fileio"
    description = ("Random read/write over 2 GiB of files: I/O operations and MiB/s, "
                   "plus the write speed of creating the files.")
    Options = FileioOptions
    metrics = (MetricSpec("reads/s", "reads/s", True, "Read requests per second",
                          group="disk I/O", primary=True),
               MetricSpec("writes/s", "writes/s", True, "Write requests per second",
                          group="disk I/O"),
               MetricSpec("fsyncs/s", "fsyncs/s", True, "fsync calls per second",
                          group="disk I/O"),
               MetricSpec("read MiB/s", "MiB/s", True, "Read throughput", group="disk I/O"),
               MetricSpec("written MiB/s", "MiB/s", True, "Write throughput",
                          group="disk I/O"),
               MetricSpec("prepare MiB/s", "MiB/s", True, "Speed of creating the files "
                          "(the prepare step)", group="disk I/O"),
               *_Sysbench.common_metrics)

    def __init__(self, options: plugin.Options):
        super().__init__(options)
        self._size_mib = _bytes(self.params["file-total-size"]) / 2**20

    def prepare_seconds(self) -> float:
        return self._size_mib / PREPARE_MIB_S

    def _files_job(self, command: str, timeout: float) -> Job:
        # Same file options as the run (size, count, block size must match, or the run
        # does not find the files it expects), without the run's threads and time.
        options = {k: v for k, v in self.params.items()
                   if k not in ("threads", "prepare-threads", "time")}
        options["threads"] = self.params["prepare-threads"]
        return Job(argv=self._argv(options, command), timeout=timeout, in_scratch=True)

    def prepare_jobs(self) -> list[Job]:
        # Writing the files is bounded by the disk, not by --time: allow 1 MiB/s.
        job = self._files_job("prepare", self._size_mib + 60)
        job.scratch_bytes = int(self._size_mib * 2**20)
        return [job]

    def _run_options(self) -> dict[str, Any]:
        return {k: v for k, v in self.params.items() if k != "prepare-threads"}

    def run_job(self) -> Job:
        job = super().run_job()
        job.in_scratch = True
        return job

    def cleanup_jobs(self) -> list[Job]:
        return [self._files_job("cleanup", CLEANUP_TIMEOUT)]

    def parse_prepare(self, stdout: str) -> list[Metric]:
        lines = stripped_lines(stdout)
        if find(lines, _PREPARE_NOTHING, "no bytes written", required=False):
            raise ParseError("prepare wrote no bytes: the test files already existed")
        m = find(lines, _PREPARE, "bytes written")
        number(m[1], "bytes written")
        number(m[2], "seconds")
        return [self.metric("prepare MiB/s", _positive(number(m[3], "prepare MiB/sec"),
                                                       "prepare MiB/s"))]

    def _throughput(self, report: Report) -> list[Metric]:
        values = {name: number(find(report.lines, regex, name)[1], name)
                  for name, regex in _FILE_RATES.items()}
        mode = str(self.params.get("file-test-mode"))
        for name in _FILE_MODE_RATES.get(mode, ("reads/s", "writes/s")):
            if values[name] <= 0:
                raise ParseError(f"{name} is 0 in {mode} mode: the run did no such I/O")
        return [self.metric(name, value) for name, value in values.items()]


class MutexOptions(SysbenchOptions):
    threads: int = plugin.option(4, "Worker threads", unit="threads", ge=1)
    mutex_num: int = _option(2000, "Mutexes in the array", "mutex-num", ge=1)
    mutex_locks: int = _option(10000, "Locks per thread", "mutex-locks", ge=1)
    mutex_loops: int = _option(5000, "Empty loops between locks", "mutex-loops", ge=0)


class Mutex(_Sysbench):
    name = "mutex"
    description = "4 threads hammering 2000 mutexes: lock cost, read from total time and latency."
    Options = MutexOptions
    options: MutexOptions
    # Runs to completion: the time it takes is the result.
    time_option = None
    # sysbench times the run itself, from its threads' start to their end, to 0.1 ms: no
    # start-up and no VM job round trip is in it, and starting 4 threads costs ~0.1 ms, so
    # from 50 ms on neither weighs 1%. E1's run lasts 0.06-0.2 s here: the analysis' 1 s
    # rule flagged every classic run "too short"; its spread says whether it is noisy.
    min_duration = 0.05
    metrics = tuple(MetricSpec(s.name, s.unit, s.higher_is_better, s.doc,
                               group="threads/scheduling", primary=True)
                    if s.name == "total time" else s for s in _Sysbench.common_metrics)

    def run_seconds(self) -> float:
        o = self.options
        return (o.threads * o.mutex_locks * (o.mutex_loops + MUTEX_LOCK_LOOPS)
                * MUTEX_LOOP_SECONDS)
