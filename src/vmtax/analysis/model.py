"""One stored run, analysed once: the model every view of a run renders (the terminal's
headline, the HTML report, Markdown), so that no renderer calls analysis again and every
view shows the same numbers; and two runs compared once (RunComparison), as the HTML
report shows B against A."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from vmtax.analysis import composite, drift, profile
from vmtax.analysis import summary as analysis
from vmtax.analysis import tune as tuning
from vmtax.analysis.composite import ClassIndex, Standing
from vmtax.analysis.profile import CellProfile
from vmtax.analysis.summary import Cell, CompareRow, Row, RunSummary
from vmtax.core.errors import VmtaxError
from vmtax.host import quiet
from vmtax.results import study_records as records
from vmtax.results.study_records import BootStart, DensityPoint, KsmReading
from vmtax.results.store import Run, Store


@dataclass(frozen=True)
class StudyRecords:
    """What a density or boot study stored instead of repetitions, read once for its
    figures (empty for any other run)."""
    # Metric (records.USED_DELTA, records.PSS_TOTAL) -> its value at each density step.
    density: dict[str, list[DensityPoint]]
    starts: list[BootStart]              # every milestone of every cold start
    ksm: list[KsmReading] = field(default_factory=list)   # KSM's merge curve, as read


def study_records(run: Run) -> StudyRecords:
    # A run of workloads (most runs) has none to read.
    if not any(rep.workload in (records.DENSITY, records.BOOT) for rep in run.reps):
        return StudyRecords({}, [])
    return StudyRecords({metric: records.density_points(run, metric)
                         for metric in (records.USED_DELTA, records.PSS_TOTAL)},
                        records.boot_starts(run), records.ksm_readings(run))


@dataclass
class RunModel:
    run: Run
    summary: RunSummary
    # Each workload's primary metrics: the rows the headline, the flags and the cards count.
    headline: list[Row]
    # E3's composite index per class and overall ([] when no target but the baseline ran).
    classes: list[ClassIndex]
    # Each suspicious win's likely cause, with the class of the metric that won.
    explained: list[tuple[str | None, str]]
    # Per class, each target but the baseline with its index, best first.
    standings: dict[str, list[Standing]]
    # Per profiled target, the hypothesis of where its time goes its profile supports most.
    hypotheses: dict[str, str]
    # Per target, its lowest-ratio classified metric among those told apart from the
    # baseline (a 95% CI wholly below 1); a target with none is absent.
    worst: dict[str, tuple[Row, Cell]]
    # Its profiled cells (--collect profile): the report's flame graphs.
    profiles: list[CellProfile]
    records: StudyRecords
    measured: str                        # how many measured runs each cell had (measured_runs)
    # A `vmtax tune` stage's verdicts (its forest plot); None: not a tune run.
    tune: tuning.TuneSummary | None = None
    # The host's load during the run, from its stored facts, when it was busy ("": quiet).
    load_note: str = ""

    @property
    def explanations(self) -> list[str]:
        return [line for _, line in self.explained]

    def interval_kinds(self) -> set[str]:
        """What the headline's ratios and indices of targets but the baseline are: CIs,
        ranges, none (each view's legend says which)."""
        others = [t for t in self.summary.targets if t != self.summary.baseline]
        kinds = {c.ratio.interval for row in self.headline for t in others
                 if (c := row.cells.get(t)) is not None and c.ratio is not None}
        return kinds | {i.interval for ci in self.classes for t, i in ci.by_target.items()
                        if t in others}

    def to_json(self) -> dict[str, Any]:
        """What `vmtax show RUN --json` prints: the run, its summary and its composite
        index."""
        run = self.run
        return {"run": {"id": run.id, "status": run.status, "created": run.created,
                        "finished": run.finished, "host": run.host,
                        "targets": run.targets, "plan": run.plan},
                "summary": self.summary.to_json(),
                "composite": composite.json_of(self.summary.baseline, self.classes,
                                               self.explanations)}


def analyse(run: Run, summary: RunSummary | None = None) -> RunModel:
    """The model of run; summary: its summary if already made (the Runner makes one to
    store the run's flags)."""
    summary = summary or analysis.summarize_run(run)
    others = [t for t in summary.targets if t != summary.baseline]
    profiled = profile.run_cells(run)[0]
    return RunModel(run=run, summary=summary, headline=analysis.headline(summary.rows),
                    classes=composite.composite(summary) if others else [],
                    explained=composite.explained(summary),
                    standings=_contenders(run, composite.standings(summary)),
                    hypotheses=profile.top_hypotheses(profiled), worst=_worst(summary),
                    profiles=profiled, records=study_records(run), measured=measured_runs(run),
                    tune=tuning.summarize_stage(run) if tuning.is_tune_run(run) else None,
                    load_note=quiet.during(run.host))


@dataclass
class RunComparison:
    """Run B against run A, metric by metric, as `vmtax compare A B` judges it."""
    a: str
    b: str
    rows: list[CompareRow]
    alpha: float
    noise_floor: float
    method: str
    # rows split: the secondary ones (a fixed time's total, a fairness spread) are shown
    # only on request.
    primary: list[CompareRow]
    secondary: list[CompareRow]
    # Why the p-values say nothing of the host's drift between runs (drift.within_drift).
    caveat: str = ""

    @property
    def swept(self) -> set[str]:
        """Workloads compared in several configurations: only their rows name them."""
        configs: dict[str, set[str]] = {}
        for row in self.rows:
            configs.setdefault(row.workload, set()).add(repr(sorted(row.params.items())))
        return {w for w, c in configs.items() if len(c) > 1}

    @property
    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row.comparison.verdict] = counts.get(row.comparison.verdict, 0) + 1
        return counts


def compare(a: Run, b: Run, alpha: float = 0.01, noise_floor: float = 0.02,
            method: Literal["holm", "bh"] = "bh",
            store: Store | None = None) -> RunComparison | None:
    """B against A on every target they share; None when they share no metric. With the
    store they came from, a change within the host's drift between earlier runs of their
    name gets no verdict (drift.within_drift)."""
    pairs = [(a, t, b, t) for t in a.targets if t in b.targets]
    if not pairs:
        return None
    try:
        rows = analysis.compare_targets(pairs, alpha=alpha, noise_floor=noise_floor,
                                        method=method)
    except VmtaxError:      # nothing in common: the runs are shown side by side only
        return None
    caveat = ""
    if store is not None:
        rows, caveat = drift.within_drift(store, rows, a, b, alpha)
    secondary = [analysis.is_secondary(row.workload, row.metric) for row in rows]
    return RunComparison(a.id, b.id, rows, alpha, noise_floor, method,
                         primary=[row for row, s in zip(rows, secondary) if not s],
                         secondary=[row for row, s in zip(rows, secondary) if s], caveat=caveat)


def measured_runs(run: Run) -> str:
    """How many measured runs each cell had: the plan's runs, or, where an adaptive rule
    (--runs auto, tune's racing) added some, the range stored."""
    planned = run.plan.get("runs", "?")
    attempts: dict[tuple[str, str, str], int] = {}
    for r in run.reps:
        if r.phase == "measure":
            key = (r.target, r.workload, json.dumps(r.params, sort_keys=True))
            attempts[key] = attempts.get(key, 0) + 1
    if isinstance(planned, int) and attempts and max(attempts.values()) > planned:
        return (f"{min(attempts.values())} to {max(attempts.values())} measured runs "
                f"({planned} fixed, more where the run's adaptive rule asked)")
    return f"{planned} measured run{'' if planned == 1 else 's'}"


def _contenders(run: Run, standings: dict[str, list[Standing]]) -> dict[str, list[Standing]]:
    """standings without a tune run's A-vs-A control: the baseline against itself checks
    the host's noise, it is no configuration to choose."""
    if not tuning.is_tune_run(run):
        return standings
    control = tuning.control_name(str(run.plan.get("baseline")))
    kept = {cls: [s for s in ranked if s.target != control] for cls, ranked in standings.items()}
    return {cls: ranked for cls, ranked in kept.items() if ranked}


def _worst(summary: RunSummary) -> dict[str, tuple[Row, Cell]]:
    worst: dict[str, tuple[Row, Cell]] = {}
    for row in summary.rows:
        spec = analysis.metric_spec(row.workload, row.metric)
        if spec is None or spec.group is None:
            continue
        for target, cell in row.cells.items():
            r = cell.ratio
            # Only a loss beyond noise: a ratio of 0.40 [0.11, 3.1] is no weakest metric.
            if (r is not None and math.isfinite(r.value) and r.value > 0
                    and r.interval == "ci" and r.ci_high < 1
                    and (target not in worst or r.value < _ratio(worst[target]))):
                worst[target] = (row, cell)
    return worst


def _ratio(pair: tuple[Row, Cell]) -> float:
    assert pair[1].ratio is not None
    return pair[1].ratio.value
