"""E2: timer wake-up latency of real-time threads, measured by rt-tests' cyclictest.

E2 ran `cyclictest -t1 -p 99 -i 10000 -l 1000`: one SCHED_FIFO thread at priority 99
sleeps until an absolute time every 10 ms and records how late it woke. vmtax adds `-q`,
so cyclictest prints only its end-of-run summary, which the parser reads.

The run is bounded by a loop count, never by cyclictest's -D: every target then counts
the same wake-ups, and a count below it shows a run that was cut short.

The parser reads cyclictest 2.4 (Debian 12's rt-tests 2.4-1). Without a histogram `-q`
prints one line per thread:

    T: 0 ( 6813) P:99 I:1000 C:     20 Min:     23 Act:   36 Avg:   32 Max:      58

With `-h N` it prints no such lines but a table of N buckets (one tab-separated column per
thread), then `# Total:`, `# Min Latencies:`, `# Avg Latencies:`, `# Max Latencies:` and
`# Histogram Overflows:` with one value per thread. Both formats print whole µs; the
average is the mean truncated. Other `#` lines ("# /dev/cpu_dma_latency set to 0us",
absent where that device is, the overflows' cycle numbers) carry nothing measured.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import model_validator

from vmtax.core import plugin
from vmtax.core.errors import ParseError
from vmtax.core.target import REALTIME, Need
from vmtax.core.types import Job, Metric, MetricSpec
from vmtax.core.workload import Workload

# Without a histogram, cyclictest's thread N wakes every interval + N * this (its -d
# default); with one, every thread uses the interval itself.
DISTANCE = 500   # µs

# A counter: ASCII digits, few enough that int() takes them (it refuses over 4300).
_N = r"[0-9]{1,19}"
_THREAD = re.compile(rf"T:\s*({_N})\s+\(\s*{_N}\)\s+P:\s*({_N})\s+I:({_N})\s+C:\s*({_N})\s+"
                     rf"Min:\s*({_N})\s+Act:\s*{_N}\s+Avg:\s*({_N})\s+Max:\s*({_N})", re.ASCII)
_BUCKET = re.compile(rf"({_N}) ({_N}(?:\t{_N})*)")
_HIST_LABELS = {"Total": "total", "Min Latencies": "min", "Avg Latencies": "avg",
                "Max Latencies": "max", "Histogram Overflows": "overflows"}
_HIST_LINE = re.compile(r"# (" + "|".join(_HIST_LABELS) + rf"):((?: {_N})*)")


_PER_THREAD = "; with more than one thread, one value per thread"


def loops_for(duration: int, interval: int) -> int:
    """The loop count that fills `duration` seconds at `interval` µs."""
    return round(duration * 1_000_000 / interval)


class CyclictestOptions(plugin.Options):
    threads: int = plugin.option(
        1, "measuring threads (-t); without a histogram thread N wakes every "
        f"interval + N*{DISTANCE} µs (cyclictest's default distance)", ge=1)
    priority: int | None = plugin.option(
        99, "real-time priority of the threads (-p); none: normal scheduling (rt-tests "
        "still checks at start that it may use SCHED_FIFO, so a sandbox without real-time "
        "scheduling, gVisor, cannot run it either way). 0 is refused because cyclictest "
        "silently replaces it with threads+1", ge=1, le=99)
    policy: Literal["fifo", "rr"] = plugin.option(
        "fifo", "real-time scheduling policy (--policy, given only for rr)")
    interval: int = plugin.option(10000, "wake-up interval of thread 0 (-i)", unit="µs",
                                  ge=1, le=1_000_000)
    loops: int = plugin.option(
        1000, "wake-ups per thread (-l). Set by duration when that is given (then an "
        "explicit loops must agree with it); an explicit loops keeps the plan's time "
        "from setting duration", unit="wake-ups", ge=1)
    duration: int | None = plugin.option(
        None, "run length, filled from the plan's time unless loops is given: sets "
        "loops = duration*1e6/interval, rounded (cyclictest's -D is not used)",
        unit="s", ge=1)
    histogram: int = plugin.option(
        0, "track a latency histogram up to this many µs (-h), one metric per bucket "
        "and thread; 0: off. With it cyclictest gives every thread the same interval",
        unit="µs", ge=0, le=10000)
    mlockall: bool = plugin.option(
        False, "lock all memory (-m) so page faults add no latency; the job then also "
        "asks for CAP_IPC_LOCK")

    @model_validator(mode="before")
    @classmethod
    def _loops_from_duration(cls, data: Any) -> Any:
        # Filled in here, so the stored parameters show the loop count that really ran.
        if isinstance(data, dict) and "loops" not in data:
            duration = data.get("duration")
            interval = data.get("interval", cls.model_fields["interval"].default)
            if isinstance(duration, int) and isinstance(interval, int) and interval > 0:
                data = {**data, "loops": loops_for(duration, interval)}
        return data

    def problems(self) -> list[tuple[str, str]]:
        if self.priority is None and self.policy != "fifo":
            return [("policy", '"fifo" (the default) when priority is "none": a real-time '
                               "policy needs a priority")]
        if self.duration is not None:
            loops = loops_for(self.duration, self.interval)
            if self.loops != loops:
                return [("loops", f"{loops} (what duration {self.duration} s gives at an "
                                  f"interval of {self.interval} µs), or no duration")]
        return []


def _spec(name: str, unit: str, doc: str, **kwargs: Any) -> MetricSpec:
    return MetricSpec(name, unit, False, doc, **kwargs)


class Cyclictest(Workload):
    name = "cyclictest"
    description = ("Timer wake-up latency of a real-time thread (rt-tests cyclictest): "
                   "min, avg and max µs late.")
    Options = CyclictestOptions
    options: CyclictestOptions
    binaries = ("cyclictest",)
    packages = ("rt-tests",)
    time_option = "duration"
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        _spec("latency min", "µs", "lateness of the most punctual wake-up" + _PER_THREAD,
              group="latency", dimensions=("thread",), resolution=1.0),
        # Primary: it decides adaptive repetition, and an average of every wake-up
        # settles; a maximum is one extreme sample per run and would keep it repeating.
        _spec("latency avg", "µs", "mean lateness of a wake-up, truncated to whole µs"
              + _PER_THREAD, group="latency", primary=True, dimensions=("thread",),
              resolution=1.0),
        _spec("latency max", "µs", "latest wake-up: the worst case real-time code meets"
              + _PER_THREAD, group="latency", dimensions=("thread",), resolution=1.0),
        _spec("histogram overflows", "wake-ups",
              "wake-ups at least `histogram` µs late (with a histogram)" + _PER_THREAD,
              dimensions=("thread",)),
        _spec("histogram", "wake-ups",
              "wake-ups that were `us` µs late (with a histogram)" + _PER_THREAD,
              secondary=True, dimensions=("thread", "us")),
    )

    @classmethod
    def make(cls, params: dict[str, Any], time: int | None = None, *,
             strict: bool = True) -> Workload:
        # An explicit loop count fixes the run's length; the plan's time must not override it.
        return super().make(params, None if "loops" in params else time, strict=strict)

    def thread_interval(self, index: int) -> int:
        """The wake-up interval (µs) cyclictest gives thread `index`."""
        o = self.options
        return o.interval if o.histogram else o.interval + index * DISTANCE

    def run_seconds(self) -> float:
        o = self.options
        return o.loops * self.thread_interval(o.threads - 1) / 1_000_000

    def needs(self) -> list[Need]:
        # Even at priority "none": rt-tests 2.4 exits at start ("Unable to change scheduling
        # policy!") unless it may switch to SCHED_FIFO (measured under gVisor).
        return [Need(REALTIME, "at any priority: rt-tests checks that it may use SCHED_FIFO "
                               "before it measures")]

    def run_job(self) -> Job:
        o = self.options
        argv = ["cyclictest", "-q", f"-t{o.threads}",
                *(["-p", str(o.priority)] if o.priority is not None else []),
                "-i", str(o.interval), "-l", str(o.loops)]
        if o.policy != "fifo":
            argv.append(f"--policy={o.policy}")
        if o.histogram:
            argv += ["-h", str(o.histogram)]
        if o.mlockall:
            argv.append("-m")
        # CAP_SYS_NICE at priority "none" too: rt-tests checks SCHED_FIFO before it measures.
        capabilities = ("CAP_SYS_NICE",) + (("CAP_IPC_LOCK",) if o.mlockall else ())
        # Wake-ups run on the wall clock even under TCG; the slack covers start-up there.
        return Job(argv=argv, timeout=self.run_seconds() * 3 + 60, capabilities=capabilities)

    # -- parsing -------------------------------------------------------------------------

    def parse(self, stdout: str) -> list[Metric]:
        if not stdout.endswith("\n"):
            raise ParseError("the output ends mid-line: it was cut off")
        lines = [line for line in stdout.splitlines() if line.strip()]
        return self._histogram(lines) if self.options.histogram else self._summary(lines)

    def _dims(self, index: int) -> dict[str, str]:
        return {"thread": str(index)} if self.options.threads > 1 else {}

    def _latency(self, index: int, low: int, avg: int, high: int) -> list[Metric]:
        if not low <= avg <= high:
            raise ParseError(f"thread {index}: Min {low}, Avg {avg}, Max {high} are not "
                             "in order: the output is garbled")
        dims = self._dims(index)
        return [self.metric(f"latency {name}", value, **dims)
                for name, value in (("min", low), ("avg", avg), ("max", high))]

    def _check_count(self, index: int, count: int) -> None:
        loops = self.options.loops
        if count < loops:
            raise ParseError(f"thread {index} counted {count} of {loops} wake-ups: "
                             "the run was cut short")
        if count > loops:
            raise ParseError(f"thread {index} counted {count} wake-ups, more than the "
                             f"{loops} asked for: the output is garbled")

    def _summary(self, lines: list[str]) -> list[Metric]:
        o = self.options
        found: dict[int, list[Metric]] = {}
        for line in lines:
            if line.startswith("#"):
                continue
            m = _THREAD.fullmatch(line.strip())
            if not m:
                raise ParseError(f"unexpected line in cyclictest's summary: {line!r}")
            index, priority, interval, count, low, avg, high = map(int, m.groups())
            if index >= o.threads or index in found:
                raise ParseError(f"unexpected or repeated summary of thread {index} "
                                 f"({o.threads} ran)")
            if priority != (o.priority or 0):
                raise ParseError(f"thread {index} ran at priority {priority}, not "
                                 f"{o.priority or 0}")
            if interval != self.thread_interval(index):
                raise ParseError(f"thread {index} woke every {interval} µs, not every "
                                 f"{self.thread_interval(index)} µs")
            self._check_count(index, count)
            found[index] = self._latency(index, low, avg, high)
        missing = sorted(set(range(o.threads)) - set(found))
        if missing:
            raise ParseError("no summary line for thread " + ", ".join(map(str, missing)))
        return [metric for index in sorted(found) for metric in found[index]]

    def _histogram(self, lines: list[str]) -> list[Metric]:
        o = self.options
        rows: list[list[int]] = []
        values: dict[str, list[int]] = {}
        for line in lines:
            if m := _HIST_LINE.fullmatch(line.rstrip()):
                key = _HIST_LABELS[m[1]]
                if key in values:
                    raise ParseError(f"two '# {m[1]}:' lines: more than one report")
                values[key] = [int(v) for v in m[2].split()]
            elif line.startswith("#"):
                continue
            elif m := _BUCKET.fullmatch(line.rstrip()):
                if (bucket := int(m[1])) != len(rows):
                    raise ParseError(f"histogram bucket {bucket} where {len(rows)} was due")
                rows.append([int(v) for v in m[2].split("\t")])
            else:
                raise ParseError(f"unexpected line in cyclictest's histogram: {line!r}")
        if len(rows) != o.histogram:
            raise ParseError(f"{len(rows)} histogram buckets, expected {o.histogram}")
        for label, key in _HIST_LABELS.items():
            if key not in values:
                raise ParseError(f"no '# {label}:' line in the output")
            if len(values[key]) != o.threads:
                raise ParseError(f"'# {label}:' has {len(values[key])} values for "
                                 f"{o.threads} threads")
        if any(len(row) != o.threads for row in rows):
            raise ParseError(f"a histogram row without one count per thread ({o.threads})")
        metrics: list[Metric] = []
        for index in range(o.threads):
            column = [row[index] for row in rows]
            total, overflows = values["total"][index], values["overflows"][index]
            if sum(column) != total:
                raise ParseError(f"thread {index}: the buckets add up to {sum(column)}, "
                                 f"'# Total:' says {total}")
            self._check_count(index, total + overflows)
            dims = self._dims(index)
            metrics += self._latency(index, values["min"][index], values["avg"][index],
                                     values["max"][index])
            metrics.append(self.metric("histogram overflows", overflows, **dims))
            metrics += [self.metric("histogram", n, us=str(us), **dims)
                        for us, n in enumerate(column)]
        return metrics
