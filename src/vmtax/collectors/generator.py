"""generator: host CPU time of a client-server workload's load generator during a cell.

A client-server workload (serving) runs its client on the host, pinned apart from the
target, once per repetition. The runner adds each run's CPU time to the subject's
`host_client` (getrusage of its children: the client and every process it waited for,
vegeta included); this collector returns what was added between the cell's first and last
measured repetitions, and the load it means: CPU seconds per second the client ran, in %
of one CPU. A load near the CPUs the client may use means the generator, not the server,
set the pace. Per step the serving workload flags that itself ("generator bound"); this is
the cell's record. A client killed at its timeout counts without its unreaped children.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from vmtax.core import plugin
from vmtax.core.collector import Collector, CollectorError, CollectorJournal, HostClient, Subject
from vmtax.core.types import Metric, MetricSpec


class Generator(Collector):
    name = "generator"
    description = ("Host CPU time of a client-server workload's load generator (its client "
                   "on the host) during the measured repetitions, and its load.")
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec("generator cpu time", "s", False, "CPU time of the client on the host "
                   "and what it ran, user + system"),
        MetricSpec("generator cpu user", "s", False, "the client's CPU time in user mode"),
        MetricSpec("generator cpu system", "s", False, "the client's CPU time in the kernel"),
        MetricSpec("generator load", "%", False, "the client's CPU time per second it ran, "
                   "% of one CPU"),
    )

    def __init__(self, options: plugin.Options, *, journal: CollectorJournal,
                 scratch: Path) -> None:
        super().__init__(options, journal=journal, scratch=scratch)
        self._client: HostClient | None = None
        self._start = HostClient()

    @classmethod
    def unavailable(cls, subject: Subject) -> str | None:
        if subject.host_client is None:
            return "the workload runs no client on the host (a client-server one does)"
        return None

    def start(self, subject: Subject) -> None:
        if subject.host_client is None:
            raise CollectorError(f"{self.name}: {self.unavailable(subject)}")
        self._client = subject.host_client
        c = self._client
        self._start = HostClient(c.user, c.system, c.elapsed, c.runs)

    def stop(self) -> list[Metric]:
        assert self._client is not None
        c, s = self._client, self._start
        if c.runs == s.runs:
            raise CollectorError(f"{self.name}: the client did not run")
        user, system, elapsed = c.user - s.user, c.system - s.system, c.elapsed - s.elapsed
        return [self.metric("generator cpu time", user + system),
                self.metric("generator cpu user", user),
                self.metric("generator cpu system", system),
                self.metric("generator load",
                            100.0 * (user + system) / elapsed if elapsed > 0 else 0.0)]

    def abort(self) -> None:
        """Nothing to stop: the runner does the counting."""
