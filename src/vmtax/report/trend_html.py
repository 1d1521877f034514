"""A name's series as one self-contained HTML page (`vmtax trend NAME --html FILE`): per
series an inline SVG of each run's median with its 95% interval, each segment's median as a
line, the change points marked, and beside it each change's effect and what changed.
Nothing is fetched from elsewhere: it opens from file:// offline."""

from __future__ import annotations

import time
from dataclasses import dataclass

import jinja2

from vmtax.analysis.history import NOTHING_CHANGED, Series, SeriesLevels, Trend
from vmtax.report.parts import fmt, interval

WIDTH, HEIGHT, PAD = 640, 180, 36


@dataclass
class Plot:
    points: list[tuple[float, float, float, float, str]]   # x, y, y of CI low, high, title
    segments: list[tuple[float, float, float]]             # x from, x to, y of its median
    changes: list[tuple[float, str]]                       # x, label
    ticks: list[tuple[float, str]]                         # y, value


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
    ticks = [(y(v), fmt(v)) for v in (bottom + 0.05 * span, top - 0.05 * span)]
    return Plot(points, segments, changes, ticks)


_PAGE = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string("""\
<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>vmtax trend {{ trend.name }}</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
.series { display: flex; flex-wrap: wrap; gap: 1em; margin-bottom: 1.5em; }
.changes { max-width: 32em; }
.worse { color: #b00; } .better { color: #070; } .note { color: #a60; }
svg { background: #fafafa; border: 1px solid #ddd; }
small { color: #666; }
</style></head><body>
<h1>vmtax trend {{ trend.name }}</h1>
{% for host, runs in trend.runs.items() %}
<p>{{ host }}: {{ runs|length }} runs, {{ day(runs[0].created) }} … {{ day(runs[-1].created) }}</p>
{% endfor %}
{% for note in trend.notes %}<p class="note">{{ note }}</p>{% endfor %}
{% for s, plot in series %}
<h2>{% if hosts %}{{ s.host }} · {% endif %}{{ s.label }}
  <small>{% if s.unit != s.metric %}{{ s.unit }}, {% endif %}
  {{ "higher" if s.higher_is_better else "lower" }} is better</small></h2>
<div class="series">
<svg width="{{ width }}" height="{{ height }}" viewBox="0 0 {{ width }} {{ height }}"
     role="img" aria-label="{{ s.label }}: median of each run with its interval">
{% for ty, label in plot.ticks %}
  <text x="2" y="{{ ty }}" font-size="10" fill="#666">{{ label }}</text>
  <line x1="{{ pad }}" x2="{{ width - pad }}" y1="{{ ty }}" y2="{{ ty }}" stroke="#eee"/>
{% endfor %}
{% for x1, x2, ty in plot.segments %}
  <line x1="{{ x1 }}" x2="{{ x2 }}" y1="{{ ty }}" y2="{{ ty }}" stroke="#888"
        stroke-width="2" opacity="0.6"/>
{% endfor %}
{% for cx, label in plot.changes %}
  <line class="change" x1="{{ cx }}" x2="{{ cx }}" y1="{{ pad / 2 }}" y2="{{ height - pad / 2 }}"
        stroke="#b00" stroke-dasharray="4 3"/>
  <text x="{{ cx + 3 }}" y="{{ pad / 2 + 8 }}" font-size="10" fill="#b00">{{ label }}</text>
{% endfor %}
{% for px, py, low, high, title in plot.points %}
  <g><title>{{ title }}</title>
  <line x1="{{ px }}" x2="{{ px }}" y1="{{ low }}" y2="{{ high }}" stroke="#36c"/>
  <circle cx="{{ px }}" cy="{{ py }}" r="3" fill="#36c"/></g>
{% endfor %}
</svg>
<div class="changes">
{% if s.detection is none %}<p class="note">{{ s.note }}</p>
{% elif s.detection.points_needed %}
<p>{{ s.points|length }} runs: {{ s.detection.points_needed }} more before a change can be
  called</p>
{% elif not s.changes %}<p>no change</p>{% endif %}
{% for c in s.changes %}
<p><b class="{{ c.verdict }}">run {{ c.after.number }} {{ c.verdict }}:
  {{ pct(c.change.ratio) }}</b>
  [{{ pct(c.change.ci[0]) }}, {{ pct(c.change.ci[1]) }}],
  p={{ "%.2g"|format(c.change.p_value if c.change.p_adjusted is none else c.change.p_adjusted) }}
  <br><small>{{ c.after.id }}; median {{ fmt(c.change.before) }} → {{ fmt(c.change.after) }}
  {% if linked %}(<a href="../changes/{{ c.before.id }}--{{ c.after.id }}.html">run {{
  c.after.number }} against run {{ c.before.number }}</a>){% endif %}</small>
  <br>what changed since run {{ c.before.number }}:</p>
<ul>{% for line in c.what_changed or [nothing] %}<li>{{ line }}</li>{% endfor %}</ul>
{% if c.accepted %}
<p><small>accepted by {{ c.accepted.who }} on {{ day(c.accepted.at) }}</small></p>
{% endif %}
{% endfor %}
</div></div>
{% endfor %}
<p><small>Change points: a rank test over each run's median with a permutation null, p
adjusted ({{ "Benjamini-Hochberg" if trend.method == "bh" else "Holm" }}) over
{{ trend.tests }} tests, α={{ trend.alpha }}; at least 3 runs on each side of a change.
Bars: each run's median and its 95% interval (with too few repetitions for one, their
range); grey lines: each segment's median.</small></p>
</body></html>
""")


def _day(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


def render(trend: Trend, levels: list[SeriesLevels], linked: bool = False) -> str:
    """The page (levels: analysis.history.levels(trend)); `linked`: in a published site,
    each change links to its comparison."""
    return _PAGE.render(trend=trend, series=[(s, _plot(s, lv))
                                             for s, lv in zip(trend.series, levels)],
                        linked=linked,
                        hosts=len(trend.runs) > 1, width=WIDTH, height=HEIGHT, pad=PAD,
                        day=_day, fmt=fmt, pct=lambda ratio: f"{ratio - 1:+.1%}",
                        nothing=NOTHING_CHANGED)
