"""What a plan will cost: its configurations as they will run, and an estimated time; and
how long each job may take before it is stopped as hung.

Built from what each plugin declares: a target kind's start-up time, a workload's expected
repetition length (its time option, or its own estimate) and prepare time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vmtax.core import target as targets
from vmtax.core.types import Job
from vmtax.core.workload import Workload
from vmtax.studies.plan import Plan

# Measured on the classic plan under TCG on a 2-core host (173 s for an estimate of 226 s,
# when memory still finished its 1 GiB early; it now runs for its whole time).
RUN_OVERHEAD = 0.2      # s per repetition: start-up, result collection (0.05 native, 0.4 VM)
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


def estimate(plan: Plan, runs: int | None = None) -> Estimate:
    """How long the plan should take with `runs` measured repetitions (default: plan.runs)."""
    reps = plan.warmup + (plan.runs if runs is None else runs)
    n_targets = len(plan.targets)
    used: dict[str, None] = {}      # ordered set of the assumptions the sum relies on
    total = 0.0
    for target in plan.targets:
        startup = targets.get(target.kind).startup_seconds
        if startup:
            total += startup
            used[f"each {target.kind} target starts in {startup:g} s"] = None
    for spec in plan.workloads:
        workload = spec.make(plan.time)
        seconds = workload.run_seconds()
        if seconds is not None and workload.time_option is not None:
            used["a time-bounded repetition lasts exactly its time"] = None
        elif seconds is None:
            used[f"a repetition without a time bound ({workload.name}) takes "
                 f"{UNBOUNDED_RUN:g} s"] = None
        else:
            used[f"{workload.name} takes its own estimate of its work at native speed "
                 f"({seconds:.3g} s)"] = None
        total += ((UNBOUNDED_RUN if seconds is None else seconds) + RUN_OVERHEAD) * reps * n_targets
        prepare = workload.prepare_seconds()
        if prepare:
            used[f"{workload.name} prepares in {prepare:.0f} s, once per target and "
                 "configuration"] = None
            total += prepare * n_targets
    used[f"every repetition costs {RUN_OVERHEAD:g} s beyond its run time "
         "(start-up, collecting results)"] = None
    return Estimate(total, list(used))


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
