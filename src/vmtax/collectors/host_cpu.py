"""host-cpu: host CPU time an instance uses during a cell's measured repetitions.

From the instance's cgroup when it has one, otherwise from its processes:

- cgroup: v1's cpuacct.usage (ns), or v2's cpu.stat usage_usec. This counts every process
  that was in the cgroup, including those that came and went between start and stop. It
  is the scheduler's exact runtime; the user/system split comes from cpuacct.usage_user
  and usage_sys (v1) or user_usec and system_usec (v2), which v1 takes from timer-tick
  samples: 18% above the exact runtime was seen on a loaded host. So the runtime is split
  in their proportion, as the kernel itself does for /proc/PID/stat and v2's cpu.stat.
- processes: utime and stime of /proc/PID/stat for the pids given at start, in clock ticks
  (SC_CLK_TCK: 10 ms on most hosts). A process's times cover all its threads, exited ones
  included, so /proc/PID/task is not read. Children are not counted (cutime/cstime hold
  only children that exited and were waited for), so an instance whose work runs in
  short-lived children needs a cgroup. A process that exited (or whose pid was reused)
  before stop counts up to its last reading, the one at start, and a warning says so.

Either way a KVM guest's own running time is user time: the kernel charges it to the vCPU
thread as such.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from vmtax.core import plugin
from vmtax.core.collector import (
    Collector,
    CollectorError,
    CollectorJournal,
    Subject,
    cgroup_dirs,
    proc_stat,
    running_at_start,
)
from vmtax.core.types import Metric, MetricSpec

_TICKS = os.sysconf("SC_CLK_TCK")
_UTIME, _STIME, _STARTTIME = 11, 12, 19


class HostCpu(Collector):
    name = "host-cpu"
    description = ("Host CPU seconds the instance uses during the measured repetitions, "
                   "user and system (from its cgroup, or its processes' /proc/PID/stat).")
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec("host cpu", "s", False, "host CPU time of the instance, user + system"),
        MetricSpec("host cpu user", "s", False,
                   "host CPU time in user mode (a KVM guest's running time counts here)"),
        MetricSpec("host cpu system", "s", False, "host CPU time in the host kernel"),
    )
    def __init__(self, options: plugin.Options, *, journal: CollectorJournal,
                 scratch: Path) -> None:
        super().__init__(options, journal=journal, scratch=scratch)
        self._counter: Path | None = None              # the cgroup's counter file
        self._procs: dict[int, list[str]] = {}         # pid -> its stat fields at start
        self._last: dict[int, list[str]] = {}          # pid -> its latest stat fields
        # The sum over the measured repetitions: (runtime, user, system) s of the cgroup,
        # or (user, system) clock ticks of the processes; and the reading that opened the
        # repetition under way (None: paused).
        self._counted: tuple[float, ...] = ()
        self._opened: tuple[float, ...] | None = None
        self._failure: CollectorError | None = None    # in pause() or resume(), for stop()

    @classmethod
    def _counters(cls, cgroup: str) -> list[Path]:
        """Where the cgroup's CPU counters may be: in v1's cpuacct hierarchy, in a v2
        hierarchy at the root (unified layout) or beside the v1 ones (hybrid)."""
        v1, v2, hybrid = cgroup_dirs(cls, cgroup)
        return [v1 / "cpuacct.usage_user", v2 / "cpu.stat", hybrid / "cpu.stat"]

    @classmethod
    def unavailable(cls, subject: Subject) -> str | None:
        if subject.cgroup is not None:
            if any(path.is_file() for path in cls._counters(subject.cgroup)):
                return None
            return (f"no CPU accounting for cgroup {subject.cgroup}: none of "
                    + ", ".join(map(str, cls._counters(subject.cgroup))) + " exists")
        if not subject.pids:
            # A container target's jobs each run in a container of their own, counted in
            # the target's cgroup when its runtime has one (vmtax.helpers.runtime_cgroup).
            return (f"{subject.name} has no host process or cgroup that lasts the cell"
                    + (": its runtime puts its jobs in no cgroup of the target's (unshare, "
                       "or a host without a cgroup v1 cpuacct hierarchy of its own)"
                       if subject.kind == "container" else ""))
        if all(proc_stat(pid, cls.proc_root) is None for pid in subject.pids):
            return (f"none of {subject.name}'s processes "
                    f"({', '.join(map(str, subject.pids))}) is running")
        return None

    def start(self, subject: Subject) -> None:
        why = self.unavailable(subject)
        if why is not None:
            raise CollectorError(f"{self.name}: {why}")
        if subject.cgroup is not None:
            self._counter = next(p for p in self._counters(subject.cgroup) if p.is_file())
        else:
            self._procs.update(running_at_start(self, subject))
            self._last.update(self._procs)
        self._opened = self._reading()
        self._counted = tuple(0.0 for _ in self._opened)

    def _reading(self) -> tuple[float, ...]:
        """The cgroup's (runtime, user, system) s, or the processes' (user, system) ticks
        since start (one that exited counts up to its last reading, with a warning)."""
        if self._counter is not None:
            return self._read_counter()
        ticks = [0.0, 0.0]
        for pid, before in self._procs.items():
            after = proc_stat(pid, self.proc_root)
            if after is None or after[_STARTTIME] != before[_STARTTIME]:
                warning = (f"{self.name}: process {pid} exited before the end of the cell; "
                           "its CPU time after its last reading is not counted")
                if warning not in self.warnings:
                    self.warnings.append(warning)
                after = self._last[pid]
            else:   # a zombie's times are its final ones: still a valid reading
                self._last[pid] = after
            ticks[0] += int(after[_UTIME]) - int(before[_UTIME])
            ticks[1] += int(after[_STIME]) - int(before[_STIME])
        return tuple(ticks)

    def pause(self) -> None:
        if self._opened is None or self._failure is not None:
            return
        try:
            now = self._reading()
        except CollectorError as exc:
            self._failure = exc
            return
        self._counted = tuple(c + b - a for c, a, b in zip(self._counted, self._opened, now))
        self._opened = None

    def resume(self) -> None:
        if self._opened is not None or self._failure is not None:
            return
        try:
            self._opened = self._reading()
        except CollectorError as exc:
            self._failure = exc

    def _read_counter(self) -> tuple[float, float, float]:
        """(runtime, user, system) seconds the cgroup has used since it was made."""
        assert self._counter is not None
        try:
            if self._counter.name == "cpuacct.usage_user":
                ns = [int(self._counter.with_name(f"cpuacct.{name}").read_text())
                      for name in ("usage", "usage_user", "usage_sys")]
                return ns[0] / 1e9, ns[1] / 1e9, ns[2] / 1e9
            stat = dict(line.split() for line in self._counter.read_text().splitlines())
            return (int(stat["usage_usec"]) / 1e6, int(stat["user_usec"]) / 1e6,
                    int(stat["system_usec"]) / 1e6)
        except (OSError, ValueError, KeyError) as exc:
            # Gone: the instance stopped, and its cgroup was removed with it.
            raise CollectorError(f"{self.name}: cannot read {self._counter}: {exc}") from None

    def stop(self) -> list[Metric]:
        self.pause()    # the runner pauses first; a direct caller need not
        if self._failure is not None:
            raise self._failure
        if self._counter is not None:
            total, du, ds = self._counted
            # No tick in user or system mode: all user, as the kernel's cputime_adjust says.
            user = total * du / (du + ds) if du + ds > 0 else total
            system = total - user
        else:
            user, system = (ticks / _TICKS for ticks in self._counted)
        return [self.metric("host cpu", user + system),
                self.metric("host cpu user", user),
                self.metric("host cpu system", system)]

    def abort(self) -> None:
        """Nothing to stop: host-cpu only reads counters."""
