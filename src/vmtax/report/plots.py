"""Figures of a run, drawn from its `RunSummary` so they match every table.

Each kind of figure is one builder `f(summary, labels) -> [Chart]`, listed in BUILDERS:
  normalized_bars   E1/E3: per workload, every target's ratio to the baseline, CI whiskers
  distributions     per workload, every repetition of its primary metric, beside the bars
  sweeps            E5: a metric against a swept parameter, one line per configuration
  declared          the figures a workload declares (vmtax.core.figures) instead of these
                    three: E4's p99 latency against the offered rate, requests/s per endpoint

Figures are built on bare `Figure` objects (no pyplot), so nothing depends on a display
or on global figure state, and rendered as PNG, SVG or SVG cleaned up for inlining.
"""


from __future__ import annotations

from collections.abc import Callable
from typing import Any

import matplotlib

from vmtax.analysis.model import StudyRecords
from vmtax.analysis.summary import RunSummary
from vmtax.analysis.tune import TuneSummary
# The figure machinery and the builders live in modules of their own; their names used
# elsewhere stay reachable here.
from vmtax.report.figure import (BAR_SIZE, DPI, STYLE, SWEEP_SIZE, Chart, figure_labels,
                                 inline_svg, render, target_colors)
from vmtax.report.study_plots import boot_ecdf, density_ksm, density_memory, tune_forest
from vmtax.report.summary_plots import declared, distributions, normalized_bars, numeric, sweeps

__all__ = ["BAR_SIZE", "DPI", "SWEEP_SIZE", "Chart", "inline_svg", "render", "target_colors",
           "boot_ecdf", "density_ksm", "density_memory", "tune_forest", "numeric", "charts",
           "run_charts"]

# -- all figures, rendering --------------------------------------------------------------------

Builder = Callable[[RunSummary, dict[str, str]], list[Chart]]
BUILDERS: list[Builder] = [normalized_bars, distributions, sweeps, declared]


def charts(summary: RunSummary, labels: dict[str, str]) -> list[Chart]:
    labels = figure_labels(labels)
    with matplotlib.rc_context(STYLE):
        made = [chart for build in BUILDERS for chart in build(summary, labels)]
    # slugs name files and HTML ids: two workloads that slugify alike must not collide
    seen: dict[str, int] = {}
    for chart in made:
        seen[chart.slug] = seen.get(chart.slug, 0) + 1
        if seen[chart.slug] > 1:
            chart.slug += f"-{seen[chart.slug]}"
    return made


def run_charts(run: Any, labels: dict[str, str], records: StudyRecords,
               tune: TuneSummary | None = None) -> list[Chart]:
    """Figures drawn from what a study stored instead of repetitions (E4: records, read
    by analysis.model.study_records), and a tune stage's (tune: its verdicts,
    RunModel.tune)."""
    return [*density_memory(run, labels, records.density), *density_ksm(records.ksm, labels),
            *boot_ecdf(records.starts, labels), *tune_forest(tune, labels)]
