"""One self-contained HTML file per report: findings, figures (inline SVG), the summary
table of every metric, fingerprints and failures of one or more stored runs.

Everything shown comes from `analysis.summarize_run`, like the terminal table and
`vmtax show --json`, so the three always agree. The page has no scripts and loads
nothing: it opens offline and can be mailed as one file.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import jinja2

from vmtax import __version__, analysis, plots, report
from vmtax.analysis import Cell, Row, RunSummary
from vmtax.export import flatten
from vmtax.store import Run

# The classes of performance that verdicts are given for, in the order they are shown; a
# metric joins the class its workload's manifest names (`MetricSpec.group`).
CLASS_ORDER = ["CPU", "memory", "disk I/O", "network", "threads/scheduling", "latency"]
# Failed repetitions alike in these are listed once, with a count.
FAILURE_KEYS = ("target", "workload", "phase", "status", "error")


def workload_class(workload: str, metric: str) -> str | None:
    spec = analysis.metric_spec(workload, metric)
    return spec.group if spec is not None else None


@dataclass
class Standing:
    """How much of the baseline one target keeps in one class."""
    target: str
    keeps: float                          # geometric mean of the ratios
    ratios: list[tuple[Row, Cell]]        # each metric counted, with the target's cell

    @property
    def flags(self) -> list[str]:
        """Sanity flags on the metrics counted: the verdict is only as good as they are."""
        return sorted({f for _, cell in self.ratios for f in cell.flags})

    @property
    def worst(self) -> tuple[Row, Cell]:
        return min(self.ratios, key=_ratio)

    @property
    def best(self) -> tuple[Row, Cell]:
        return max(self.ratios, key=_ratio)


@dataclass
class Flag:
    kind: str
    target: str
    row: Row
    detail: str


@dataclass
class Findings:
    classes: dict[str, list[Standing]]    # class -> standings, best first
    worst: dict[str, tuple[Row, Cell]]    # target -> its lowest-ratio classified metric
    flags: list[Flag]
    failures: list[dict[str, Any]]        # grouped: target, workload, phase, error, count


def _usable(ratio: float | None) -> bool:
    return ratio is not None and math.isfinite(ratio) and ratio > 0


def _ratio(pair: tuple[Row, Cell]) -> float:
    """The ratio of a cell the findings count (they count only cells with a usable one)."""
    ratio = pair[1].ratio
    if ratio is None:
        raise ValueError(f"{pair[0].workload} {pair[0].metric}: a cell without a ratio")
    return ratio.value


def findings(summary: RunSummary) -> Findings:
    ratios: dict[str, dict[str, list[tuple[Row, Cell]]]] = {}
    worst: dict[str, tuple[Row, Cell]] = {}
    for row in summary.rows:
        cls = workload_class(row.workload, row.metric)
        if cls is None:
            continue
        for target, cell in row.cells.items():
            if cell.ratio is None or not _usable(cell.ratio.value):
                continue
            ratios.setdefault(cls, {}).setdefault(target, []).append((row, cell))
            if target not in worst or cell.ratio.value < _ratio(worst[target]):
                worst[target] = (row, cell)
    classes = {}
    for cls in [*CLASS_ORDER, *sorted(set(ratios) - set(CLASS_ORDER))]:
        standings = [Standing(t, _geomean([_ratio(p) for p in pairs]), pairs)
                     for t, pairs in ratios.get(cls, {}).items()]
        if standings:
            classes[cls] = sorted(standings, key=lambda s: s.keeps, reverse=True)
    flags = [Flag(kind, target, row, _flag_detail(kind, cell))
             for row in summary.rows for target, cell in row.cells.items() for kind in cell.flags]
    grouped: dict[tuple, dict[str, Any]] = {}
    for f in summary.failures:
        key = tuple(f[k] for k in FAILURE_KEYS)
        grouped.setdefault(key, {**dict(zip(FAILURE_KEYS, key)), "count": 0})["count"] += 1
    return Findings(classes, worst, flags, list(grouped.values()))


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def _flag_detail(kind: str, cell: Cell) -> str:
    s, r = cell.summary, cell.ratio
    if kind == "noisy" and s is not None and s.cv is not None:
        return (f"coefficient of variation {s.cv:.1%} over {s.n} runs "
                f"(above {analysis.NOISY_CV:.0%}): more runs, or a quieter host")
    if kind == "faster than baseline" and r is not None:
        return (f"×{report.fmt(r.value)} [{report.fmt(r.ci_low)}, {report.fmt(r.ci_high)}]: "
                "suspicious; look for page-cache "
                "effects, a guest clock that drifts, or work the target skips")
    if kind == analysis.TOO_SHORT and cell.duration is not None:
        return (f"its repetitions last {report.duration(cell.duration)} (median), under "
                f"{report.duration(analysis.MIN_DURATION)}: start-up and timer resolution "
                "weigh as much as the work; run longer (the plan's time, or more work per run)")
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


def build(run: Run) -> RunReport:
    summary = analysis.summarize_run(run)
    labels = {t: report.target_label(run, t) for t in summary.targets}
    return RunReport(run=run, summary=summary, labels=labels,
                     colors=plots.target_colors(summary), charts=plots.charts(summary, labels),
                     findings=findings(summary),
                     workloads=list(dict.fromkeys(r.workload for r in summary.rows)))


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
    return [(k, ", ".join(map(str, v)) if isinstance(v, list) else str(v))
            for k, v in flatten(data).items()]


_ENV = jinja2.Environment(loader=jinja2.PackageLoader("vmtax", "templates"), autoescape=True,
                          undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
_ENV.filters.update(fmt=report.fmt, interval=report.interval, pct=pct, ratio_class=ratio_class,
                    flag_text=report.flag_text,
                    params=params_text, when=when, fingerprint=fingerprint_items, repr=repr)
_ENV.tests["finite"] = math.isfinite


def render_html(reports: list[RunReport]) -> str:
    svgs = {(i, c.slug): plots.inline_svg(c, prefix=f"r{i}-{c.slug}-")
            for i, r in enumerate(reports) for c in r.charts}
    return _ENV.get_template("report.html.j2").render(
        reports=reports, svgs=svgs, version=__version__, generated=when(time.time()),
        noisy_cv=analysis.NOISY_CV)
