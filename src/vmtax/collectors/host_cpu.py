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

from vmtax import plugin
from vmtax.collectors.base import (Collector, CollectorError, Subject, proc_stat,
                                   running_at_start)
from vmtax.journal import Journal
from vmtax.types import Metric, MetricSpec

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
    # Where the cgroup hierarchies are mounted (tests point it at a fake tree).
    cgroup_root: ClassVar[Path] = Path("/sys/fs/cgroup")

    def __init__(self, options: plugin.Options, *, journal: Journal, scratch: Path) -> None:
        super().__init__(options, journal=journal, scratch=scratch)
        self._counter: Path | None = None              # the cgroup's counter file
        self._cgroup_start = (0.0, 0.0, 0.0)           # its (runtime, user, system) s
        self._procs: dict[int, list[str]] = {}         # pid -> its stat fields at start

    @classmethod
    def _counters(cls, cgroup: str) -> list[Path]:
        """Where the cgroup's CPU counters may be: in v1's cpuacct hierarchy, in a v2
        hierarchy at the root (unified layout) or beside the v1 ones (hybrid)."""
        rel = cgroup.strip("/")
        return [cls.cgroup_root / "cpuacct" / rel / "cpuacct.usage_user",
                cls.cgroup_root / rel / "cpu.stat",
                cls.cgroup_root / "unified" / rel / "cpu.stat"]

    @classmethod
    def unavailable(cls, subject: Subject) -> str | None:
        if subject.cgroup is not None:
            if any(path.is_file() for path in cls._counters(subject.cgroup)):
                return None
            return (f"no CPU accounting for cgroup {subject.cgroup}: none of "
                    + ", ".join(map(str, cls._counters(subject.cgroup))) + " exists")
        if not subject.pids:
            return f"{subject.name} has no host processes or cgroup to observe"
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
            self._cgroup_start = self._read_counter()
            return
        self._procs.update(running_at_start(self, subject))

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
        if self._counter is not None:
            total, du, ds = (b - a for a, b in zip(self._cgroup_start, self._read_counter()))
            # No tick in user or system mode: all user, as the kernel's cputime_adjust says.
            user = total * du / (du + ds) if du + ds > 0 else total
            system = total - user
        else:
            ticks = [0, 0]
            for pid, before in self._procs.items():
                after = proc_stat(pid, self.proc_root)
                if after is None or after[_STARTTIME] != before[_STARTTIME]:
                    self.warnings.append(
                        f"{self.name}: process {pid} exited before the end of the cell; "
                        "its CPU time after start is not counted")
                    continue
                # A zombie's times are its final ones: still a valid last reading.
                ticks[0] += int(after[_UTIME]) - int(before[_UTIME])
                ticks[1] += int(after[_STIME]) - int(before[_STIME])
            user, system = ticks[0] / _TICKS, ticks[1] / _TICKS
        return [self.metric("host cpu", user + system),
                self.metric("host cpu user", user),
                self.metric("host cpu system", system)]

    def abort(self) -> None:
        """Nothing to stop: host-cpu only reads counters at start and stop."""
