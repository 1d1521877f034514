"""What a plan will cost: its configurations as they will run, and an estimated time; and
how long each job may take before it is stopped as hung.

Built from what each plugin declares: a target kind's start-up time, a workload's expected
repetition length (its time option, or its own estimate) and prepare time.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any

from vmtax.core import plugin
from vmtax.core import target as targets
from vmtax.core.types import Job
from vmtax.core.workload import Workload
from vmtax.results.store import Store
from vmtax.studies.plan import Plan

# Measured on the classic plan under TCG on a 2-core host (173 s for an estimate of 226 s,
# when memory still finished its 1 GiB early; it now runs for its whole time).
UNBOUNDED_RUN = 1.0     # s per repetition without a time bound or an estimate of its own
# A job may run this many times its estimate, plus the margin, before it is stopped as
# hung: estimates are native speed, and a TCG guest runs 5-20 times slower than that.
TIMEOUT_FACTOR = 10.0
TIMEOUT_MARGIN = 60.0
# The longest any job waits: a workload's own timeout follows from its options (loops times
# interval), and a poll's timeout over about 24 days overflows (OverflowError).
MAX_TIMEOUT = 20 * 86_400.0


@dataclass
class Estimate:
    seconds: float
    assumptions: list[str]      # only those that entered the sum


def configurations(plan: Plan) -> list[tuple[str, dict[str, Any]]]:
    """(workload, parameters as they will run, defaults and time included) per configuration."""
    return [(w.name, dict(sorted(w.make(plan.time).params.items()))) for w in plan.workloads]


def estimate(plan: Plan, runs: int | None = None, store: Store | None = None) -> Estimate:
    """How long the plan should take with `runs` measured repetitions (default: plan.runs):
    per target and workload configuration, what stored runs of that target took where the
    store has some (the median of their jobs), else what the plugins declare: a
    time-bounded repetition lasts its time, fixed work takes its estimate times the
    target's slowdown (a TCG guest's ~10), each job costs the target's job_seconds, each
    target its startup_seconds."""
    reps = plan.warmup + (plan.runs if runs is None else runs)
    used: dict[str, None] = {}      # ordered set of the assumptions the sum relies on
    learned = store.job_times([t.name for t in plan.targets]) if store is not None else {}
    total = 0.0
    for target in plan.targets:
        kind = targets.get(target.kind)
        startup = kind.startup_seconds
        if startup:
            total += startup
            used[f"each {target.kind} target starts in {startup:g} s"] = None
        slowdown = kind.slowdown(plugin.build(kind.Options, target.options, target.name,
                                              strict=False))
        for spec in plan.workloads:
            workload = spec.make(plan.time)
            key = (target.name, workload.name, json.dumps(workload.params, sort_keys=True))
            total += _repetitions(workload, target.name, slowdown, kind.job_seconds,
                                  learned.get((*key, "measure")), used) * reps
            total += _prepare(workload, learned.get((*key, "prepare")), used)
    return Estimate(total, list(used))


def _repetitions(workload: Workload, target: str, slowdown: float, job_seconds: float,
                 stored: list[float] | None, used: dict[str, None]) -> float:
    """One repetition of workload in target: as stored runs took it, else as declared."""
    if stored:
        used[f"{target} · {workload.name}: as stored runs took it (median of "
             f"{len(stored)})"] = None
        return statistics.median(stored)
    seconds, work = workload.run_seconds(), workload.work_seconds()
    if seconds is None:
        used[f"a repetition without a time bound ({workload.name}) takes "
             f"{UNBOUNDED_RUN:g} s at native speed"] = None
        seconds = work = UNBOUNDED_RUN
    elif work:
        used[f"{workload.name} takes its own estimate of its work at native speed "
             f"({work:.3g} s" + (f", beside {seconds - work:.3g} s its time bounds)"
                                 if seconds > work else ")")] = None
    else:
        used["a time-bounded repetition lasts exactly its time"] = None
    if slowdown != 1 and work:
        used[f"{target} runs fixed work {slowdown:g} times slower (TCG)"] = None
    used[f"a job costs {job_seconds:g} s beyond its work in {target}"] = None
    return seconds - work + work * slowdown + job_seconds


def _prepare(workload: Workload, stored: list[float] | None, used: dict[str, None]) -> float:
    """The prepare jobs of workload in a target: as stored runs took them, else its
    estimate (mostly writing files: a TCG guest's slowdown of computing is not theirs)."""
    if stored:
        return statistics.median(stored)
    prepare = workload.prepare_seconds()
    if prepare:
        used[f"{workload.name} prepares in {prepare:.2g} s, once per target and "
             "configuration"] = None
    return prepare


def job_timeout(workload: Workload, job: Job, phase: str, setting: float | None) -> float:
    """How long job (of workload, in phase prepare, warmup or measure) may run: the plan's
    `timeout` for a repetition when it sets one; else the estimate of the job times
    TIMEOUT_FACTOR plus TIMEOUT_MARGIN, never less than the workload's own timeout (at
    most MAX_TIMEOUT)."""
    if setting is not None and phase != "prepare":
        return setting
    expected = workload.prepare_seconds() if phase == "prepare" else workload.run_seconds()
    if not expected:
        return min(job.timeout, MAX_TIMEOUT)
    return min(max(job.timeout, expected * TIMEOUT_FACTOR + TIMEOUT_MARGIN), MAX_TIMEOUT)


def duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return (f"{hours} h {minutes} min" if hours else
            f"{minutes} min {secs} s" if minutes else f"{secs} s")
