"""The contract every workload follows: its options, its metrics, its commands, a parser.

A workload prepares (once per target), runs once, cleans up and parses. It never loops
over repetitions: the runner owns warm-ups, repetitions, timeouts and interleaving.

What is particular to one workload is declared here as a hook with a neutral default, and
the parts above the plugins (analysis, report, studies) call the hook, never the workload
by name: which stream its report is on, flags it raises on a cell, explanations of its
suspicious wins, its own figures.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Mapping, Sequence

from vmtax.core import plugin
from vmtax.core.errors import ParseError, VmtaxError
from vmtax.core.figures import Figure
from vmtax.core.target import SERVES, Need
from vmtax.core.types import Endpoint, Job, JobResult, Manifest, Metric, MetricSpec


# The KIND of a cell flag (Workload.cell_flags) saying the cell's value is only a lower
# bound (a capacity no failing step bounded): its ratio is no measure of the tax, so the
# analysis keeps it out of composite indices.
LOWER_BOUND = "capacity is a lower bound"
# The analysis' hooks a workload may define; its manifest names those it does.
HOOKS = ("cell_flags", "explain_win")


@dataclass(frozen=True)
class Outcome:
    """One metric of a workload on one target, as the analysis summarized a run: what the
    hooks that explain results read (plugins cannot import vmtax.analysis)."""
    metric: str                      # the name, without its dimensions
    dimensions: Mapping[str, str]
    ratio: float | None              # of the target's median to the baseline's, inverted
                                     # for lower-is-better metrics: above 1 is better
    beats_baseline: bool             # faster than the bare-host baseline beyond noise


class Workload(plugin.Plugin, abc.ABC):
    group = "workload"
    # Host programs the target images must carry (`packages` says where they come from).
    binaries: ClassVar[tuple[str, ...]] = ()
    # The metric manifest: every metric parse() may return. Exactly one is primary.
    metrics: ClassVar[tuple[MetricSpec, ...]] = ()
    # The option that bounds a repetition's duration, set from the plan's `time`
    # (None: the workload runs to completion).
    time_option: ClassVar[str | None] = None
    # The shortest repetition whose results can be timed, where the workload knows better
    # than the analysis' rule (analysis.summary.MIN_DURATION, for results that the job's
    # start-up or a VM's round trip weigh on): shorter ones are flagged "too short".
    min_duration: ClassVar[float | None] = None
    # The stream the measured command and the prepare jobs print the report on that parse
    # and parse_prepare read (stress-ng writes its report to stderr). Both streams are
    # stored with each repetition whichever is read.
    report_stream: ClassVar[Literal["stdout", "stderr"]] = "stdout"
    # Figures of its own (vmtax.core.figures), which the report draws instead of the
    # generic ones for metrics whose dimensions those would scatter over many charts.
    figures: ClassVar[tuple[Figure, ...]] = ()

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

    @classmethod
    def built_on_first_use(cls) -> dict[str, tuple[bool, str]]:
        """Of its binaries, those the workload builds itself when a run first needs them
        (not found on PATH until then): per binary, whether this host can build it and a
        line saying from what, or what it lacks. `vmtax doctor` shows it for one not built
        yet, where it would otherwise say "not found"."""
        return {}

    # -- the manifest --------------------------------------------------------------------

    @classmethod
    def metric_spec(cls, name: str) -> MetricSpec | None:
        return next((spec for spec in cls.metrics if spec.name == name), None)

    @classmethod
    def manifest(cls) -> dict[str, Any]:
        """Its metrics, and which of the analysis' hooks it defines itself."""
        own = frozenset(hook for hook in HOOKS
                        if getattr(cls, hook).__func__ is not getattr(Workload, hook).__func__)
        return Manifest(cls.metrics, own, cls.min_duration).to_json()

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
        shows them at the same path (vmtax.host.trees); made on first use."""
        return ()

    def build_on_host(self) -> None:
        """Build what it runs that vmtax makes from source (a server, a load generator), on
        first use, before any target starts; cached after. Default: nothing."""

    def hugepages_needed(self) -> tuple[int, str]:
        """2 MiB huge pages one repetition allocates in its target (0: none), and in words
        what takes them, for the plan check that they fit in every target."""
        return 0, ""

    def needs(self) -> list[Need]:
        """Features of its target this configuration needs (vmtax.core.target.Need): the
        plan check refuses it, before anything runs, on a target that refuses one
        (Target.refuses). Cheap; never raises. Default: none."""
        return []

    # -- cost ----------------------------------------------------------------------------

    def run_seconds(self) -> float | None:
        """Expected length of one repetition; None when only a run can tell."""
        if self.time_option is not None:
            value = self.params.get(self.time_option)
            return float(value) if value is not None else None
        return None

    def work_seconds(self) -> float:
        """How much of run_seconds() is fixed work at native speed, which a slower target
        stretches (a TCG guest's ~10 times) where a time bound does not: by default all of
        it for a workload no time bounds, none for a time-bounded one. For estimates."""
        seconds = self.run_seconds()
        return seconds if seconds is not None and self.time_option is None else 0.0

    def prepare_seconds(self) -> float:
        """Expected length of the prepare jobs, once per target."""
        return 0.0

    # -- the jobs ------------------------------------------------------------------------

    def prepare_jobs(self) -> list[Job]:
        """Jobs run once per target before the repetitions (parsed by parse_prepare)."""
        return []

    def all_needs(self) -> list[Need]:
        """What the plan check matches against its targets' refusals: needs(), and for a
        client-server workload a server in the target its client on the host reaches."""
        serves = ([Need(SERVES, "for its server, which its client on the host reaches")]
                  if self.server_job() is not None else [])
        return [*self.needs(), *serves]

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

    def turned_away(self, result: JobResult) -> str | None:
        """Why a client run never began its test, in words (its server, still ending the
        last test, reset the connection); None when it did, or failed in it. The runner
        runs such a client again, a few times: nothing of the turned-away run was measured."""
        return None

    def cleanup_jobs(self) -> list[Job]:
        """Jobs run once per target after the repetitions; their output is not kept."""
        return []

    def report(self, result: JobResult) -> str:
        """The text of a finished job that parse and parse_prepare read: its output on
        `report_stream`."""
        return result.stderr if self.report_stream == "stderr" else result.stdout

    @abc.abstractmethod
    def parse(self, output: str) -> list[Metric]:
        """Metrics from the measured command's report (its `report_stream`); raises
        ParseError when it cannot. Any other exception is treated alike: the repetition is
        stored as failed."""

    def parse_prepare(self, output: str) -> list[Metric]:
        """Metrics from the report of a prepare job (its `report_stream`), as parse."""
        return []

    # -- what the analysis asks of its results ---------------------------------------------

    @classmethod
    def cell_flags(cls, metric_key: str, reps: list[list[Metric]]) -> list[str]:
        """Flags the workload raises on one cell of a run's summary (one metric of one
        configuration on one target), beside the generic ones (noisy, too short, ...).

        Called by the analysis for every cell of the workload's rows, with the metric's
        key (`requests/s[endpoint=download]`: Metric.key) and, per successful repetition
        of the cell, all the metrics it produced. Returns the flags, each "KIND: detail"
        or a bare KIND (the terminal counts cells per KIND, the report shows the flag
        whole); [] for none.
        """
        return []

    @classmethod
    def explain_win(cls, win: Outcome, others: Sequence[Outcome], baseline: str) -> str | None:
        """Why a result of the workload that beats the bare host may be no real win, in
        words, as a line of the report's explanations ends; None leaves it to the generic
        ones (the page cache for disk I/O metrics, else the host's load).

        Called by the analysis for each headline metric of a target flagged faster than
        the bare-host baseline beyond noise, unless the target's clock disagreed with the
        host's (that explains it first). `others`: the same target's other metrics in the
        same configuration; `baseline`: the baseline target's name.
        """
        return None


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


# -- the registry of workloads -------------------------------------------------------------

def registered() -> dict[str, type[Workload]]:
    """Workload name -> class, built-in and third-party."""
    return plugin.plugins(Workload.group)  # type: ignore[return-value]


def get(name: str) -> type[Workload]:
    return plugin.get(Workload.group, name)  # type: ignore[return-value]


def manifest(name: str) -> Manifest | None:
    """The workload's metrics and own hooks, without importing it (nor pydantic); None for
    a workload not installed here."""
    return plugin.manifest(Workload.group, name, Manifest.from_json)
