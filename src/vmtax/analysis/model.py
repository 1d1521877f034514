"""One stored run, analysed once: the model every view of a run renders (the terminal's
headline, the HTML report), so that no renderer calls analysis again and every view shows
the same numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vmtax.analysis import composite, profile
from vmtax.analysis import summary as analysis
from vmtax.analysis import tune as tuning
from vmtax.analysis.composite import ClassIndex, Standing
from vmtax.analysis.summary import Cell, Row, RunSummary
from vmtax.results.store import Run


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
    # A `vmtax tune` stage's verdicts (its forest plot); None: not a tune run.
    tune: tuning.TuneSummary | None = None

    @property
    def explanations(self) -> list[str]:
        return [line for _, line in self.explained]

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
    return RunModel(run=run, summary=summary, headline=analysis.headline(summary.rows),
                    classes=composite.composite(summary) if others else [],
                    explained=composite.explained(summary),
                    standings=_contenders(run, composite.standings(summary)),
                    hypotheses=profile.top_hypotheses(run), worst=_worst(summary),
                    tune=tuning.summarize_stage(run) if tuning.is_tune_run(run) else None)


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
