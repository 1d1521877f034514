"""host-mem: host memory an instance's processes hold, at the end of a cell and at its peak.

RSS and PSS from /proc/PID/smaps_rollup (Linux 4.14 or later), summed over the subject's
pids or, for a subject with no lasting process but a cgroup (a container target, whose jobs
each run in a container of their own), over the processes in its cgroup at each reading.
RSS counts every page a process maps, so pages that instances share (one binary, KSM)
count in each of them; PSS divides each shared page among its sharers, so PSS adds up over
many instances to the memory they take together (E4's density). A process's threads share
its memory, so there is one read per process.

A background thread samples PSS every `interval` seconds for the peak, only during the
measured repetitions (not while paused); stop() and abort() stop and join it. A process
that exits before stop counts in the peak up to its last sample but not in the values at
stop, and a warning says so. A cgroup's processes come and go with its jobs: those still
there at stop give the values at stop; with none left, the peak alone is the result.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import ClassVar

from vmtax.core import plugin
from vmtax.core.collector import (
    Collector,
    CollectorError,
    CollectorJournal,
    Subject,
    cgroup_dirs,
    cgroup_pids,
    proc_stat,
    running_at_start,
)
from vmtax.core.types import Metric, MetricSpec
from vmtax.host.proc import smaps_rollup

_STARTTIME = 19


class HostMemOptions(plugin.Options):
    interval: float = plugin.option(
        0.2, "time between two samples of the peak; each sample walks the processes' page "
        "tables (as smaps_rollup does), which a large guest feels when it is short",
        unit="s", ge=0.05, le=10.0)


def _rollup(path: Path) -> tuple[int, int] | None:
    try:
        return smaps_rollup(path)
    except ValueError as exc:
        raise CollectorError(f"host-mem: {exc}") from None


class HostMem(Collector):
    name = "host-mem"
    description = ("Host memory of the instance's processes: RSS and PSS at the end of the "
                   "measured repetitions, and the peak PSS sampled during them.")
    Options = HostMemOptions
    options: HostMemOptions
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec("host rss", "MiB", False,
                   "resident memory of the instance's processes at the end, shared pages "
                   "counted in full"),
        MetricSpec("host pss", "MiB", False,
                   "proportional set size at the end: shared pages divided among sharers"),
        MetricSpec("host pss peak", "MiB", False, "largest PSS sampled during the cell"),
    )

    def __init__(self, options: plugin.Options, *, journal: CollectorJournal,
                 scratch: Path) -> None:
        super().__init__(options, journal=journal, scratch=scratch)
        self._born: dict[int, str] = {}      # pid -> its start time, to spot a reused pid
        self._cgroup: Path | None = None      # its processes are read at each sample
        self._gone: set[int] = set()
        self._peak = 0                       # KiB
        self._stopping = threading.Event()
        self._recording = threading.Event()    # clear while paused
        self._sampler: threading.Thread | None = None
        self._failure: Exception | None = None

    @classmethod
    def _cgroup_dir(cls, cgroup: str) -> Path | None:
        return next((d for d in cgroup_dirs(cls, cgroup) if d.is_dir()), None)

    @classmethod
    def unavailable(cls, subject: Subject) -> str | None:
        if not subject.pids and subject.cgroup is not None:
            if cls._cgroup_dir(subject.cgroup) is None:
                return (f"no cgroup {subject.cgroup}: none of "
                        + ", ".join(map(str, cgroup_dirs(cls, subject.cgroup))) + " exists")
            return None
        if not subject.pids:
            return f"{subject.name} has no host processes to observe"
        pid = next((p for p in subject.pids if proc_stat(p, cls.proc_root) is not None), None)
        if pid is None:
            return (f"none of {subject.name}'s processes "
                    f"({', '.join(map(str, subject.pids))}) is running")
        path = cls.proc_root / str(pid) / "smaps_rollup"
        try:
            path.open().close()
        except FileNotFoundError:
            return f"needs {path} (Linux 4.14 or later)"
        except OSError as exc:
            return f"cannot read {path}: {exc.strerror}"
        return None

    def _read(self) -> tuple[int, int, int]:
        """(RSS, PSS) in KiB summed over the processes still running, and how many are."""
        rss = pss = alive = 0
        if self._cgroup is not None:
            for pid in cgroup_pids(self._cgroup):
                value = _rollup(self.proc_root / str(pid) / "smaps_rollup")
                if value is not None:   # else it exited since the cgroup was read
                    rss, pss, alive = rss + value[0], pss + value[1], alive + 1
            return rss, pss, alive
        for pid, born in self._born.items():
            if pid in self._gone:
                continue
            fields = proc_stat(pid, self.proc_root)
            value = (_rollup(self.proc_root / str(pid) / "smaps_rollup")
                     if fields is not None and fields[_STARTTIME] == born else None)
            if value is None:
                self._gone.add(pid)
                continue
            rss, pss, alive = rss + value[0], pss + value[1], alive + 1
        return rss, pss, alive

    def _sample(self) -> None:
        try:
            while not self._stopping.wait(self.options.interval):
                if self._recording.is_set():
                    self._peak = max(self._peak, self._read()[1])
        except Exception as exc:   # stop() reports it; the thread must not die silently
            self._failure = exc

    def start(self, subject: Subject) -> None:
        why = self.unavailable(subject)
        if why is not None:
            raise CollectorError(f"{self.name}: {why}")
        if not subject.pids and subject.cgroup is not None:
            self._cgroup = self._cgroup_dir(subject.cgroup)
        self._born.update((pid, fields[_STARTTIME])
                          for pid, fields in running_at_start(self, subject).items())
        _, self._peak, alive = self._read()
        if not alive and self._cgroup is None:   # a cgroup's jobs have not started yet
            raise CollectorError(f"{self.name}: no process of {subject.name} left to observe")
        self._recording.set()
        self._sampler = threading.Thread(target=self._sample, name=f"vmtax {self.name}",
                                         daemon=True)
        self._sampler.start()

    def pause(self) -> None:
        # The peak is of the measured repetitions: no samples while other targets run.
        self._recording.clear()

    def resume(self) -> None:
        self._recording.set()

    def _join(self) -> None:
        self._stopping.set()
        if self._sampler is not None:
            self._sampler.join()

    def stop(self) -> list[Metric]:
        self._join()
        if isinstance(self._failure, CollectorError):
            raise self._failure
        if self._failure is not None:
            raise CollectorError(f"{self.name}: sampling failed: {self._failure!r}")
        rss, pss, alive = self._read()
        self._peak = max(self._peak, pss)
        for pid in sorted(self._gone):
            self.warnings.append(f"{self.name}: process {pid} exited before the end of the "
                                 "cell; counted in the peak up to its last sample only")
        if self._cgroup is not None and not self._peak:
            raise CollectorError(f"{self.name}: no process seen in cgroup {self._cgroup} "
                                 f"while it was sampled (every {self.options.interval:g} s)")
        metrics = [self.metric("host pss peak", self._peak / 1024)]
        if alive:   # with every process gone, 0 MiB would be no measurement
            metrics += [self.metric("host rss", rss / 1024), self.metric("host pss", pss / 1024)]
        return metrics

    def abort(self) -> None:
        self._join()
