"""VM exits per reason of stored runs (E2): a cell's exits as a collector of VM exits (or
`vmtax exits import`) stored them, and how each reason's share moved from one cell to
another. `vmtax exits` (vmtax.cli.exits) shows them; vmtax.report.exits_tables draws them."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from vmtax.core import collector, workload
from vmtax.core.errors import VmtaxError
from vmtax.helpers import perf_kvm
from vmtax.results.store import IMPORTED, Rep, Run, Store


@dataclass
class Reason:
    reason: str
    samples: int
    share: float                 # % of samples
    # Times: None where the layout prints none, or the cell's times cannot be true.
    time_share: float | None     # % of handling time
    avg: float | None            # µs
    min: float | None
    max: float | None
    spread: float | None         # ± % of the mean
    per_second: float | None     # samples per second of workload time


@dataclass
class Cell:
    """One cell's exits: a target running one workload with its parameters."""
    run: str
    target: str
    workload: str
    params: dict[str, Any]
    event: str
    reasons: list[Reason]
    total_samples: int
    total_time: float            # µs
    seconds: float | None        # workload time the recording spans
    result: dict[str, float] = field(default_factory=dict)   # the workload's own medians
    vcpus: int | None = None     # the guest's
    # Why the exit times cannot be true, which are then not given (None: they can be).
    times_impossible: str | None = None

    @property
    def label(self) -> str:
        params = ", ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.run}:{self.target} · {self.workload}" + (f" ({params})" if params else "")


def _measured(run: Run, rep: Rep) -> list[Rep]:
    return [r for r in run.reps if r.phase == "measure" and r.status == "ok"
            and (r.target, r.workload, r.params) == (rep.target, rep.workload, rep.params)]


def _result(name: str, reps: list[Rep]) -> dict[str, float]:
    """Medians of the workload's headline metrics over the cell's measured repetitions."""
    try:
        cls = workload.get(name)
    except VmtaxError:   # an imported report's, or a workload no longer installed
        return {}
    wanted = {s.name for s in cls.metrics if s.group and not s.secondary}
    values: dict[str, list[float]] = {}
    for rep in reps:
        for m in rep.metrics:
            if m.name in wanted:
                values.setdefault(f"{m.key} {m.unit}", []).append(m.value)
    return {key: statistics.median(v) for key, v in values.items()}


def _selected(dimensions: dict[str, str] | Any, event: str, vcpu: int | None) -> bool:
    return (dimensions.get("event") == event
            and dimensions.get("vcpu") == (None if vcpu is None else str(vcpu)))


def _cell(run: Run, rep: Rep, event: str, vcpu: int | None) -> Cell:
    found: dict[str, dict[str, float]] = {}
    totals: dict[str, float] = {}
    for m in rep.metrics:
        if not _selected(m.dimensions, event, vcpu):
            continue
        if "reason" in m.dimensions:
            found.setdefault(m.dimensions["reason"], {})[m.name] = m.value
        else:
            totals[m.name] = m.value
    if imported := run.targets.get(rep.target, {}).get("fingerprint", {}).get("seconds"):
        seconds: float | None = float(imported)
        measured: list[Rep] = []
    else:
        measured = _measured(run, rep)
        times = [r.host_elapsed for r in measured if r.host_elapsed is not None]
        seconds = sum(times) if times else None
    vcpus = run.targets.get(rep.target, {}).get("fingerprint", {}).get("vcpus")
    total_time = totals.get("exit time total", 0.0)
    why = _impossible(seconds, vcpus, total_time,
                      max((v.get("exit time max") or 0.0 for v in found.values()), default=0))
    shown = (lambda v, key: v.get(key)) if why is None else (lambda v, key: None)
    reasons = [Reason(name, int(v["exits"]), v["exit share"], shown(v, "exit time share"),
                      shown(v, "exit time avg"), shown(v, "exit time min"),
                      shown(v, "exit time max"), shown(v, "exit time spread"),
                      v["exits"] / seconds if seconds else None)
               for name, v in found.items()]
    reasons.sort(key=lambda r: (-(r.time_share or 0.0), -r.samples, r.reason))
    return Cell(run.id, rep.target, rep.workload, rep.params, event, reasons,
                int(totals.get("exits total", 0)), total_time, seconds,
                _result(rep.workload, measured), vcpus, why)


def _impossible(seconds: float | None, vcpus: int | None, total: float,
                longest: float) -> str | None:
    """Why exit times (µs) cannot be true over `seconds` of workload time on `vcpus`: one
    exit longer than the workload ran, or more time in exits than its vCPUs had. perf
    times an exit from a vCPU's exit to its next entry, so one that spans a pause of the
    guest (vmtax stops it between its repetitions, while other targets run) lasts that
    whole pause; and a lab's nested clock jumps. None: they can be true."""
    if not seconds:
        return None
    if longest > seconds * 1e6:
        return (f"an exit lasted {longest / 1e6:,.1f} s, longer than the {seconds:.2f} s "
                "of workload time the recording spans")
    if vcpus and total > seconds * 1e6 * vcpus:
        return (f"{total / 1e6:,.1f} s were spent handling exits, more than {seconds:.2f} s "
                f"of workload time × {vcpus} vCPUs")
    return None


def exits_collectors() -> list[str]:
    """The collectors that record VM exits: their manifest declares perf kvm stat's metrics."""
    wanted = {spec.name for spec in perf_kvm.METRICS}
    return sorted(name for name, cls in collector.registered().items()
                  if wanted <= {spec.name for spec in cls.metrics})


def _records_exits(run: Run, rep: Rep, collectors: list[str]) -> bool:
    """Is rep a cell's record of VM exits: a collector's (argv [NAME]) or an import's?"""
    if rep.phase != "collect":
        return False
    return IMPORTED in run.plan or (len(rep.argv) == 1 and rep.argv[0] in collectors)


def cells(store: Store, spec: str, event: str, vcpu: int | None = None,
          workload: str | None = None) -> tuple[list[Cell], list[str]]:
    """The cells of RUN or RUN:TARGET (of one workload, or all) with exits of `event` (of
    all vCPUs, or of one), and why each other cell asked to record them has none
    ("vm:tcg · cyclictest: exits: unavailable — ...")."""
    run_id, _, target = spec.partition(":")
    run = store.load_run(run_id, last_may_be_imported=True)
    if target and target not in run.targets:
        raise VmtaxError(f"run {run.id} has no target {target!r}; it has: "
                         + ", ".join(run.targets))
    collectors = exits_collectors()
    recorded = [rep for rep in run.reps if _records_exits(run, rep, collectors)
                and target in ("", rep.target)]
    if workload is not None and workload not in {rep.workload for rep in recorded}:
        raise VmtaxError(f"{spec}: no workload {workload!r} recorded VM exits; these did: "
                         + (", ".join(sorted({rep.workload for rep in recorded})) or "none"))
    found, missing = [], []
    for rep in recorded:
        if workload not in (None, rep.workload):
            continue
        if any(_selected(m.dimensions, event, vcpu) for m in rep.metrics):
            found.append(_cell(run, rep, event, vcpu))
        else:
            asked = f"--event={event}" + ("" if vcpu is None else f" --vcpu={vcpu}")
            missing.append(f"{rep.target} · {rep.workload}: "
                           + (rep.error or f"no {asked} recorded"))
    return found, missing


@dataclass
class Change:
    reason: str
    share_a: float | None        # % of samples
    share_b: float | None
    change: float                # percentage points, B - A (absent counts as 0)
    time_share_a: float | None
    time_share_b: float | None
    time_change: float | None    # None: a side's times cannot be true
    per_second_a: float | None
    per_second_b: float | None


def diff_cells(a: Cell, b: Cell) -> list[Change]:
    """Per reason, how its shares moved from A to B, sorted by |change| of sample share."""
    ra, rb = {r.reason: r for r in a.reasons}, {r.reason: r for r in b.reasons}
    changes = []
    for name in [*ra, *(n for n in rb if n not in ra)]:
        x, y = ra.get(name), rb.get(name)
        changes.append(Change(
            name, x.share if x else None, y.share if y else None,
            round((y.share if y else 0.0) - (x.share if x else 0.0), 2),
            x.time_share if x else None, y.time_share if y else None,
            None if a.times_impossible or b.times_impossible else
            round((y.time_share or 0.0 if y else 0.0) - (x.time_share or 0.0 if x else 0.0), 2),
            x.per_second if x else None, y.per_second if y else None))
    changes.sort(key=lambda c: (-abs(c.change), c.reason))
    return changes
