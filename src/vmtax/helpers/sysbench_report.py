"""sysbench's end-of-run report, which every sysbench test prints (the sysbench workloads'
and oltp's), and how sysbench sizes its huge-page buffers.

The parser reads the report of sysbench 1.0.20 (Debian, Ubuntu >= 22.04), 1.0.18 (Ubuntu
20.04) and 1.0.11 (Ubuntu 18.04). For these tests the three releases differ only in
padding (1.0.11 right-aligns latency values at column 51, later releases at 53) and in
fileio's "Extra file open flags: 0" becoming "(none)", so lines are matched by label with
free whitespace. A value must be a plain decimal, optionally with the unit suffix sysbench
puts on that line: "inf", "nan" or "12abc" are reported, never parsed. Older releases'
spellings that carry the same numbers are accepted too: latency blocks headed "response
time:" / "per-request statistics:" with "ms"-suffixed values and an "approx. 95
percentile" line.
"""

from __future__ import annotations

import re
from typing import Callable, Literal, overload

from vmtax.core.errors import ParseError
from vmtax.core.types import Metric
from vmtax.host.hugepages import GUEST_PAGE

# Makes a metric of the workload's manifest from its name and value (Workload.metric).
MetricOf = Callable[[str, float], Metric]

# sysbench prints every latency in ms with two decimals.
LATENCY_RESOLUTION = 0.01
# The two spreads of the report's fairness block: events and run time per thread.
FAIRNESS = ("fairness events stddev", "fairness time stddev")
# sysbench 1.0 rounds a --memory-hugetlb buffer with a 4 MiB mask, not to the page size:
# ((size - 1) & ~4 MiB) + 4 MiB bytes, which can be up to 4 MiB more than the block.
_LARGE_PAGE = 4 << 20

_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_COUNT = re.compile(r"[0-9]+")
# Report lines, matched against each stripped line as a whole.
_TOTAL_TIME = re.compile(r"total time:\s+(\S+?)(?:\s+s)?")
_TOTAL_EVENTS = re.compile(r"total number of events:\s+(\S+)")
_LATENCY_HEADER = re.compile(r"Latency \(ms\):|response time:|per-request statistics:")
_LATENCY_VALUE = re.compile(r"(min|avg|max|sum):\s+(\S+?)(?:\s+ms)?")
_LATENCY_PCT = re.compile(r"(?:approx\.\s+)?([0-9]+)(?:th)? percentile:\s+(\S+?)(?:\s+ms)?")
_LATENCY_NO_PCT = re.compile(r"percentile stats:\s+disabled")
_FAIR_EVENTS = re.compile(r"events \(avg/stddev\):\s+(\S+)/(\S+)")
_FAIR_TIME = re.compile(r"execution time \(avg/stddev\):\s+(\S+)/(\S+)")


def number(token: str, what: str, suffix: str = "") -> float:
    """A plain decimal, optionally glued to the unit sysbench prints after it."""
    if suffix and token.endswith(suffix):
        token = token[:-len(suffix)]
    if not _DECIMAL.fullmatch(token):
        raise ParseError(f"{what}: {token!r} is not a number")
    return float(token)


def stripped_lines(output: str) -> list[str]:
    """The output's lines, stripped, as `find` matches them."""
    return [line.strip() for line in output.splitlines()]


@overload
def find(lines: list[str], regex: re.Pattern[str], what: str,
         required: Literal[True] = True) -> re.Match[str]: ...


@overload
def find(lines: list[str], regex: re.Pattern[str], what: str,
         required: bool) -> re.Match[str] | None: ...


def find(lines: list[str], regex: re.Pattern[str], what: str,
         required: bool = True) -> re.Match[str] | None:
    """The one line matching regex. Two of them mean several reports in one output
    (--report-checkpoints), where picking one would be a guess."""
    found = [m for m in map(regex.fullmatch, lines) if m]
    if len(found) > 1:
        raise ParseError(f"{len(found)} {what} lines: more than one report in the output")
    if not found and required:
        raise ParseError(f"no {what} line in the output")
    return found[0] if found else None


def _latency(lines: list[str], metric: MetricOf) -> list[Metric]:
    header = find(lines, _LATENCY_HEADER, "latency header")
    values: dict[str, Metric] = {}
    for line in lines[lines.index(header.string) + 1:]:
        if not line:
            break
        if m := _LATENCY_VALUE.fullmatch(line):
            name = f"latency {m[1]}"
            value = number(m[2], name, "ms")
            if m[1] != "sum":   # the sum of all latencies is not a latency itself
                values[name] = metric(name, value)
        elif m := _LATENCY_PCT.fullmatch(line):
            name = f"latency p{m[1]}"
            values[name] = metric(name, number(m[2], name, "ms"))
        elif not _LATENCY_NO_PCT.fullmatch(line):
            raise ParseError(f"unexpected line in the latency block: {line!r}")
    missing = [k for k in ("min", "avg", "max") if f"latency {k}" not in values]
    if missing:
        raise ParseError(f"latency block lacks {', '.join(missing)}")
    return list(values.values())


class Report:
    """The report every sysbench test ends with: general statistics, latency, fairness.
    Its `lines` are there for the test's own lines (`find`)."""

    def __init__(self, output: str, metric: MetricOf):
        self.metric = metric
        self.lines = stripped_lines(output)
        self.total_time = number(find(self.lines, _TOTAL_TIME, "total time")[1], "total time",
                                 "s")
        events = find(self.lines, _TOTAL_EVENTS, "total number of events")[1]
        # 4300 digits is Python's limit for int(); no real count comes near 20.
        if not _COUNT.fullmatch(events) or len(events) > 20:
            raise ParseError(f"total number of events: {events[:40]!r} is not a whole number "
                             "of events")
        self.total_events = int(events)
        if self.total_events == 0:
            raise ParseError("sysbench ran no events (total number of events: 0)")
        self.latency = _latency(self.lines, metric)
        events_sd, time_sd = FAIRNESS
        self.fairness = [self._stddev(_FAIR_EVENTS, "events (avg/stddev)", events_sd),
                         self._stddev(_FAIR_TIME, "execution time (avg/stddev)", time_sd)]

    def _stddev(self, regex: re.Pattern[str], what: str, name: str) -> Metric:
        m = find(self.lines, regex, what)
        number(m[1], f"{what} average")
        return self.metric(name, number(m[2], f"{what} stddev"))

    def metrics(self) -> list[Metric]:
        return [self.metric("total events", float(self.total_events)),
                self.metric("total time", self.total_time),
                *self.latency, *self.fairness]


def hugetlb_pages(block: int, buffers: int = 1) -> int:
    """2 MiB pages that `buffers` sysbench memory buffers of `block` bytes take
    (--memory-hugetlb)."""
    size = ((block - 1) & ~_LARGE_PAGE) + _LARGE_PAGE
    return buffers * -(-size // GUEST_PAGE)
