"""Figures of a run's summary, so they match every table (the builders plots.BUILDERS
lists): normalized bars, distributions, sweeps, and the figures a workload declares."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from vmtax.analysis.summary import Row, RunSummary
from vmtax.core import figures
from vmtax.core import workload as workloads
from vmtax.report.figure import (BAR_SIZE, DPI, LINESTYLES, LOG_SPAN, MARKERS, MAX_TICKS,
                                 RATIO_AXIS_MAX, STYLE, SWEEP_SIZE, Chart, finite,
                                 metric_label, slugify, target_colors, titled_with_legend)

# -- normalized bars ---------------------------------------------------------------------------

def normalized_bars(summary: RunSummary, labels: dict[str, str]) -> list[Chart]:
    """Per workload: for each metric a group of bars, one per target, as ratio to the
    baseline (baseline = 1, below 1 = worse whatever the metric's direction)."""
    by_workload: dict[str, list[Row]] = {}
    for row in summary.rows:
        # swept ones get line plots instead; secondary ones (a fixed time's total) say
        # nothing of the targets
        if (not row.params and not _declared(row.workload)
                and not row.secondary):
            by_workload.setdefault(row.workload, []).append(row)
    colors = target_colors(summary)
    charts = []
    for workload, rows in by_workload.items():
        # a metric no target has a ratio for (0 on every target, say) would be a lone 1
        rows = [r for r in rows if any(finite(c.ratio.value) for c in r.cells.values() if c.ratio)]
        targets = [t for t in summary.targets if any(t in r.cells for r in rows)]
        if len(targets) < 2:
            continue
        title = f"{workload}: ratio to {labels.get(summary.baseline, summary.baseline)}"
        charts.append(Chart(
            slug=f"{slugify(workload)}-ratio", title=title,
            caption=(f"Median of each target divided by the median of {summary.baseline} "
                     "(the dashed line at 1), inverted for lower-is-better metrics so that "
                     "higher is always better; whiskers are the 95% bootstrap CI of the ratio"
                     + (", or where there are too few runs for one (fewer than 4 a side) the "
                        "range of the runs' ratios, and none from one run a side."
                        if _ranged(rows) else ".")),
            figure=_bar_figure(title, rows, targets, summary.baseline, labels, colors)))
    return charts


def _ranged(rows: list[Row]) -> bool:
    """Whether a ratio of these rows has too few runs for a CI: its whisker is a range."""
    return any(c.ratio is not None and c.ratio.interval != "ci"
               for row in rows for c in row.cells.values())


def _bar_figure(title: str, rows: list[Row], targets: list[str], baseline: str,
                labels: dict[str, str], colors: dict[str, str]) -> Figure:
    # The baseline is the dashed line at 1, not a bar of 1.00 in every group.
    drawn_targets = [t for t in targets if t != baseline]
    width = 0.8 / len(drawn_targets)
    crowded = len(rows) * len(drawn_targets) > 24
    # per target: (x, ratio, drawn height, whisker below, whisker above) of each bar
    bars: dict[str, list[tuple[float, float, float, float, float]]] = {}
    for i, target in enumerate(drawn_targets):
        for x, row in enumerate(rows):
            cell = row.cells.get(target)
            if cell is None or cell.summary is None:
                continue
            if cell.ratio is not None and finite(cell.ratio.value):
                value, low, high = cell.ratio.value, cell.ratio.ci_low, cell.ratio.ci_high
            else:
                continue        # no ratio (0/0 medians): nothing honest to draw
            height = min(value, RATIO_AXIS_MAX)
            # matplotlib rejects negative whiskers; a percentile CI may miss the median
            whiskers = finite(low) and finite(high) and value <= RATIO_AXIS_MAX
            below = max(value - low, 0) if whiskers else 0
            above = max(min(high, RATIO_AXIS_MAX) - value, 0) if whiskers else 0
            bars.setdefault(target, []).append(
                (x + (i - (len(drawn_targets) - 1) / 2) * width, value, height, below, above))
    top = max([1.0] + [h + above for b in bars.values() for _, _, h, _, above in b])
    top *= 1.3 if crowded else 1.15

    fig = Figure(figsize=BAR_SIZE, dpi=DPI, layout="constrained")
    ax = fig.subplots()
    for target, target_bars in bars.items():
        xs, _, heights, belows, aboves = zip(*target_bars)
        ax.bar(xs, heights, width * 0.92, color=colors[target], label=labels.get(target, target),
               yerr=[belows, aboves],
               error_kw={"elinewidth": 1, "capsize": 2.5, "ecolor": "#30343a"})
        for bar_x, value, height, _, up in target_bars:
            text = f"{value:.2f}" if value <= RATIO_AXIS_MAX else f"{value:.3g}↑"
            # inside the bar at its foot, clear of the whisker; above the whisker when
            # the bar is too short to hold the text
            inside = height >= top * (0.2 if crowded else 0.1)
            ax.annotate(text, (bar_x, 0 if inside else height + up), xytext=(0, 3),
                        textcoords="offset points", ha="center", va="bottom", fontsize=7,
                        color=_text_on(colors[target]) if inside else "#30343a",
                        rotation=90 if crowded else 0)
    ax.axhline(1.0, color="#30343a", linewidth=0.9, linestyle=(0, (4, 3)),
               label=f"{labels.get(baseline, baseline)} = 1")
    ax.set_ylim(0, top)
    tilt = len(rows) > 4
    ax.set_xticks(range(len(rows)), [metric_label(r) for r in rows],
                  rotation=25 if tilt else 0, ha="right" if tilt else "center",
                  rotation_mode="anchor")
    ax.set_ylabel(f"ratio to {labels.get(baseline, baseline)}  (higher = better)")
    titled_with_legend(ax, title, len(targets))
    return fig


def distributions(summary: RunSummary, labels: dict[str, str]) -> list[Chart]:
    """Per workload, every repetition of its primary metric(s), one strip per target, in
    the metric's own unit: the spread behind each median and ratio, outliers included."""
    by_workload: dict[str, list[Row]] = {}
    for row in summary.rows:
        if row.headline and not row.params and not _declared(row.workload):
            by_workload.setdefault(row.workload, []).append(row)
    colors = target_colors(summary)
    charts = []
    for workload, rows in by_workload.items():
        targets = [t for t in summary.targets if any(
            (c := r.cells.get(t)) is not None and c.values for r in rows)]
        if len(targets) < 2:
            continue
        title = f"{workload}: every repetition"
        charts.append(Chart(
            slug=f"{slugify(workload)}-repetitions", title=title,
            caption=("Each dot is one measured repetition, the bar across a strip its "
                     f"median; the dashed line is {summary.baseline}'s median."),
            figure=_strip_figure(title, rows, targets, summary.baseline, labels, colors)))
    return charts


def _strip_figure(title: str, rows: list[Row], targets: list[str], baseline: str,
                  labels: dict[str, str], colors: dict[str, str]) -> Figure:
    fig = Figure(figsize=(min(3.0 + 2.2 * len(rows), 9.0), 3.4), dpi=DPI,
                 layout="constrained")
    axes = fig.subplots(1, len(rows), squeeze=False)[0]
    for ax, row in zip(axes, rows):
        for i, target in enumerate(targets):
            cell = row.cells.get(target)
            if cell is None or not cell.values:
                continue
            n = len(cell.values)
            # evenly spread across the strip, not random: the same run draws the same
            xs = [i + 0.3 * ((k + 0.5) / n - 0.5) for k in range(n)]
            ax.scatter(xs, cell.values, s=14, color=colors[target], alpha=0.8,
                       edgecolors="white", linewidths=0.4, zorder=3)
            if cell.summary is not None:
                ax.hlines(cell.summary.median, i - 0.25, i + 0.25, color="#30343a",
                          linewidth=1.4, zorder=4)
        base = row.cells.get(baseline)
        if base is not None and base.summary is not None:
            ax.axhline(base.summary.median, color="#30343a", linewidth=0.8,
                       linestyle=(0, (4, 3)))
        medians = [c.summary.median for c in row.cells.values()
                   if c.summary is not None and c.summary.median > 0]
        if medians and max(medians) / min(medians) >= LOG_SPAN:
            ax.set_yscale("log")
        names = [labels.get(t, t) for t in targets]
        # tilted when side by side they would run into each other
        tilt = len(targets) > 3 or sum(map(len, names)) > 12 * len(targets)
        ax.set_xticks(range(len(targets)), names, rotation=20 if tilt else 0,
                      ha="right" if tilt else "center", rotation_mode="anchor")
        ax.set_xlim(-0.6, len(targets) - 0.4)
        ax.set_ylabel(metric_label(row) + ("  ↑" if row.higher_is_better else "  ↓"))
    fig.suptitle(title, x=0.01, ha="left", fontsize=STYLE["axes.titlesize"],
                 fontweight=STYLE["axes.titleweight"])
    return fig


def _text_on(color: str) -> str:
    """White or near-black, whichever reads better on `color` (sRGB luma)."""
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return "#1f2328" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "white"


# -- sweeps ------------------------------------------------------------------------------------

_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_SIZE_SHIFT = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}


def numeric(value: Any) -> float | None:
    """A parameter value as a number: 4, 0.5, or a size such as "16K" / "1G" in bytes."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    m = _SIZE.fullmatch(str(value).strip())
    return float(m[1]) * 2 ** _SIZE_SHIFT[m[2].lower()] if m else None


def _key(params: dict[str, Any], keys: list[str]) -> str:
    return json.dumps({k: params.get(k) for k in keys}, sort_keys=True)


def _describe(params: dict[str, Any], keys: list[str]) -> str:
    return ", ".join(f"{k}={params[k]}" for k in keys if k in params)


def sweeps(summary: RunSummary, labels: dict[str, str]) -> list[Chart]:
    """One figure per swept workload and metric: x = the swept parameter (the numeric
    one with most values), one panel per value of word-valued parameters (e.g. seq/rnd),
    one line per target (colour) and remaining parameter combination (line style)."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in summary.rows:
        if row.params and not _declared(row.workload):
            groups.setdefault((row.workload, row.key), []).append(row)
    colors = target_colors(summary)
    charts = []
    for (workload, metric), rows in groups.items():
        keys = sorted({k for r in rows for k in r.params})
        distinct = {k: {json.dumps(r.params.get(k)) for r in rows} for k in keys}
        swept = [k for k in keys if len(distinct[k]) > 1]
        if not swept:
            continue
        numeric_keys = [k for k in swept if all(numeric(r.params.get(k)) is not None for r in rows)]
        x_key = max(numeric_keys or swept, key=lambda k: len(distinct[k]))
        rest = [k for k in swept if k != x_key]
        panel_keys = [k for k in rest if k not in numeric_keys]
        line_keys = [k for k in rest if k in numeric_keys]
        first = rows[0]
        title = f"{workload}: {metric_label(first)} vs {x_key}"
        charts.append(Chart(
            slug=f"{slugify(workload)}-{slugify(metric)}-vs-{slugify(x_key)}", title=title,
            caption=("Median over the measured runs; the band is its confidence interval. "
                     + ("↑ higher is better." if first.higher_is_better
                        else "↓ lower is better.")),
            figure=_sweep_figure(title, rows, x_key, x_key in numeric_keys, panel_keys,
                                 line_keys, summary.targets, labels, colors)))
    return charts


def _sweep_x(value: Any) -> float:
    """A numeric sweep's x: the caller made sure every value of its key is a number."""
    x = numeric(value)
    if x is None:
        raise ValueError(f"{value!r} is not a number")
    return x


def _sweep_figure(title: str, rows: list[Row], x_key: str, x_numeric: bool,
                  panel_keys: list[str], line_keys: list[str], targets: list[str],
                  labels: dict[str, str], colors: dict[str, str]) -> Figure:
    panels: dict[str, list[Row]] = {}
    for row in rows:
        panels.setdefault(_key(row.params, panel_keys), []).append(row)
    fig = Figure(figsize=SWEEP_SIZE, dpi=DPI, layout="constrained")
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    # x positions: the value itself, or its rank for word-valued sweeps
    raw = sorted({json.dumps(r.params.get(x_key)) for r in rows},
                 key=lambda v: (numeric(json.loads(v)) or 0, v))
    position = {v: (_sweep_x(json.loads(v)) if x_numeric else i) for i, v in enumerate(raw)}
    xs_all = [position[v] for v in raw]
    log_x = x_numeric and min(xs_all) > 0 and max(xs_all) / min(xs_all) >= LOG_SPAN
    styles: dict[str, int] = {}     # remaining-parameter combination -> line style
    drawn: set[str] = set()
    for ax, (panel, panel_rows) in zip(axes, panels.items()):
        for target in targets:
            lines: dict[str, list[tuple[float, Any]]] = {}
            for row in panel_rows:
                cell = row.cells.get(target)
                if cell is not None and cell.summary is not None:
                    point = (position[json.dumps(row.params.get(x_key))], cell.summary)
                    lines.setdefault(_key(row.params, line_keys), []).append(point)
            for line, points in lines.items():
                points.sort(key=lambda p: p[0])
                xs = [p[0] for p in points]
                style = styles.setdefault(line, len(styles))
                drawn.add(target)
                ax.plot(xs, [s.median for _, s in points], color=colors[target],
                        linestyle=LINESTYLES[style % len(LINESTYLES)],
                        marker=MARKERS[style % len(MARKERS)], markersize=4, linewidth=1.6)
                if any(s.n > 1 for _, s in points):
                    ax.fill_between(xs, [s.ci_low for _, s in points],
                                    [s.ci_high for _, s in points], color=colors[target],
                                    alpha=0.13, linewidth=0)
        if log_x:
            ax.set_xscale("log")
        if len(xs_all) <= MAX_TICKS:
            ax.set_xticks(xs_all, [str(json.loads(v)) for v in raw])
            ax.minorticks_off()
        ax.set_xlabel(x_key)
        ax.grid(True, axis="x", color="#eef0f2")
        if panel_keys:
            ax.set_title(_describe(json.loads(panel), panel_keys), fontsize=9,
                         fontweight="normal")
    first = rows[0]
    medians = [c.summary.median for r in rows for c in r.cells.values()
               if c.summary is not None and c.summary.median > 0]
    if medians and max(medians) / min(medians) >= LOG_SPAN:
        axes[0].set_yscale("log")
    axes[0].set_ylabel(metric_label(first) + ("  ↑" if first.higher_is_better else "  ↓"))
    # colour says target, line style says the other parameters: two short legends
    # instead of one entry per combination
    handles = [Line2D([], [], color=colors[t], linewidth=2.5, label=labels.get(t, t))
               for t in targets if t in drawn]
    if line_keys:
        handles += [Line2D([], [], color="#555a62", linewidth=1.4,
                           linestyle=LINESTYLES[i % len(LINESTYLES)],
                           marker=MARKERS[i % len(MARKERS)], markersize=4,
                           label=_describe(json.loads(line), line_keys))
                    for line, i in styles.items()]
    fig.legend(handles=handles, loc="outside right upper", fontsize=8)
    fig.suptitle(title, x=0.01, ha="left", fontsize=STYLE["axes.titlesize"],
                 fontweight=STYLE["axes.titleweight"])
    return fig


# -- a workload's own figures ------------------------------------------------------------------
# Declared by the workload (Workload.figures, vmtax.core.figures) for metrics whose dimensions
# the generic builders would scatter over dozens of charts (serving's endpoint and offered
# rate): its rows get these instead of the generic figures.
PANEL_SIZE = (3.4, 3.6)


def _declared(workload: str) -> tuple[figures.Figure, ...]:
    cls = workloads.registered().get(workload)
    return cls.figures if cls is not None else ()


def _configurations(summary: RunSummary, workload: str, metric: str) -> dict[str, list[Row]]:
    """workload's rows of `metric`, by configuration (its varying parameters)."""
    groups: dict[str, list[Row]] = {}
    for row in summary.rows:
        if row.workload == workload and row.metric == metric:
            groups.setdefault(json.dumps(row.params, sort_keys=True), []).append(row)
    return groups


def _axis_label(row: Row) -> str:
    """The metric with its unit and direction, without the row's dimensions."""
    name = row.metric if row.unit in row.metric else f"{row.metric} ({row.unit})"
    return name + ("  ↑" if row.higher_is_better else "  ↓")


def declared(summary: RunSummary, labels: dict[str, str]) -> list[Chart]:
    """The figures workloads declare: one chart per figure and configuration, in the
    order of the workloads' rows and of their declarations."""
    colors = target_colors(summary)
    charts = []
    for workload in dict.fromkeys(row.workload for row in summary.rows):
        for figure in _declared(workload):
            for key, rows in _configurations(summary, workload, figure.metric).items():
                params = json.loads(key)
                suffix = f" ({_describe(params, sorted(params))})" if params else ""
                title = f"{workload}: {figure.title}{suffix}"
                if isinstance(figure, figures.Bars):
                    drawn = _bars_figure(title, figure, rows, summary.targets, labels, colors)
                else:
                    rows = [r for r in rows if numeric(r.dimensions.get(figure.x)) is not None]
                    if not rows:
                        continue
                    mark = figure.mark
                    drawn = _lines_figure(
                        title, figure, rows,
                        _rows_of(summary, workload, mark.metric if mark else None, key),
                        _rows_of(summary, workload, mark.bound if mark else None, key),
                        summary.targets, labels, colors)
                charts.append(Chart(
                    slug=f"{slugify(workload)}-{figure.slug}"
                         f"{'-' + slugify(suffix) if suffix else ''}",
                    title=title, caption=figure.caption, figure=drawn))
    return charts


def _rows_of(summary: RunSummary, workload: str, metric: str | None, key: str) -> list[Row]:
    """workload's rows of `metric` in configuration `key` (none without a metric)."""
    return _configurations(summary, workload, metric).get(key, []) if metric else []


def _median_at(rows: list[Row], dimension: str, value: str, target: str) -> float | None:
    """The median of target's cell in the row whose `dimension` is value, if any."""
    return next((c.summary.median for r in rows if r.dimensions.get(dimension) == value
                 and (c := r.cells.get(target)) is not None and c.summary is not None), None)


def _lines_figure(title: str, figure: figures.Lines, rows: list[Row], mark_rows: list[Row],
                  bound_rows: list[Row], targets: list[str], labels: dict[str, str],
                  colors: dict[str, str]) -> Figure:
    panels = list(dict.fromkeys(r.dimensions.get(figure.panels, "") for r in rows))
    fig = Figure(figsize=(PANEL_SIZE[0] * len(panels) + 1.6, PANEL_SIZE[1]), dpi=DPI,
                 layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    drawn: set[str] = set()
    for ax, panel in zip(axes, panels):
        for target in targets:
            points = sorted(
                (_sweep_x(r.dimensions[figure.x]), cell.summary) for r in rows
                if r.dimensions.get(figure.panels) == panel
                and (cell := r.cells.get(target)) is not None and cell.summary is not None)
            if not points:
                continue
            drawn.add(target)
            xs = [x for x, _ in points]
            ax.plot(xs, [s.median for _, s in points], color=colors[target], marker="o",
                    markersize=3.5, linewidth=1.6)
            if any(s.n > 1 for _, s in points):
                ax.fill_between(xs, [s.ci_low for _, s in points],
                                [s.ci_high for _, s in points], color=colors[target],
                                alpha=0.13, linewidth=0)
            mark = _median_at(mark_rows, figure.panels, panel, target)
            at = [s.median for x, s in points if mark is not None and math.isclose(x, mark)]
            if at:
                # A bound's median below 1/2 (serving: no step failed) makes the mark only
                # a lower bound: an open triangle pointing on, and "≥".
                bound = (_median_at(bound_rows, figure.panels, panel, target) or 0.0) < 0.5 \
                    if bound_rows else False
                ax.plot([mark], at[:1], linestyle="none", marker=">" if bound else "o",
                        markersize=9, markerfacecolor="none",
                        markeredgecolor=colors[target], markeredgewidth=1.6)
                if bound:
                    ax.annotate("≥", (mark, at[0]), xytext=(7, 3), textcoords="offset points",
                                fontsize=9, color=colors[target], fontweight="bold")
        if figure.log_x:
            ax.set_xscale("log")
        if figure.log_y:
            ax.set_yscale("log")
        xs_all = sorted({_sweep_x(r.dimensions[figure.x]) for r in rows
                         if r.dimensions.get(figure.panels) == panel})
        if len(xs_all) <= MAX_TICKS:
            ax.set_xticks(xs_all, [f"{x:g}" for x in xs_all])
            ax.minorticks_off()
        ax.set_title(panel, fontsize=9, fontweight="normal")
        ax.set_xlabel(figure.x_label)
        ax.grid(True, axis="x", color="#eef0f2")
    axes[0].set_ylabel(_axis_label(rows[0]))
    handles = [Line2D([], [], color=colors[t], linewidth=2.5, label=labels.get(t, t))
               for t in targets if t in drawn]
    if figure.mark is not None:
        handles.append(Line2D([], [], linestyle="none", marker="o", markersize=9,
                              markerfacecolor="none", markeredgecolor="#555a62",
                              label=figure.mark.label))
        if figure.mark.bound is not None:
            handles.append(Line2D([], [], linestyle="none", marker=">", markersize=9,
                                  markerfacecolor="none", markeredgecolor="#555a62",
                                  label=figure.mark.bound_label))
    fig.legend(handles=handles, loc="outside right upper", fontsize=8)
    fig.suptitle(title, x=0.01, ha="left", fontsize=STYLE["axes.titlesize"],
                 fontweight=STYLE["axes.titleweight"])
    return fig


def _bars_figure(title: str, figure: figures.Bars, rows: list[Row], targets: list[str],
                 labels: dict[str, str], colors: dict[str, str]) -> Figure:
    fig = Figure(figsize=BAR_SIZE, dpi=DPI, layout="constrained")
    ax = fig.subplots()
    width = 0.8 / len(targets)
    for i, target in enumerate(targets):
        bars = [(x, cell.summary) for x, r in enumerate(rows)
                if (cell := r.cells.get(target)) is not None and cell.summary is not None]
        if not bars:
            continue
        xs = [x + (i - (len(targets) - 1) / 2) * width for x, _ in bars]
        medians = [s.median for _, s in bars]
        # matplotlib rejects negative whiskers; a percentile CI may miss the median
        below = [max(s.median - s.ci_low, 0) if s.n > 1 else 0 for _, s in bars]
        above = [max(s.ci_high - s.median, 0) if s.n > 1 else 0 for _, s in bars]
        ax.bar(xs, medians, width * 0.92, color=colors[target],
               label=labels.get(target, target), yerr=[below, above],
               error_kw={"elinewidth": 1, "capsize": 2.5, "ecolor": "#30343a"})
        for x, value in zip(xs, medians):
            ax.annotate(f"{value:.3g}", (x, value), xytext=(0, 3), textcoords="offset points",
                        ha="center", va="bottom", fontsize=7, color="#30343a")
    ax.set_xticks(range(len(rows)), [r.dimensions.get(figure.groups, r.label) for r in rows])
    medians = [c.summary.median for r in rows for c in r.cells.values()
               if c.summary is not None and c.summary.median > 0]
    if medians and max(medians) / min(medians) >= LOG_SPAN:
        ax.set_yscale("log")    # serving's transcode: a few requests/s beside thousands
    ax.set_ylabel(_axis_label(rows[0]))
    titled_with_legend(ax, title, len(targets))
    return fig
