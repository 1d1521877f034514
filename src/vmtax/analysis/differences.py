"""What differs between two runs of a series, as far as it bears on one target × workload:
the host's facts, the target's options and fingerprint (what its programs are, by their
hashes, too), the workload's parameters, the plan's settings and vmtax's version; and what
the plans alone asked differently. For vmtax.analysis.history.

May import: nothing of vmtax (a run and a point are read by the fields they have).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

# Keys of the host's facts that are no fact about what was measured: how quiet it was, the
# fleet run it joined, its name (the series' own), vmtax's version (said once, of the run).
_HOST_CONTEXT = {"quiet", "fleet", "hostname", "vmtax"}
# A plan's keys said elsewhere: targets and workloads per series, the name is the series.
_PLAN_ELSEWHERE = {"targets", "workloads", "name"}
_ABSENT = object()


class Run(Protocol):
    """A run as history.SeriesRun has it."""
    @property
    def version(self) -> str: ...
    @property
    def plan(self) -> dict[str, Any]: ...
    @property
    def host_facts(self) -> dict[str, Any]: ...
    @property
    def targets(self) -> dict[str, dict[str, Any]]: ...


class Point(Protocol):
    """A run's point of a series, as history.Point has it."""
    @property
    def run(self) -> Run: ...
    @property
    def params(self) -> dict[str, Any]: ...


def what_changed(before: Point, after: Point, target: str, workload: str) -> list[str]:
    """What differs between the runs of two points, as far as it bears on target ×
    workload: the host's facts, the target's fingerprint and options, the workload's
    parameters, the plan's settings, vmtax's version. Empty: nothing recorded changed."""
    a, b = before.run, after.run
    lines = _differences("host ", _without(a.host_facts, _HOST_CONTEXT),
                         _without(b.host_facts, _HOST_CONTEXT))
    lines += _differences(f"{target} ", _target_facts(a, target), _target_facts(b, target))
    lines += _differences(f"{workload} ", before.params, after.params)
    lines += _differences("plan ", _without(a.plan, _PLAN_ELSEWHERE),
                          _without(b.plan, _PLAN_ELSEWHERE))
    if a.version != b.version:
        lines.append(f"vmtax {a.version} → {b.version}")
    return lines


def plan_changes(before: Point, after: Point, target: str, workload: str) -> list[str]:
    """What the plans of two points' runs asked differently for target × workload: the
    target's options, the workload's parameters, the plan's settings."""
    return (_differences(f"{target} ", _plan_options(before.run, target),
                         _plan_options(after.run, target))
            + _differences(f"{workload} ", before.params, after.params)
            + _differences("plan ", _without(before.run.plan, _PLAN_ELSEWHERE),
                           _without(after.run.plan, _PLAN_ELSEWHERE)))


def _without(facts: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    return {k: v for k, v in facts.items() if k not in keys}


def _plan_options(run: Run, target: str) -> dict[str, Any]:
    """The target's options as the run's plan asked for them."""
    return next((t.get("options", {}) for t in run.plan.get("targets", [])
                 if t.get("name") == target), {})


def _target_facts(run: Run, target: str) -> dict[str, Any]:
    """The target's options as the plan asked for them, overridden by its fingerprint (what
    it was); durations measured at start-up (boot_seconds, job_overhead_s) left out."""
    options = _plan_options(run, target)
    fingerprint = run.targets.get(target, {}).get("fingerprint", {})
    return {k: v for k, v in {**options, **fingerprint}.items()
            if not k.endswith(("_s", "seconds"))}


def _differences(label: str, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    lines = []
    for key in dict.fromkeys([*before, *after]):
        old, new = before.get(key, _ABSENT), after.get(key, _ABSENT)
        if isinstance(old, dict) and isinstance(new, dict):
            lines += _differences(f"{label}{key}.", old, new)
        elif old != new:
            lines.append(f"{label}{key}: {_change_text(old, new)}")
    return lines


def _change_text(old: Any, new: Any) -> str:
    """old → new; of two long lines of words (a kernel command line), the words that went
    and came."""
    if isinstance(old, str) and isinstance(new, str) and len(old) + len(new) > 60:
        gone = [w for w in old.split() if w not in new.split()]
        came = [w for w in new.split() if w not in old.split()]
        if gone or came:
            return " ".join([*(f"-{w}" for w in gone), *(f"+{w}" for w in came)])
    return f"{_value_text(old)} → {_value_text(new)}"


def _value_text(value: Any) -> str:
    if value is _ABSENT:
        return "(none)"
    if value is None:
        return "–"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)
