"""The data that flows between vmtax's parts: jobs, their results, metrics.

This module imports nothing of vmtax, so plugins, the runner and the store can all share
it without import cycles.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping


@dataclass
class Job:
    """One command to run inside a target."""
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 600.0
    # Run in the target's scratch directory (on a real disk) instead of "/".
    in_scratch: bool = False
    # Linux capabilities beyond a container's default set the command needs
    # ("CAP_SYS_NICE" for a real-time priority); targets that drop capabilities add them.
    capabilities: tuple[str, ...] = ()
    # Values the job uses that are never stored or shown (a password made for the run):
    # the job gets them through env or a file, never in argv, and the store keeps "***"
    # wherever one still appears (its argv, output or error).
    secrets: tuple[str, ...] = ()
    # Bytes the job writes in the scratch directory (fileio's files): a target whose scratch
    # space is not its own (a user's guest's workdir) checks they are free first.
    scratch_bytes: int = 0


@dataclass
class JobResult:
    exit_code: int | None          # None when the job was killed at its timeout
    stdout: str
    stderr: str
    host_elapsed: float            # seconds, measured by the host around the job
    guest_elapsed: float | None = None  # seconds, measured by the target's own clock
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class Endpoint:
    """A server a target runs for a client on the host: where the host reaches it, and
    the host processes that serve it (for collectors)."""
    address: str
    port: int
    pids: list[int] = field(default_factory=list)
    # The target's own handle for stopping it (a process, a guest pid, a container).
    handle: object = None
    # What the client must do before exec to reach `address` (enter a network namespace).
    client_preexec: Callable[[], None] | None = None
    # The target saw the server listen (from the server's side). Otherwise the runner
    # probes with a connection, which some servers take for a client: iperf3 then resets
    # the next, real one while it still waits for the probe's test parameters.
    listening: bool = False


@dataclass(frozen=True)
class Metric:
    """One measured value. `dimensions` tell apart values of one metric within a
    repetition: {"percentile": "99"}, {"job": "randread"}, {"reason": "HLT"}."""
    name: str
    value: float
    unit: str
    higher_is_better: bool
    dimensions: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not math.isfinite(self.value):
            raise ValueError(f"metric {self.name}: {self.value} is not a finite number")

    @property
    def key(self) -> str:
        """The name with its dimensions: `latency[percentile=99]`."""
        if not self.dimensions:
            return self.name
        dims = ",".join(f"{k}={v}" for k, v in sorted(self.dimensions.items()))
        return f"{self.name}[{dims}]"


@dataclass(frozen=True)
class MetricSpec:
    """A metric a workload declares it produces (its manifest entry)."""
    name: str
    unit: str
    higher_is_better: bool
    doc: str = ""
    # The class of performance it speaks for in the report's verdicts ("CPU", "memory",
    # "disk I/O", "network", "threads/scheduling", "latency"); None keeps it out of them.
    group: str | None = None
    primary: bool = False      # decides adaptive repetition; the headline of its workload
    secondary: bool = False    # shown only on request (totals a fixed time sets, spreads)
    spread: bool = False       # a spread, not a speed: less than native is no clock artefact
    # A breakdown too fine for a table (a profile's stacks, functions): stored and exported,
    # shown by its own command, left out of run summaries and the report's tables.
    breakdown: bool = False
    # About the measurement, not the target's performance (a profile's sample counts, its
    # unresolved share, the profiler's own cost): no ratio to the baseline, never among a
    # run's results; shown in its collector's own section (`vmtax profile`, the report's
    # profiles).
    bookkeeping: bool = False
    dimensions: tuple[str, ...] = ()   # the dimension names its values carry
    # The smallest step the tool prints the value in (sysbench latencies: 0.01 ms). A median
    # at or below it is "below resolution": no ratio, comparison or flag is derived from it.
    resolution: float | None = None


@dataclass(frozen=True)
class Manifest:
    """What the analysis of stored results reads of a workload or collector, as the plugin
    index keeps it (Plugin.manifest): read without importing the plugin, nor pydantic."""
    metrics: tuple[MetricSpec, ...] = ()
    # The analysis' hooks (Workload.cell_flags, explain_win) the plugin defines itself: only
    # to call one is the plugin imported.
    hooks: frozenset[str] = frozenset()
    # The shortest repetition its results can be timed from (Workload.min_duration); None:
    # the analysis' own rule.
    min_duration: float | None = None

    def metric_spec(self, name: str) -> MetricSpec | None:
        return next((spec for spec in self.metrics if spec.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {"metrics": [asdict(spec) for spec in self.metrics], "hooks": sorted(self.hooks),
                "min_duration": self.min_duration}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        return cls(tuple(MetricSpec(**{**spec, "dimensions": tuple(spec["dimensions"])})
                         for spec in data["metrics"]), frozenset(data["hooks"]),
                   data.get("min_duration"))
