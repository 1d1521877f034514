"""A name's series as one self-contained HTML page (`vmtax trend NAME --html FILE`): per
series an inline SVG of each run's median with its 95% interval, each segment's median as a
line, the change points marked, and beside it each change's effect and what changed.
Nothing is fetched from elsewhere: it opens from file:// offline."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import jinja2

from vmtax.core.text import page_text
from vmtax.analysis.history import NOTHING_CHANGED, Series, SeriesLevels, Trend
from vmtax.report.parts import (change_interval, fmt, interval, method_note, recent_status,
                                runs_text, series_status)

WIDTH, HEIGHT, PAD = 640, 180, 36


@dataclass
class Plot:
    points: list[tuple[float, float, float, float, str]]   # x, y, y of CI low, high, title
    segments: list[tuple[float, float, float]]             # x from, x to, y of its median
    changes: list[tuple[float, str]]                       # x, label
    ticks: list[tuple[float, str]]                         # y, value
    runs: list[tuple[float, str]]                          # x, run number
    unit: str                                              # the y axis' title


def _plot(s: Series, levels: SeriesLevels) -> Plot:
    summaries = levels.points
    lows = [min(x.ci_low, x.median) for x in summaries]
    highs = [max(x.ci_high, x.median) for x in summaries]
    bottom, top = min(lows), max(highs)
    span = (top - bottom) or abs(top) or 1.0
    bottom, top = bottom - 0.05 * span, top + 0.05 * span

    def y(value: float) -> float:
        return round(HEIGHT - PAD - (value - bottom) / (top - bottom) * (HEIGHT - 2 * PAD), 1)

    def x(index: float) -> float:
        step = (WIDTH - 2 * PAD) / max(1, len(s.points) - 1)
        return round(PAD + index * step, 1)

    points = [(x(i), y(m.median), y(low), y(high),
               f"run {p.run.number} {p.run.id}: median {fmt(m.median)}"
               f"{interval(m)}, n={m.n}")
              for i, (p, m, low, high) in enumerate(zip(s.points, summaries, lows, highs))]
    bounds = [0, *(c.change.index for c in s.changes), len(s.points)]
    segments = []
    for start, end, level in zip(bounds[:-1], bounds[1:], levels.segments):
        segments.append((x(start - 0.4 if start else 0), x(end - 0.6 if end < len(s.points)
                                                            else end - 1), y(level)))
    changes = [(x(c.change.index - 0.5), f"run {c.after.number}") for c in s.changes]
    ticks = [(y(v), fmt(v)) for v in _nice_ticks(bottom, top)]
    every = max(1, -(-len(s.points) // 8))      # at most 8 run numbers under the axis
    runs = [(x(i), str(p.run.number)) for i, p in enumerate(s.points)
            if i % every == 0 or i == len(s.points) - 1]
    return Plot(points, segments, changes, ticks, runs, s.unit or s.metric)


def _nice_ticks(bottom: float, top: float) -> list[float]:
    """Four or five round values between bottom and top (1, 2 or 5 times a power of 10
    apart)."""
    raw = (top - bottom) / 4
    if raw <= 0 or not math.isfinite(raw):
        return [bottom]
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(bottom / step) * step
    return [first + i * step for i in range(int((top - first) / step) + 1)]


_PAGE = jinja2.Environment(loader=jinja2.PackageLoader("vmtax.report", "templates"),
                           autoescape=True, undefined=jinja2.StrictUndefined
                           ).get_template("trend.html.j2")


def _day(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


def render(trend: Trend, levels: list[SeriesLevels], linked: bool = False) -> str:
    """The page (levels: analysis.history.levels(trend)); `linked`: in a published site,
    each change links to its comparison."""
    page = _PAGE.render(trend=trend, series=[(s, _plot(s, lv))
                                             for s, lv in zip(trend.series, levels)],
                        linked=linked,
                        hosts=len(trend.runs) > 1, width=WIDTH, height=HEIGHT, pad=PAD,
                        day=_day, fmt=fmt, pct=lambda ratio: f"{ratio - 1:+.1%}",
                        nothing=NOTHING_CHANGED, status=series_status, runs=runs_text,
                        recent_status=recent_status, method_note=method_note,
                        ci=lambda c: change_interval("ci", c.change.ci[0] - 1,
                                                     c.change.ci[1] - 1),
                        recent_ci=lambda r: change_interval(r.comparison.interval,
                                                            *r.comparison.change_ci),
                        newest=lambda s: (f"runs {s.recent.judged[0].run.number}–"
                                          f"{s.points[-1].run.number} {s.recent.verdict}"
                                          if s.recent.held else
                                          f"newest run {s.points[-1].run.number} "
                                          f"{s.recent.verdict}"))
    return page_text(page)
