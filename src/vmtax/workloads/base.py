"""The contract every workload follows: the commands to run and a parser for their output."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar

from vmtax.targets.base import Job


@dataclass(frozen=True)
class Metric:
    name: str
    value: float
    unit: str
    higher_is_better: bool


class Workload(abc.ABC):
    name: ClassVar[str]                    # "cpu", "fileio", ...
    description: ClassVar[str] = ""
    binaries: ClassVar[tuple[str, ...]] = ()   # host programs the target images must carry
    defaults: ClassVar[dict[str, Any]] = {}    # parameters, as in the experiment they come from
    # Parameter that bounds the run's duration, set from `--time` (None: runs to completion).
    time_param: ClassVar[str | None] = None
    # The metric whose precision decides when adaptive repetition (--runs auto) stops.
    primary_metric: ClassVar[str]
    # Metrics of spread, not speed: less spread than native (a guest doing fewer events has
    # a smaller stddev of events per thread) is no sign of a clock artefact.
    spread_metrics: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, params: dict[str, Any] | None = None):
        self.params = {**self.defaults, **(params or {})}

    def prepare_jobs(self) -> list[Job]:
        """Jobs run once per target before the repetitions (their output is parsed by parse_prepare)."""
        return []

    @abc.abstractmethod
    def run_job(self) -> Job:
        """The measured command."""

    def cleanup_jobs(self) -> list[Job]:
        return []

    @abc.abstractmethod
    def parse(self, stdout: str) -> list[Metric]:
        """Metrics from the measured command's output; raises ParseError when it cannot."""

    def parse_prepare(self, stdout: str) -> list[Metric]:
        return []
