"""Running a `vmtax tune` search (vmtax.studies.tune says what one is): its two stages, each
a Runner whose repetitions beyond the fixed ones race (Race, a RepetitionPolicy), the
winners combined, under a guarded journal."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, ContextManager, NoReturn

from vmtax.analysis import tune as tuning
from vmtax.core import target as targets
from vmtax.core.errors import VmtaxError
from vmtax.core.workload import Workload
from vmtax.host.journal import Journal
from vmtax.results.store import Store
from vmtax.studies import estimate, tune
from vmtax.studies.plan import Plan
from vmtax.studies.repetitions import Cell, Unit
from vmtax.studies.runner import Reporter, Runner
from vmtax.studies.tune import MIN_RUNS, STOP_MARGIN, Knob, Search


def _cell(workload: Workload) -> tuple[str, str]:
    return workload.name, json.dumps(workload.params, sort_keys=True)


class Race:
    """The repetition policy of a tune stage: a cell's repetitions beyond the fixed ones
    follow the racing rule over `pairs` and stop at the stage's deadline; each cell races
    for an equal share of what is left once the fixed repetitions of the cells after it
    are paid for."""

    def __init__(self, plan: Plan, pairs: list[tuple[str, str]], rule: tuning.RaceRule,
                 stage_end: float):
        self.plan = plan
        self.pairs = pairs
        self.rule = rule
        self.stage_end = stage_end
        startup = sum(targets.get(t.kind).startup_seconds for t in plan.targets)
        # Each cell's fixed repetitions, by (workload, parameters), in the order they run.
        self.fixed = {_cell(spec.make(plan.time)):
                      estimate.estimate(replace(plan, workloads=[spec])).seconds - startup
                      for spec in plan.workloads}
        self.raced: set[tuple[str, str]] = set()

    def _open(self, cell: Cell) -> bool:
        spec = cell.workload.metric_spec(cell.workload.primary_metric())
        return spec is not None and any(
            self.rule.state(cell.values[a], cell.values[b], spec.higher_is_better) == "open"
            for a, b in self.pairs if a in cell.values and b in cell.values)

    def resumed(self, cell: Cell) -> list[Unit]:
        """A resumed cell whose race is still open gets one more baseline repetition, so it
        races on."""
        if not self.pairs or not self._open(cell):
            return []
        base = self.pairs[0][0]
        return [Unit(base, "measure", self.plan.warmup + cell.attempts[base])]

    def more(self, cell: Cell) -> None:
        workload = cell.workload
        self.raced.add(_cell(workload))
        later = [c for c in self.fixed if c not in self.raced]
        left = self.stage_end - time.monotonic() - sum(self.fixed[c] for c in later)
        deadline = time.monotonic() + left / (len(later) + 1)
        spec = workload.metric_spec(workload.primary_metric())
        assert spec is not None   # a workload's primary metric is in its manifest
        assert self.plan.max_runs is not None   # a stage's plan has one (singles_plan)
        # All the cell's targets: a resumed cell may have left only some to run. A copy:
        # race() adds each value itself, as cell.measure does to the cell's.
        values = {t: list(v) for t, v in cell.values.items()}
        pairs = [p for p in self.pairs if p[0] in values and p[1] in values]
        tuning.race(values, pairs, spec.higher_is_better, self.rule,
                    lambda name: cell.measure(name, "racing"), self.plan.max_runs,
                    lambda: time.monotonic() < deadline)


@dataclass
class Outcome:
    singles: str                    # run ids
    combined: str | None
    summary: tuning.TuneSummary


def _stored(store: Store, name: str) -> tuple[str, str] | None:
    """(id, status) of the latest run of that name, or None."""
    try:
        run_id = store.resolve(name)
    except VmtaxError:
        return None
    status = next((r["status"] for r in store.list_runs() if r["id"] == run_id), "failed")
    return run_id, status


def _finished(store: Store, plan: Plan) -> bool:
    """Whether the stage of plan is stored, done (a resumed search reuses it)."""
    stored = _stored(store, plan.name or "")
    return stored is not None and stored[1] == "done"


def _stage(search: Search, store: Store, plan: Plan, pairs: list[tuple[str, str]],
           stage_end: float, reporter: Reporter | None, journal: Journal | None,
           resume: bool) -> str:
    stored = _stored(store, plan.name or "") if resume else None
    if stored is not None and stored[1] == "done":
        return stored[0]
    rule = tuning.RaceRule(alpha=search.alpha, tests=max(1, len(pairs)) * len(plan.workloads),
                           min_runs=min(plan.runs, MIN_RUNS))
    runner = Runner(plan, store, reporter, resume=stored[0] if stored else None,
                    journal=journal, repetitions=Race(plan, pairs, rule, stage_end))
    return runner.execute()


def tuned_options(search: Search, winners: list[Knob]) -> tuple[dict[str, Any], list[str]]:
    """The winners' values together, best first; a value the others make impossible on
    this host (Options.problems) is left out, and said."""
    tuned: dict[str, Any] = {}
    notes = []
    for knob in winners:
        if knob.option in tuned:
            continue
        problem = tune.host_problem(search.baseline, {**tuned, knob.option: knob.value})
        if problem is None:
            tuned[knob.option] = knob.value
        else:
            notes.append(f"{knob.label} left out of the combination: {problem}")
    return tuned, notes


def run(search: Search, store: Store, reporter: Reporter | None = None,
        journal: Journal | None = None, resume: bool = False,
        on_stage: Callable[[str, str], None] | None = None) -> Outcome:
    """The whole search; returns the runs and their verdicts. on_stage(stage, text) hears
    what each stage is about to do."""
    if resume and _stored(store, search.run_name("singles")) is None:
        raise VmtaxError(f"--resume: no stored search to continue (no run named "
                         f"{search.run_name('singles')}); run it without --resume")
    started = time.monotonic()
    end = started + search.budget - STOP_MARGIN
    _, combined_minimum = search.minimum_seconds()
    singles_plan = search.singles_plan()
    base = search.baseline.name
    pairs = [(base, t.name) for t in singles_plan.targets if t.name != base]
    if on_stage and resume and _finished(store, singles_plan):
        on_stage("singles", "already done, its stored runs reused")
    elif on_stage:
        until = time.time() + (end - started - combined_minimum)
        done_by = time.time() + search.budget
        values = f"{len(search.knobs)} knob value{'s' if len(search.knobs) > 1 else ''}"
        on_stage("singles", f"{values} and the control against "
                 f"{base}: racing until {time.strftime('%H:%M:%S', time.localtime(until))}, "
                 f"the whole search done by {time.strftime('%H:%M:%S', time.localtime(done_by))}")
    singles = _stage(search, store, singles_plan, pairs, end - combined_minimum, reporter,
                     journal, resume)
    first = tuning.summarize(store.load_run(singles), alpha=search.alpha,
                             method=search.method)
    winners = [Knob(k.option, k.value, k.safety) for k in first.winners() if k.option]
    tuned, notes = tuned_options(search, winners)
    first.notes += search.notes + notes
    if not tuned:
        smallest = first.resolution_text()
        first.notes.append("no knob value won on any workload: nothing to combine, the "
                           "baseline stays as it is" + (
                               f"; a knob gaining less than the control's interval "
                               f"({smallest}) could not have won here" if smallest else ""))
        return Outcome(singles, None, first)
    if time.monotonic() + combined_minimum > end and not (
            resume and _stored(store, search.run_name("combined"))):
        first.notes.append(
            "the budget ran out before the winners could be confirmed together (~"
            f"{estimate.duration(combined_minimum)} more): their verdicts above stand alone; "
            "a larger --budget confirms them")
        return Outcome(singles, None, first)
    best = winners[0]
    alone = tuned == {best.option: best.value}   # the combination is the best single
    combined_plan = search.combined_plan(tuned, None if alone else best)
    tuned_name = tuning.tuned_name(base)
    pairs = [(base, tuned_name)]
    if not alone:
        pairs.append((tuning.knob_name(base, best.option, best.value), tuned_name))
    if on_stage and resume and _finished(store, combined_plan):
        on_stage("combined", "already done, its stored runs reused")
    elif on_stage:
        on_stage("combined", f"{', '.join(tuning.knob_label(k, v) for k, v in tuned.items())} "
                 f"together against {base}" + (f" and {best.label}" if len(pairs) > 1 else ""))
    combined = _stage(search, store, combined_plan, pairs, end, reporter, journal, resume)
    summary = tuning.summarize(store.load_run(singles), store.load_run(combined),
                               alpha=search.alpha, method=search.method)
    summary.notes += search.notes + notes
    return Outcome(singles, combined, summary)


def guarded(search: Search, store: Store, progress: ContextManager[Reporter],
            recovered: Callable[[str], None], stopped: Callable[[], NoReturn],
            resume: bool = False, on_stage: Callable[[str, str], None] | None = None
            ) -> Outcome:
    """run() as a command runs it: under a guarded journal (what crashed runs left undone
    first, each said to recovered), with progress; a Ctrl-C or SIGTERM ends in stopped()
    (every repetition so far is stored)."""
    from vmtax.studies.session import guarded_journal

    try:
        with guarded_journal(recovered) as own, progress as reporter:
            return run(search, store, reporter, own, resume, on_stage)
    except KeyboardInterrupt:
        stopped()
