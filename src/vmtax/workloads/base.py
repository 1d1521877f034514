"""The contract every workload follows: its options, its metrics, its commands, a parser.

A workload prepares (once per target), runs once, cleans up and parses. It never loops
over repetitions: the runner owns warm-ups, repetitions, timeouts and interleaving.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, ClassVar

from vmtax import plugin
from vmtax.errors import ParseError, VmtaxError
from vmtax.types import Endpoint, Job, Metric, MetricSpec


class Workload(plugin.Plugin, abc.ABC):
    group = "workload"
    # Host programs the target images must carry (`packages` says where they come from).
    binaries: ClassVar[tuple[str, ...]] = ()
    # The metric manifest: every metric parse() may return. Exactly one is primary.
    metrics: ClassVar[tuple[MetricSpec, ...]] = ()
    # The option that bounds a repetition's duration, set from the plan's `time`
    # (None: the workload runs to completion).
    time_option: ClassVar[str | None] = None

    def __init__(self, options: plugin.Options):
        self.options = options

    # -- construction --------------------------------------------------------------------

    @classmethod
    def make(cls, params: dict[str, Any], time: int | None = None, *,
             strict: bool = True) -> "Workload":
        """The workload with these parameters (the plan's `time` fills the time option
        unless params set it); raises VmtaxError naming the first bad parameter."""
        params = dict(params)
        if time is not None and cls.time_option and cls.time_option not in params:
            params[cls.time_option] = time
        return cls(plugin.build(cls.Options, params, cls.name, strict=strict))

    @property
    def params(self) -> dict[str, Any]:
        """The parameters as run and stored: every option with a value, by its key."""
        return self.options.values()

    # -- the manifest --------------------------------------------------------------------

    @classmethod
    def metric_spec(cls, name: str) -> MetricSpec | None:
        return next((spec for spec in cls.metrics if spec.name == name), None)

    @classmethod
    def primary_metric(cls) -> str:
        return next(s.name for s in cls.metrics if s.primary)

    def metric(self, name: str, value: float, **dimensions: str) -> Metric:
        """A metric of the manifest with its declared unit and direction."""
        spec = self.metric_spec(name)
        if spec is None:   # a parser bug, or output this parser does not know
            raise ParseError(f"{self.name}: {name!r} is not in its metric manifest")
        try:
            return Metric(name, float(value), spec.unit, spec.higher_is_better, dimensions)
        except (ValueError, OverflowError) as exc:
            raise ParseError(str(exc)) from None

    @classmethod
    def describe(cls) -> dict[str, Any]:
        """Everything `vmtax list workloads --json` shows."""
        return {"name": cls.name, "description": cls.description,
                "binaries": list(cls.binaries), "packages": list(cls.packages),
                "time_option": cls.time_option, "options": cls.options_json(),
                "metrics": [{"name": s.name, "unit": s.unit,
                             "direction": "higher" if s.higher_is_better else "lower",
                             "primary": s.primary, "secondary": s.secondary,
                             "group": s.group, "dimensions": list(s.dimensions),
                             "resolution": s.resolution, "doc": s.doc}
                            for s in cls.metrics]}

    # -- what it needs from the host -----------------------------------------------------

    def host_problems(self) -> list[tuple[str, str]]:
        """(option, what the host lacks for it) before anything runs."""
        return []

    def trees(self) -> tuple[Path, ...]:
        """Read-only host directories the workload reads in its target, where every target
        shows them at the same path (vmtax.trees); made on first use."""
        return ()

    def hugepages_needed(self) -> tuple[int, str]:
        """2 MiB huge pages one repetition allocates in its target (0: none), and in words
        what takes them, for the plan check that they fit in every target."""
        return 0, ""

    # -- cost ----------------------------------------------------------------------------

    def run_seconds(self) -> float | None:
        """Expected length of one repetition; None when only a run can tell."""
        if self.time_option is not None:
            value = self.params.get(self.time_option)
            return float(value) if value is not None else None
        return None

    def prepare_seconds(self) -> float:
        """Expected length of the prepare jobs, once per target."""
        return 0.0

    # -- the jobs ------------------------------------------------------------------------

    def prepare_jobs(self) -> list[Job]:
        """Jobs run once per target before the repetitions (parsed by parse_prepare)."""
        return []

    def run_job(self) -> Job:
        """The measured command, run in the target (a client-server workload has none:
        its measured command is `client_job`, on the host)."""
        raise VmtaxError(f"workload {self.name} runs its measured command on the host "
                         "(client_job), not in the target")

    def server_job(self) -> Job | None:
        """A client-server workload's server: started in the target before the cell's
        repetitions and stopped after them (None: the workload has one role)."""
        return None

    # The TCP port its server listens on inside the target.
    server_port: ClassVar[int | None] = None

    def client_job(self, endpoint: Endpoint) -> Job:
        """A client-server workload's measured command, run on the host against the
        server at `endpoint` (pinned to host CPUs apart from the target's)."""
        raise VmtaxError(f"workload {self.name} has no client")

    def cleanup_jobs(self) -> list[Job]:
        """Jobs run once per target after the repetitions; their output is not kept."""
        return []

    @abc.abstractmethod
    def parse(self, stdout: str) -> list[Metric]:
        """Metrics from the measured command's output; raises ParseError when it cannot.
        Any other exception is treated alike: the repetition is stored as failed."""

    def parse_prepare(self, stdout: str) -> list[Metric]:
        return []


def check_manifest(cls: type[Workload]) -> None:
    """A workload's declarations are complete: exactly one primary metric, and a time
    option that is one of its options."""
    primary = [s.name for s in cls.metrics if s.primary]
    if len(primary) != 1:
        raise VmtaxError(f"workload {cls.name}: declares {len(primary)} primary metrics, "
                         "expected exactly one")
    two_roles = cls.server_job is not Workload.server_job
    if two_roles == (cls.run_job is not Workload.run_job) or (
            two_roles and (cls.client_job is Workload.client_job or cls.server_port is None)):
        raise VmtaxError(f"workload {cls.name}: defines either run_job, or server_job, "
                         "server_port and client_job")
    if cls.time_option and cls.time_option not in plugin.option_infos(cls.Options):
        raise VmtaxError(f"workload {cls.name}: time option {cls.time_option!r} is not "
                         "one of its options")
