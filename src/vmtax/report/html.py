"""One self-contained HTML file per report: findings, figures (inline SVG), the summary
table of every metric, fingerprints and failures of one or more stored runs.

Everything shown comes from one analysis of each run (`analysis.model.analyse`), like the
terminal table and `vmtax show --json`, so the three always agree, and two runs' comparison
from one `analysis.model.compare`: this module only renders them, it computes nothing of
analysis's again. The page loads nothing: it opens offline and can be mailed as one file.
It holds no script but a profiled run's flame graphs' own (their search, in their SVG).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import jinja2

from vmtax import __version__
from vmtax.analysis import composite
from vmtax.analysis import stats
from vmtax.analysis import summary as analysis
from vmtax.analysis.composite import Standing
from vmtax.analysis.model import RunComparison, RunModel
from vmtax.analysis.profile import CellProfile
from vmtax.analysis.summary import Cell, Row, RunSummary
from vmtax.core.text import page_text
from vmtax.report import flamegraph, parts, plots
from vmtax.report.export import flatten
from vmtax.results.store import Run

# Failed repetitions alike in these are listed once, with a count.
FAILURE_KEYS = ("target", "workload", "phase", "status", "error")


@dataclass
class Flag:
    kind: str
    target: str
    row: Row
    detail: str


@dataclass
class Findings:
    classes: dict[str, list[Standing]]    # class -> composite standings, best first
    worst: dict[str, tuple[Row, Cell]]    # target -> its lowest-ratio classified metric
    flags: list[Flag]
    failures: list[dict[str, Any]]        # grouped: target, workload, phase, error, count


def findings(model: RunModel) -> Findings:
    # The flags report.flags_line counts: those of the primary metrics.
    flags = [Flag(kind, target, row, _flag_detail(kind, cell))
             for row in model.headline for target, cell in row.cells.items()
             for kind in cell.flags]
    grouped: dict[tuple, dict[str, Any]] = {}
    for f in model.summary.failures:
        key = tuple(f[k] for k in FAILURE_KEYS)
        grouped.setdefault(key, {**dict(zip(FAILURE_KEYS, key)), "count": 0})["count"] += 1
    return Findings(model.standings, model.worst, flags, list(grouped.values()))


def _flag_detail(kind: str, cell: Cell) -> str:
    s, r = cell.summary, cell.ratio
    if kind == "noisy" and s is not None and s.cv is not None:
        return (f"coefficient of variation {s.cv:.1%} over {s.n} runs "
                f"(above {analysis.NOISY_CV:.0%}): more runs, or a quieter host")
    if kind == "faster than baseline" and r is not None:
        few = ("" if r.interval == "ci" else
               f" (too few runs to test it, n={cell.n}: flagged as it clears 1 by more than "
               f"{stats.SUSPICIOUS_MARGIN:.0%} over the runs' whole range)")
        return (f"×{parts.sig3(r.value)}{parts.ratio_interval(r)}{few}: "
                "suspicious; look for page-cache "
                "effects, a guest clock that drifts, or work the target skips")
    if kind == analysis.TOO_SHORT and cell.duration is not None:
        return (f"its repetitions last {parts.duration(cell.duration)} (median), too short "
                "to time: start-up and timer resolution weigh as much as the work; run "
                "longer (the plan's time, or more work per run)")
    if kind == "clock skew":
        return (f"guest and host clocks disagreed by more than {analysis.CLOCK_TOLERANCE:.0%} "
                "on a repetition: rates measured by the guest's clock are not to be trusted")
    return ""


# -- presentation ------------------------------------------------------------------------------

@dataclass
class RunReport:
    run: Run
    summary: RunSummary
    labels: dict[str, str]                # target -> display name
    colors: dict[str, str]                # target -> chart colour
    charts: list[plots.Chart]
    findings: Findings
    workloads: list[str] = field(default_factory=list)
    flags_line: str = ""                  # the primary metrics' flags, counted, in one line
    host: str | None = None               # the fleet host whose results these are
    # E3's composite index per class and overall (vmtax.analysis.composite), and each suspicious
    # win's likely cause by class (None: a metric in no class).
    composite: list[composite.ClassIndex] = field(default_factory=list)
    explained: dict[str | None, list[str]] = field(default_factory=dict)
    # Per profiled target, its profile's strongest hypothesis of where the time goes.
    hypotheses: dict[str, str] = field(default_factory=dict)
    profiles: list[CellProfile] = field(default_factory=list)   # the flame graphs' cells
    measured: str = ""                    # "3 measured runs" per cell (RunModel.measured)
    # Per workload, the parameters it ran with (parts.workload_parameters).
    parameters: dict[str, str] = field(default_factory=dict)


def build(model: RunModel, host: str | None = None, charts: bool = True) -> RunReport:
    """charts=False: the report without its figures, which cost most of its time (publish's
    pages of runs that no change point or newest run singles out)."""
    run, summary = model.run, model.summary
    labels = {t: parts.target_label(run, t) for t in summary.targets}
    explained: dict[str | None, list[str]] = {}
    for cls, line in model.explained:
        explained.setdefault(cls, []).append(line)
    per_metric = _paired(plots.charts(summary, labels)) if charts else []
    own = plots.run_charts(run, labels, model.records, model.tune) if charts else []
    return RunReport(run=run, summary=summary, labels=labels,
                     colors=plots.target_colors(summary),
                     # E4's density and start-up figures after the metrics'; tune's forest
                     # plot, its answer, first.
                     charts=(own + per_metric if model.tune is not None else per_metric + own),
                     measured=model.measured,
                     findings=findings(model),
                     workloads=list(dict.fromkeys(r.workload for r in summary.rows)),
                     flags_line=parts.flags_line(model.headline, model.load_note),
                     host=host,
                     composite=model.classes if len(summary.targets) > 1 else [],
                     explained=explained, hypotheses=model.hypotheses,
                     profiles=model.profiles, parameters=parts.workload_parameters(run.reps))


def _paired(charts: list[plots.Chart]) -> list[plots.Chart]:
    """Each workload's strip of every repetition right after its ratio bars."""
    after = {c.slug.removesuffix("-ratio"): i for i, c in enumerate(charts)
             if c.slug.endswith("-ratio")}
    return [c for _, _, c in sorted(
        (after.get(c.slug.removesuffix("-repetitions"), i) if c.slug.endswith("-repetitions")
         else i, i, c) for i, c in enumerate(charts))]


def pct(ratio: float) -> str:
    """A ratio as a share of the baseline with three significant digits: 78.1%, 4.21%."""
    value = ratio * 100
    digits = max(0, 2 - math.floor(math.log10(abs(value)))) if value else 0
    return f"{value:.{digits}f}%"


def ratio_class(ratio: float | None) -> str:
    """CSS class that shades a ratio cell by how much of the baseline is kept."""
    if ratio is None or not math.isfinite(ratio):
        return ""
    if ratio >= 1.02:
        return "r-gain"
    if ratio >= 0.95:
        return "r-par"
    return "r-mild" if ratio >= 0.8 else "r-loss" if ratio >= 0.5 else "r-severe"


def params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def when(timestamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp)) if timestamp else "–"


def fingerprint_items(data: dict[str, Any]) -> list[tuple[str, str]]:
    """A fingerprint's KEY VALUE pairs as `show --all` writes them (no `None`, no
    `{'pid': …}`, no float's every digit)."""
    return [(k, parts.fingerprint_value(v)) for k, v in flatten(data).items()]


def change(value: float) -> str:
    """A relative change as `vmtax compare` prints it: +4.2%."""
    return "–" if math.isnan(value) else f"{value:+.1%}"


_ENV = jinja2.Environment(loader=jinja2.PackageLoader("vmtax.report", "templates"), autoescape=True,
                          undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
_ENV.filters.update(fmt=parts.fmt, interval=parts.interval, pct=pct, ratio_class=ratio_class,
                    flag_text=parts.flag_text, params=params_text, when=when,
                    fingerprint=fingerprint_items, repr=repr, change=change,
                    change_interval=lambda c: parts.change_interval(c.interval, *c.change_ci),
                    bounds=parts.ratio_interval, ratio=parts.sig3,
                    param_changes=parts.param_changes,
                    keeps_interval=lambda i: parts.bracket(i.interval, pct(i.ci_low),
                                                           pct(i.ci_high)))
_ENV.tests["finite"] = math.isfinite


def render_html(reports: list[RunReport], comparison: RunComparison | None = None,
                spread: list[Any] | None = None) -> str:
    """spread: a fleet run set's vmtax.analysis.spread.SpreadRow list (reports then has one
    per host)."""
    svgs = {(i, c.slug): plots.inline_svg(c, prefix=f"r{i}-{c.slug}-")
            for i, r in enumerate(reports) for c in r.charts}
    return page_text(_ENV.get_template("report.html.j2").render(
        reports=reports, svgs=svgs, comparison=comparison, spread=spread,
        flames={i: flamegraph.graphs(r.profiles, r.summary.baseline, r.labels)
                for i, r in enumerate(reports)},
        version=__version__,
        generated=when(time.time()),
        noisy_cv=analysis.NOISY_CV))
