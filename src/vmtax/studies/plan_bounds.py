"""What bounds a plan as a whole, which no single value can tell: its number of cells,
counted before its sweeps are expanded (MAX_CELLS), the huge pages its targets hold at
once against what the host can reserve, the huge pages each workload
configuration allocates against what each target holds for it, and what a target refuses
that a workload needs (gVisor: real-time scheduling).

Each check looks at every expanded configuration (`Configurations`) and reports at the
table one came from.

May import: `vmtax.core`, `vmtax.host`, `vmtax.studies.plan`, `vmtax.studies.plan_checks`,
`vmtax.studies.plan_sweeps`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from vmtax.core import plugin
from vmtax.core import target as targets
from vmtax.host import hugepages
from vmtax.studies.plan import TargetSpec, WorkloadSpec, refusals
from vmtax.studies.plan_checks import Checker, Origin
from vmtax.studies.plan_sweeps import Sweep
from vmtax.studies.toml_lines import KeyPath

# A plan's cells (a target configuration with a workload configuration), each run warmup
# + runs times. Far more is no plan anyone waits for (10,000 cells of 5 runs of 2 s take
# 28 h), and a plan that only says so: five lists of 100 values in 1 KB are 10^10 target
# configurations, which took 3.9 GB and a MemoryError to expand (issue 45.7). A plan at
# the cap loads in 1 to 9 s here (10,000 vm configurations are the slowest).
MAX_CELLS = 10_000


@dataclass
class Configurations:
    """Where each expanded target and workload configuration came from, each target's
    checked options, and how many configurations of each side the tables so far make."""
    target_origin: dict[str, Origin] = field(default_factory=dict)
    target_options: dict[str, plugin.Options] = field(default_factory=dict)
    workload_origin: list[Origin] = field(default_factory=list)
    counted: dict[str, int] = field(default_factory=lambda: {"target": 0, "workload": 0})


def within_cap(checker: Checker, made: Configurations, side: Literal["target", "workload"],
               path: KeyPath, sweep: Sweep) -> bool:
    """Whether a table's configurations fit MAX_CELLS with those of the tables read before
    it, counted, not expanded: a target table's with the targets' before it, a workload
    table's with the workloads' before it times the targets'. Said once, at the table
    that goes over the cap."""
    here, before = sweep.configurations, made.counted[side]
    made.counted[side] = before + here
    targets = max(1, made.counted["target"]) if side == "workload" else 1
    if (before + here) * targets <= MAX_CELLS:
        return True
    if before * targets > MAX_CELLS or targets > MAX_CELLS:
        return False   # said at the table that went over
    shape = f"{here} = {sweep.shape}" if len(sweep.axes) > 1 else str(here)
    got = f"{before + here} {side} configurations"
    if side == "workload" and targets > 1:
        got = f"{targets} target × {got} = {(before + here) * targets} cells"
    if before or targets > 1:
        got += f" ({shape} in this table)"
    elif len(sweep.axes) > 1:
        got += f" ({sweep.shape})"
    checker.bad(path, f"a plan of at most {MAX_CELLS} cells (target × workload "
                      "configurations)", got)
    return False


def check_host_hugepages(checker: Checker, made: Configurations,
                         specs: list[TargetSpec]) -> None:
    """The host huge pages all targets hold at once (every target is up for the whole
    plan), against what the host can reserve."""
    wanted: dict[str, int] = {}
    users: list[TargetSpec] = []
    for spec in specs:
        cls = targets.get(spec.kind)
        need = cls.host_hugepages(made.target_options[spec.name])
        for size, pages in need.items():
            wanted[size] = wanted.get(size, 0) + pages
        users += [spec] if need else []
    problem = hugepages.capacity_problem(wanted) if wanted else None
    if problem:
        origin = made.target_origin[users[0].name]
        checker.fail(origin.of("hugepages"),
                     f"{checker.dotted(origin.values + ('hugepages',))}: "
                     f"{problem} (for {', '.join(s.name for s in users)}, up together)")


def check_hugetlb(checker: Checker, made: Configurations, specs: list[TargetSpec],
                  configs: list[WorkloadSpec], time: int | None) -> None:
    """The huge pages a workload allocates must fit in each target: the ones it
    reserves for its workloads (a guest's), else the host's free ones."""
    host_free = hugepages.host_free()
    for config, origin in zip(configs, made.workload_origin):
        need, what = config.make(time).hugepages_needed()
        if not need:
            continue
        for spec in specs:
            have = targets.get(spec.kind).workload_hugepages(made.target_options[spec.name])
            where = (f"{spec.name} reserves {have} for its workloads" if have is not None
                     else f"{spec.name} runs on the host, which has {host_free} free")
            if need > (host_free if have is None else have):
                checker.fail(origin.path, f"{checker.dotted(origin.path)}: {what}, but {where}")


def check_refused(checker: Checker, made: Configurations, specs: list[TargetSpec],
                  configs: list[WorkloadSpec], time: int | None) -> None:
    """What a workload configuration needs that a target refuses (gVisor: real-time
    scheduling), at the workload's table."""
    refused = {spec.name: targets.get(spec.kind).refuses(made.target_options[spec.name])
               for spec in specs}
    for config, origin in zip(configs, made.workload_origin):
        workload = config.make(time)
        for name, features in refused.items():
            for problem in refusals(workload, name, features):
                checker.fail(origin.path, f"{checker.dotted(origin.path)}: {problem}")
