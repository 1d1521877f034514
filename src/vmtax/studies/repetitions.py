"""The Runner's repetition policy: how many measured repetitions a cell gets beyond the
plan's fixed `runs`. The Runner owns running them (order, collectors, cache drops, storing);
a policy only decides, through `Cell.measure`. The built-in one is `Precision` (`--runs
auto`); tune's racing (studies/tune.py) is another. A repetition's identity in a run is its
`rep_key`, which a resumed run and the fleet match stored repetitions by.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from vmtax.analysis import stats
from vmtax.core.workload import Workload
from vmtax.studies.plan import Plan


def params_key(params: dict[str, Any]) -> str:
    """A workload's parameters as one string, the same whatever their order."""
    return json.dumps(params, sort_keys=True)


# A repetition's identity within a run: (target, workload, parameters as JSON, phase, index).
RepKey = tuple[str, str, str, str, int]


def rep_key(rep: dict[str, Any]) -> RepKey:
    """A repetition's identity within a run (target, workload, parameters, phase, index):
    what `skip` and a resumed run's stored repetitions are matched by."""
    return (rep["target"], rep["workload"], params_key(rep["params"]), rep["phase"],
            rep["idx"])


@dataclass
class Unit:
    """One repetition of one workload on one target."""
    target: str
    phase: str       # warmup | measure
    idx: int         # position among this target's repetitions of the workload


@dataclass
class Cell:
    """One workload's cell as a policy sees it, with what is stored of it so far."""
    workload: Workload
    active: list[str]                 # the targets that repeat it in this session
    values: dict[str, list[float]]    # primary values stored, by target (every target)
    attempts: dict[str, int]          # measured repetitions stored, ok or not, by target
    broken: Mapping[str, str]         # targets that can no longer run jobs: why
    # measure(target, why): one more measured repetition, run and stored as the fixed ones
    # are (why shows in the progress line); it counts in attempts and values. Returns its
    # primary value, or None: it failed, or the target is broken (then nothing ran).
    measure: Callable[[str, str], float | None]


class RepetitionPolicy(Protocol):
    def resumed(self, cell: Cell) -> list[Unit]:
        """The units to run of a resumed cell whose fixed repetitions are all stored; called
        before it would be skipped. Empty: the cell is done."""
        ...

    def more(self, cell: Cell) -> None:
        """Called once a cell's fixed repetitions ran: measure more with cell.measure until
        the policy is content. Must terminate."""
        ...


class Precision:
    """`--runs auto`: more runs, one round at a time across the targets that still need
    them (order reversed every round, as in the fixed schedule), until each target's primary
    metric is precise enough (ci_target) or it has had max_runs attempts."""

    def __init__(self, plan: Plan, max_runs: int):
        self.plan = plan
        self.max_runs = max_runs

    def resumed(self, cell: Cell) -> list[Unit]:
        return []

    def more(self, cell: Cell) -> None:
        rounds = 0
        while True:
            need = [t for t in cell.active if t not in cell.broken
                    and cell.attempts[t] < self.max_runs
                    and (not cell.values[t] or stats.next_action(
                        cell.values[t], self.plan.runs, self.max_runs,
                        self.plan.ci_target) == "more")]
            if not need:
                return
            for name in need if rounds % 2 else reversed(need):
                cell.measure(name, "adaptive")
            rounds += 1
