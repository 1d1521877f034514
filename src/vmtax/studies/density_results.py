"""What an E4 density study comes to: memory per instance (`summarize`, see the study's
module, vmtax.studies.density, for what each figure means), the lines that say it, its
stored metrics and how they are read back, and stored studies compared across runs."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from vmtax.core import hints
from vmtax.core.errors import VmtaxError
from vmtax.core.types import Metric
from vmtax.results import study_records as records
from vmtax.studies.density import PAGE_MIB, SATURATED, WORKLOAD, Outcome, Step

# --- what it comes to --------------------------------------------------------------------

@dataclass
class Summary:
    target: str
    ksm: bool
    instances: int
    stopped: str
    raw: float | None             # MiB per instance
    adjusted: float | None
    pss: float | None
    marginal: float | None        # MiB per instance of the last batch
    all_answered: bool
    settled: bool = False         # memory settled after the last step
    # Why raw, adjusted or marginal is None although measured: what they came to, which
    # no instance can cost (None: every figure is a result).
    not_results: str | None = None
    # The last step's HTTP check and the CPU while the instances idled (Step's fields).
    answering: int = 0
    http_slowest: float | None = None
    http_wait: float | None = None
    host_busy: float | None = None
    instances_cpu: float | None = None
    cpus: int | None = None
    # What the budget or the host's memory that ended it came to (Outcome.detail).
    detail: str = ""
    warning: str | None = None    # a figure the host made less than it seems
    # MiB per instance of its PSS in guest RAM (None: no guest), so pss - guest_ram is
    # what its VMM's own process costs beyond the RAM it gives the guest.
    guest_ram: float | None = None


def summarize(outcome: Outcome) -> Summary:
    steps = outcome.steps
    if not steps:
        return Summary(outcome.target, outcome.ksm, 0, outcome.stopped, None, None, None,
                       None, False)
    last = steps[-1]
    n = last.instances
    kernel = sum(last.kernel_delta.values())
    prev_used = steps[-2].used_delta if len(steps) > 1 else 0.0
    from_used = {"raw": round(last.used_delta / n, 2),
                 "adjusted": round((last.used_delta - kernel) / n, 2),
                 "marginal": round((last.used_delta - prev_used) / last.added, 2)}
    # Every started instance holds memory: a cost of 0 or less is the host's other
    # processes freeing memory meanwhile, never a result (PSS counts the instances alone).
    impossible = {name: value for name, value in from_used.items() if value <= 0}
    note = None
    if impossible:
        note = (" and ".join(f"{name} {value:.1f}" for name, value in impossible.items())
                + " MiB per instance: no instance costs that; other processes on the host "
                "freed memory while these started, so the host's used memory says nothing "
                "of them here; PSS stands")
    kept = {name: None if name in impossible else value for name, value in from_used.items()}
    warning = None
    if not outcome.ksm and last.merged:
        warning = (f"KSM had merged {last.merged:,.0f} MiB of these instances although this "
                   "study ran with KSM off (another process turned it on meanwhile): their "
                   "PSS is up to that much lower than with KSM off")
    return Summary(
        outcome.target, outcome.ksm, n, outcome.stopped, kept["raw"], kept["adjusted"],
        round(last.pss / n, 2), kept["marginal"],
        all(s.answering == s.instances for s in steps), last.settled, note,
        last.answering, last.http_slowest, last.http_wait, last.host_busy,
        last.instances_cpu, last.cpus, outcome.detail, warning,
        None if last.guest_ram is None else round(last.guest_ram / n, 2))


def vmm_line(summary: Summary) -> str | None:
    """What a guest's PSS is made of: its RAM, and its VMM's own process beyond it (None:
    no guest)."""
    if summary.guest_ram is None or summary.pss is None or not summary.instances:
        return None
    own = summary.pss - summary.guest_ram
    return (f"{summary.target} (KSM {'on' if summary.ksm else 'off'}): PSS "
            f"{summary.pss:.1f} MiB per instance = guest RAM {summary.guest_ram:.1f} MiB "
            f"+ the VMM's own process {own:.1f} MiB (its code, heap and devices)")


def http_line(summary: Summary) -> str | None:
    """The last step's HTTP check in words: how many answered and the slowest; with the
    CPU the idle instances took, and whether the host's CPUs were the limit (None: not
    measured)."""
    if not summary.instances or summary.http_wait is None:
        return None
    n = summary.instances
    line = (f"{summary.target} (KSM {'on' if summary.ksm else 'off'}): "
            f"{summary.answering}/{n} answered HTTP within {summary.http_wait:g} s"
            + (f", the slowest after {summary.http_slowest:.1f} s"
               if summary.http_slowest is not None else ""))
    if summary.host_busy is None or summary.instances_cpu is None:
        return line
    cpus = summary.cpus or 1
    line += (f"; idle, the {n} instances took {summary.instances_cpu:.2f} of the host's "
             f"{cpus} CPUs ({summary.instances_cpu / n * 100:.2f}% of one each), "
             f"the host was {summary.host_busy:.0f}% busy")
    if summary.host_busy >= SATURATED:
        # Limit: some did not answer; else the CPUs only slowed the answers.
        others = max(0.0, summary.host_busy / 100 * cpus - summary.instances_cpu)
        line += (f": the host's {cpus} CPUs "
                 + ("are the limit" if summary.answering < n else "were saturated")
                 + (f", {others:.2f} of them busy with other processes than the instances"
                    if others >= summary.instances_cpu else ""))
    return line


def ratios(summaries: Sequence[Summary]) -> dict[tuple[str, bool], float]:
    """(target, ksm) -> adjusted cost relative to the cheapest target with the same KSM
    setting: how many of the cheapest fit in the memory of one of it. Only where two
    targets or more have a positive cost: a target alone is cheapest by default."""
    found = {}
    for with_ksm in (False, True):
        costs = {s.target: s.adjusted for s in summaries
                 if s.ksm == with_ksm and s.adjusted is not None and s.adjusted > 0}
        if len(costs) > 1:
            cheapest = min(costs.values())
            found.update({(t, with_ksm): round(c / cheapest, 2) for t, c in costs.items()})
    return found


# --- stored ------------------------------------------------------------------------------

def _mb(name: str, value: float, dims: dict[str, str] | None = None,
        unit: str = "MiB") -> Metric:
    return Metric(name, float(value), unit, False, dims or {})


def step_metrics(step: Step) -> list[Metric]:
    """One step as metrics with its instance count as a dimension (phase "step")."""
    dims = {records.INSTANCES: str(step.instances)}
    metrics = [_mb(records.USED_DELTA, step.used_delta, dims),
               _mb(records.PSS_TOTAL, step.pss, dims),
               _mb("rss total", step.rss, dims),
               Metric("answering", float(step.answering), "instances", True, dims),
               Metric("settle time", step.settle_seconds, "s", False, dims),
               Metric("start time", step.start_seconds, "s", False, dims),
               _mb("available", step.available, dims)]
    metrics += [_mb(f"{k} delta", v, dims) for k, v in step.kernel_delta.items()]
    if step.host_busy is not None and step.instances_cpu is not None:
        metrics += [Metric("host cpu busy", step.host_busy, "%", False, dims),
                    Metric("instances cpu", step.instances_cpu, "cores", False, dims)]
    metrics += [Metric(f"ksm {k}", float(v), "pages", k == "pages_sharing", dims)
                for k, v in step.ksm.items()]
    metrics += [Metric(records.KSM_SAVED, saved, "MiB", True,
                       {**dims, records.SECONDS: f"{seconds:g}"})
                for seconds, saved in curve_points(step.ksm_curve)]
    return metrics


CURVE_READINGS = 24   # per step, stored as metrics (the step's JSON keeps every reading)


def curve_points(curve: Sequence[Sequence[float]],
                 most: int = CURVE_READINGS) -> list[tuple[float, float]]:
    """(seconds, MiB KSM saved) of a step's merge curve, at most `most` readings of it
    evenly spread, its first and last always among them."""
    if not curve:
        return []
    count = min(most, len(curve))
    picks = sorted({round(i * (len(curve) - 1) / max(1, count - 1)) for i in range(count)})
    return [(float(curve[i][0]), round(curve[i][1] * PAGE_MIB, 2)) for i in picks]


SPARKS = "▁▂▃▄▅▆▇█"


def ksm_curve_line(outcome: Outcome, width: int = 40) -> str | None:
    """KSM's merge curve over the whole study in one line: a sparkline of the memory it
    saved over time, where it ended and when it first came within 10% of that (None: KSM
    off or no reading)."""
    readings = [(t, pages * PAGE_MIB) for step in outcome.steps for t, pages in step.ksm_curve]
    if not outcome.ksm or not readings:
        return None
    readings.sort()
    end_t, end = readings[-1]
    first_t = readings[0][0]
    top = max(v for _, v in readings) or 1.0
    sparks = ""
    for i in range(width):
        at = first_t + (end_t - first_t) * i / max(1, width - 1)
        value = next(v for t, v in reversed(readings) if t <= at + 1e-9)
        sparks += SPARKS[min(len(SPARKS) - 1, int(value / top * len(SPARKS)))]
    near = next(t for t, v in readings if v >= 0.9 * end) if end > 0 else end_t
    return (f"KSM merge curve, {outcome.target}: {sparks} {readings[0][1]:,.0f} → "
            f"{end:,.0f} MiB saved from {first_t:,.0f} to {end_t:,.0f} s of the study "
            f"({outcome.steps[-1].instances} instances; within 10% of the end by "
            f"{near:,.0f} s)")


def summary_metrics(summary: Summary, ratio: float | None) -> list[Metric]:
    """The study's outcome; the first is what `vmtax show` headlines."""
    metrics = []
    for name, value in (("memory per instance", summary.raw),
                        ("memory per instance adjusted", summary.adjusted),
                        ("pss per instance", summary.pss),
                        ("marginal per instance", summary.marginal),
                        ("guest ram pss per instance", summary.guest_ram),
                        ("vmm pss per instance beyond guest ram",
                         None if summary.guest_ram is None or summary.pss is None
                         else round(summary.pss - summary.guest_ram, 2))):
        if value is not None:
            metrics.append(_mb(name, value))
    metrics.append(Metric("instances", float(summary.instances), "instances", True))
    if ratio is not None:
        metrics.append(Metric("density ratio", ratio, "x", False))
    return metrics


def params(with_ksm: bool) -> dict[str, str]:
    return {records.KSM: "on" if with_ksm else "off"}


def load_outcomes(run: Any) -> list[Outcome]:
    """The outcomes of a stored density run (vmtax.results.store.Run), from its step reps."""
    found: dict[tuple[str, bool], Outcome] = {}
    for rep in run.reps:
        if rep.workload != WORKLOAD or rep.phase != records.STEP or not rep.stdout:
            continue
        with_ksm = rep.params.get(records.KSM) == "on"
        key = (rep.target, with_ksm)
        if key not in found:
            found[key] = Outcome(rep.target, with_ksm, [], "", 0.0)
        found[key].steps.append(Step(**json.loads(rep.stdout)))
    for rep in run.reps:
        if rep.workload == WORKLOAD and rep.phase == "measure":
            key = (rep.target, rep.params.get(records.KSM) == "on")
            if key in found and rep.stdout:
                stored = json.loads(rep.stdout)
                found[key].stopped = stored.get("stopped", "")
                found[key].detail = stored.get("detail", "")
    return list(found.values())


def json_step(step: Step) -> str:
    """A step as stored in its rep's stdout (load_outcomes reads it back)."""
    return json.dumps(asdict(step), sort_keys=True)


def json_summary(outcome: Outcome) -> str:
    return json.dumps({"stopped": outcome.stopped, "baseline_used": outcome.baseline_used,
                       "detail": outcome.detail})


# --- across runs -------------------------------------------------------------------------

@dataclass
class StoredStudy:
    """A density run's summaries, as its targets are named across runs."""
    run_id: str
    summaries: list[Summary]
    kinds: dict[str, str]         # target label -> target kind
    kernel: str                   # the host's kernel release when it ran
    curves: list[str] = field(default_factory=list)   # ksm_curve_line of each KSM-on study


def stored_study(run: Any, results: str | os.PathLike[str] | None = None) -> StoredStudy:
    """The summaries of a stored density run (vmtax.results.store.Run, loaded with its output,
    from the results directory results); VmtaxError in one line when it is not one or
    measured nothing."""
    kind = run.plan.get("kind") if isinstance(run.plan, dict) else None
    if kind != WORKLOAD:
        what = f"a {kind} run" if kind else "a run of workloads"
        raise VmtaxError(f"run {run.id} is not a density run ({what}); "
                         f"`{hints.command('runs', results=results)}` lists them, "
                         f"`{hints.command('density', results=results)}` makes them")
    outcomes = load_outcomes(run)
    if not outcomes:
        raise VmtaxError(f"run {run.id} is a density run without a measured step "
                         f"(status {run.status}); "
                         f"`{hints.command('show', run.id, results=results)}` lists why")
    kinds = {t["name"]: t.get("kind", "") for t in run.plan.get("targets", [])
             if isinstance(t, dict) and "name" in t}
    kinds.update({name: t.get("kind", kinds.get(name, "")) for name, t in run.targets.items()})
    return StoredStudy(run.id, [summarize(o) for o in outcomes], kinds,
                       str(run.host.get("kernel", "")),
                       [line for o in outcomes if (line := ksm_curve_line(o))])


def combine(studies: Sequence[StoredStudy]) -> tuple[list[tuple[str, Summary]],
                                                     dict[str, str]]:
    """Every study's summaries side by side: [(run id, summary)] with targets relabelled
    "NAME (RUN)" where a name comes from more than one run (so ratios() keeps them apart),
    and label -> kind."""
    runs_of: dict[str, set[str]] = {}
    for study in studies:
        for s in study.summaries:
            runs_of.setdefault(s.target, set()).add(study.run_id)
    rows, kinds = [], {}
    for study in studies:
        for s in study.summaries:
            label = s.target if len(runs_of[s.target]) == 1 else f"{s.target} ({study.run_id})"
            rows.append((study.run_id, Summary(**{**asdict(s), "target": label})))
            kinds[label] = study.kinds.get(s.target, "")
    return rows, kinds


def ratio_lines(summaries: Sequence[Summary]) -> list[str]:
    """Per KSM setting measured: each target's memory per instance against the cheapest
    target's, in words: adjusted (where both are positive: on a busy host, used memory
    can move more than the instances add) and PSS (the instances' own processes)."""
    lines = []
    for with_ksm in (False, True):
        measured = sorted((s for s in summaries if s.ksm == with_ksm and s.pss),
                          key=lambda s: s.pss or 0.0)
        if len(measured) < 2:
            continue
        base = measured[0]
        parts = []
        for s in measured[1:]:
            assert s.pss is not None and base.pss is not None   # measured
            words = f"{s.target} PSS {s.pss:.1f} MiB = {s.pss / base.pss:.2f}×"
            if s.adjusted and base.adjusted and s.adjusted > 0 and base.adjusted > 0:
                words += (f", adjusted {s.adjusted:.1f} MiB = "
                          f"{s.adjusted / base.adjusted:.2f}×")
            parts.append(words)
        lines.append(f"KSM {'on' if with_ksm else 'off'}, per instance against "
                     f"{base.target} (PSS {base.pss:.1f} MiB"
                     + (f", adjusted {base.adjusted:.1f} MiB" if base.adjusted
                        and base.adjusted > 0 else "") + "): " + "; ".join(parts))
    return lines
