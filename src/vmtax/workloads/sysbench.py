"""E1's five sysbench workloads (cpu, threads, memory, fileio, mutex) and their parsers.

Every workload parameter is a sysbench option and becomes `--key=value` in sorted order,
so a plan can sweep any of them and equal parameters always give the same command line.

The parsers read the end-of-run report of sysbench 1.0.20 (Debian, Ubuntu >= 22.04),
1.0.18 (Ubuntu 20.04) and 1.0.11 (Ubuntu 18.04). For these tests the three releases
differ only in padding (1.0.11 right-aligns latency values at column 51, later releases
at 53) and in fileio's "Extra file open flags: 0" becoming "(none)", so lines are matched
by label with free whitespace. A value must be a plain decimal, optionally with the unit
suffix sysbench puts on that line: "inf", "nan" or "12abc" are reported, never parsed.
Older releases' spellings that carry the same numbers are accepted too: latency blocks
headed "response time:" / "per-request statistics:" with "ms"-suffixed values and an
"approx. 95 percentile" line, and memory's "Operations performed: N (X ops/sec)" and
"MB transferred (X MB/sec)" lines.
"""

from __future__ import annotations

import re
from typing import Any

from vmtax.errors import ParseError, VmtaxError
from vmtax.targets.base import Job
from vmtax.workloads.base import Metric, Workload

# sysbench's own --time default, in force when a plan sets no time.
SYSBENCH_DEFAULT_TIME = 10
# mutex runs to completion: E1's parameters take ~0.06 s natively and a few seconds under
# TCG, so ten minutes leaves room for sweeps that raise mutex-locks or mutex-loops a lot.
MUTEX_TIMEOUT = 600.0
# fileio cleanup only unlinks the test files.
CLEANUP_TIMEOUT = 120.0

_OPTION_NAME = re.compile(r"[a-z][a-z0-9-]*")
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_COUNT = re.compile(r"[0-9]+")
_SIZE = re.compile(r"([0-9]+)([bkmgt]?)", re.IGNORECASE)
_SIZE_SHIFT = {"": 0, "b": 0, "k": 10, "m": 20, "g": 30, "t": 40}

# Report lines, matched against each stripped line as a whole.
_TOTAL_TIME = re.compile(r"total time:\s+(\S+?)(?:\s+s)?")
_TOTAL_EVENTS = re.compile(r"total number of events:\s+(\S+)")
_LATENCY_HEADER = re.compile(r"Latency \(ms\):|response time:|per-request statistics:")
_LATENCY_VALUE = re.compile(r"(min|avg|max|sum):\s+(\S+?)(?:\s+ms)?")
_LATENCY_PCT = re.compile(r"(?:approx\.\s+)?([0-9]+)(?:th)? percentile:\s+(\S+?)(?:\s+ms)?")
_LATENCY_NO_PCT = re.compile(r"percentile stats:\s+disabled")
_FAIR_EVENTS = re.compile(r"events \(avg/stddev\):\s+(\S+)/(\S+)")
_FAIR_TIME = re.compile(r"execution time \(avg/stddev\):\s+(\S+)/(\S+)")
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


def _number(token: str, what: str, suffix: str = "") -> float:
    """A plain decimal, optionally glued to the unit sysbench prints after it."""
    if suffix and token.endswith(suffix):
        token = token[:-len(suffix)]
    if not _DECIMAL.fullmatch(token):
        raise ParseError(f"{what}: {token!r} is not a number")
    return float(token)


def _lines(stdout: str) -> list[str]:
    return [line.strip() for line in stdout.splitlines()]


def _find(lines: list[str], regex: re.Pattern[str], what: str,
          required: bool = True) -> re.Match[str] | None:
    """The one line matching regex. Two of them mean several reports in one output
    (--report-checkpoints), where picking one would be a guess."""
    found = [m for m in map(regex.fullmatch, lines) if m]
    if len(found) > 1:
        raise ParseError(f"{len(found)} {what} lines: more than one report in the output")
    if not found and required:
        raise ParseError(f"no {what} line in the output")
    return found[0] if found else None


def _latency(lines: list[str]) -> list[Metric]:
    header = _find(lines, _LATENCY_HEADER, "latency header")
    values: dict[str, Metric] = {}
    for line in lines[lines.index(header.string) + 1:]:
        if not line:
            break
        if m := _LATENCY_VALUE.fullmatch(line):
            name = f"latency {m[1]}"
            value = _number(m[2], name, "ms")
            if m[1] != "sum":   # the sum of all latencies is not a latency itself
                values[name] = Metric(name, value, "ms", False)
        elif m := _LATENCY_PCT.fullmatch(line):
            name = f"latency p{m[1]}"
            values[name] = Metric(name, _number(m[2], name, "ms"), "ms", False)
        elif not _LATENCY_NO_PCT.fullmatch(line):
            raise ParseError(f"unexpected line in the latency block: {line!r}")
    missing = [k for k in ("min", "avg", "max") if f"latency {k}" not in values]
    if missing:
        raise ParseError(f"latency block lacks {', '.join(missing)}")
    return list(values.values())


FAIRNESS = ("fairness events stddev", "fairness time stddev")


class _Report:
    """The report every sysbench test ends with: general statistics, latency, fairness."""

    def __init__(self, stdout: str):
        self.lines = _lines(stdout)
        lines = self.lines
        self.total_time = _number(_find(lines, _TOTAL_TIME, "total time")[1], "total time", "s")
        events = _find(lines, _TOTAL_EVENTS, "total number of events")[1]
        if not _COUNT.fullmatch(events):
            raise ParseError(f"total number of events: {events!r} is not a whole number")
        self.total_events = int(events)
        if self.total_events == 0:
            raise ParseError("sysbench ran no events (total number of events: 0)")
        self.latency = _latency(lines)
        events_sd, time_sd = FAIRNESS
        self.fairness = [self._stddev(_FAIR_EVENTS, "events (avg/stddev)", events_sd, "events"),
                         self._stddev(_FAIR_TIME, "execution time (avg/stddev)", time_sd, "s")]

    def _stddev(self, regex: re.Pattern[str], what: str, name: str, unit: str) -> Metric:
        m = _find(self.lines, regex, what)
        _number(m[1], f"{what} average")
        return Metric(name, _number(m[2], f"{what} stddev"), unit, False)

    def metrics(self) -> list[Metric]:
        return [Metric("total events", float(self.total_events), "events", True),
                Metric("total time", self.total_time, "s", False),
                *self.latency, *self.fairness]


def _rate(value: float, name: str, unit: str) -> Metric:
    if value <= 0:
        raise ParseError(f"{name} is {value:g}: the run measured no throughput")
    return Metric(name, value, unit, True)


def _arg(key: str, value: Any) -> str:
    if isinstance(value, bool):
        text = "on" if value else "off"
    elif isinstance(value, float) and value.is_integer():
        text = str(int(value))
    else:
        text = str(value)
    return f"--{key}={text}"


def _size_mib(value: Any) -> float:
    """A sysbench SIZE option ("2G", "512m", 1048576) in MiB."""
    m = _SIZE.fullmatch(str(value).strip())
    if not m:
        raise VmtaxError(f"fileio: file-total-size {value!r} is not a size like 2G or 512M")
    return (int(m[1]) << _SIZE_SHIFT[m[2].lower()]) / 2**20


class _Sysbench(Workload):
    binaries = ("sysbench",)
    time_param = "time"
    spread_metrics = frozenset(FAIRNESS)

    def __init__(self, params: dict[str, Any] | None = None):
        super().__init__(params)
        for key, value in self.params.items():
            if not isinstance(key, str) or not _OPTION_NAME.fullmatch(key):
                raise VmtaxError(f"{self.name}: {key!r} is not a sysbench option name")
            if not isinstance(value, (bool, int, float, str)) or value == "":
                raise VmtaxError(f"{self.name}: option {key} needs one number, word or "
                                 f"on/off, got {value!r}")
        time = self.params.get("time")
        # sysbench 1.0 rejects a fractional --time ("Invalid value for the 'time' option").
        if time is not None and (isinstance(time, (bool, str)) or time < 1
                                 or not float(time).is_integer()):
            raise VmtaxError(f"{self.name}: sysbench --time takes a whole number of seconds "
                             f"(1 or more), got {time!r}")

    def _argv(self, options: dict[str, Any], command: str) -> list[str]:
        return ["sysbench", self.name, *(_arg(k, options[k]) for k in sorted(options)), command]

    def _run_timeout(self) -> float:
        # sysbench stops starting events at --time, then waits for the events in flight
        # (500 threads yielding, fileio's final fsync of every file) and exits; under TCG
        # start-up and that tail take seconds. Three times the run plus a minute covers
        # both without letting a hung guest hold the plan up for long.
        if self.time_param is None:
            return MUTEX_TIMEOUT
        return float(self.params.get("time", SYSBENCH_DEFAULT_TIME)) * 3 + 60

    def _run_options(self) -> dict[str, Any]:
        return self.params

    def run_job(self) -> Job:
        return Job(argv=self._argv(self._run_options(), "run"), timeout=self._run_timeout())

    def parse(self, stdout: str) -> list[Metric]:
        report = _Report(stdout)
        return [*self._throughput(report), *report.metrics()]

    def _throughput(self, report: _Report) -> list[Metric]:
        return []


class Cpu(_Sysbench):
    name = "cpu"
    primary_metric = "events/s"
    description = "Prime-number search: events/s is raw CPU speed; max latency shows preemption."
    defaults = {"cpu-max-prime": 2000}

    def _throughput(self, report: _Report) -> list[Metric]:
        eps = _find(report.lines, _CPU_EPS, "events per second")[1]
        return [_rate(_number(eps, "events per second"), "events/s", "events/s")]


class Threads(_Sysbench):
    name = "threads"
    primary_metric = "events/s"
    description = "500 threads yielding and taking locks: scheduler and futex cost."
    defaults = {"threads": 500, "thread-yields": 100, "thread-locks": 4}

    def _throughput(self, report: _Report) -> list[Metric]:
        # sysbench prints no rate for this test; the study compared events in a fixed time.
        if report.total_time <= 0:
            raise ParseError("total time is 0 s: no events/s can be derived")
        return [_rate(report.total_events / report.total_time, "events/s", "events/s")]


class Memory(_Sysbench):
    name = "memory"
    primary_metric = "MiB/s"
    description = "Writes 1 GiB in 8 KiB blocks: memory bandwidth (MiB/s) and operations/s."
    defaults = {"memory-block-size": "8k", "memory-total-size": "1G"}

    def _throughput(self, report: _Report) -> list[Metric]:
        ops = _find(report.lines, _MEM_OPS, "total operations")
        _number(ops[1], "total operations")
        metrics = [_rate(_number(ops[2], "operations per second"), "ops/s", "ops/s")]
        # With --memory-oper=none sysbench moves no data and prints no transfer line.
        moves_data = str(self.params.get("memory-oper", "write")) != "none"
        transfer = _find(report.lines, _MEM_TRANSFER, "MiB transferred", required=moves_data)
        if transfer:
            _number(transfer[1], "MiB transferred")
            metrics.insert(0, _rate(_number(transfer[2], "MiB/sec"), "MiB/s", "MiB/s"))
        return metrics


class Fileio(_Sysbench):
    name = "fileio"
    primary_metric = "reads/s"
    description = ("Random read/write over 2 GiB of files: I/O operations and MiB/s, "
                   "plus the write speed of creating the files.")
    # E1 creates the files with 16 threads and measures with 20. sysbench has a single
    # --threads, so the prepare step's count is the one parameter that is not an option
    # name; prepare and cleanup pass it as --threads.
    defaults = {"file-total-size": "2G", "file-test-mode": "rndrw",
                "prepare-threads": 16, "threads": 20}

    def __init__(self, params: dict[str, Any] | None = None):
        super().__init__(params)
        self._size_mib = _size_mib(self.params["file-total-size"])

    def _files_job(self, command: str, timeout: float) -> Job:
        # Same file options as the run (size, count, block size must match, or the run
        # does not find the files it expects), without the run's threads and time.
        options = {k: v for k, v in self.params.items()
                   if k not in ("threads", "prepare-threads", "time")}
        options["threads"] = self.params["prepare-threads"]
        return Job(argv=self._argv(options, command), timeout=timeout, in_scratch=True)

    def prepare_jobs(self) -> list[Job]:
        # Writing the files is bounded by the disk, not by --time: allow 1 MiB/s.
        return [self._files_job("prepare", self._size_mib + 60)]

    def _run_options(self) -> dict[str, Any]:
        return {k: v for k, v in self.params.items() if k != "prepare-threads"}

    def run_job(self) -> Job:
        job = super().run_job()
        job.in_scratch = True
        return job

    def cleanup_jobs(self) -> list[Job]:
        return [self._files_job("cleanup", CLEANUP_TIMEOUT)]

    def parse_prepare(self, stdout: str) -> list[Metric]:
        lines = _lines(stdout)
        if _find(lines, _PREPARE_NOTHING, "no bytes written", required=False):
            raise ParseError("prepare wrote no bytes: the test files already existed")
        m = _find(lines, _PREPARE, "bytes written")
        _number(m[1], "bytes written")
        _number(m[2], "seconds")
        return [_rate(_number(m[3], "prepare MiB/sec"), "prepare MiB/s", "MiB/s")]

    def _throughput(self, report: _Report) -> list[Metric]:
        values = {name: _number(_find(report.lines, regex, name)[1], name)
                  for name, regex in _FILE_RATES.items()}
        mode = str(self.params.get("file-test-mode"))
        for name in _FILE_MODE_RATES.get(mode, ("reads/s", "writes/s")):
            if values[name] <= 0:
                raise ParseError(f"{name} is 0 in {mode} mode: the run did no such I/O")
        return [Metric(name, value, "MiB/s" if "MiB" in name else name, True)
                for name, value in values.items()]


class Mutex(_Sysbench):
    name = "mutex"
    primary_metric = "total time"
    description = "4 threads hammering 2000 mutexes: lock cost, read from total time and latency."
    defaults = {"threads": 4, "mutex-num": 2000, "mutex-locks": 10000, "mutex-loops": 5000}
    time_param = None
