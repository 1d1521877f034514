"""What every figure of a report shares: the style, palette and sizes, the Chart a builder
returns, one colour per target, and rendering as PNG, SVG or SVG cleaned up for inlining.
Figures are built on bare `Figure` objects (no pyplot), so nothing depends on a display or
on global figure state."""

from __future__ import annotations

import io
import math
import re
import textwrap
from collections import Counter
from dataclasses import dataclass
from itertools import cycle
from typing import Any

import matplotlib
from markupsafe import escape
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.typing import LineStyleType, RcKeyType

from vmtax.analysis.summary import Row, RunSummary
from vmtax.core.text import printable

# Figure sizes in inches at DPI: PNGs are exactly size × DPI pixels (no tight bbox).
DPI = 150
BAR_SIZE = (9.0, 4.2)
SWEEP_SIZE = (9.0, 4.2)
# Ratios beyond this are drawn clipped, with their value written on the bar, so one
# outlier (a metric near zero on the baseline) does not flatten every other bar.
RATIO_AXIS_MAX = 2.0
# A swept parameter gets a log axis when its values span at least this factor.
LOG_SPAN = 100.0
MAX_TICKS = 12
# A target's name in a figure (its ticks and legend) goes on lines of at most LABEL_LINE
# characters, so four legend columns fit the width; one longer than MAX_LABEL is cut in the
# middle. A name of a hundred characters on one line pushed the axes out of the figure,
# which matplotlib then drew without its layout, warning on stderr.
LABEL_LINE = 24
MAX_LABEL = 3 * LABEL_LINE

BASELINE_COLOR = "#8a8f98"
# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442",
           "#000000")
LINESTYLES: tuple[LineStyleType, ...] = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")

STYLE: dict[RcKeyType, Any] = {
    "font.size": 9,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.edgecolor": "#555a62",
    "axes.labelcolor": "#30343a",
    "xtick.color": "#30343a",
    "ytick.color": "#30343a",
    "axes.grid": True,
    "axes.grid.axis": "y",
    "grid.color": "#e3e5e8",
    "grid.linewidth": 0.8,
    "axes.axisbelow": True,
    "legend.frameon": False,
    "svg.fonttype": "path",       # glyphs as paths: the SVG needs no font on the reader's side
    "svg.hashsalt": "vmtax",      # stable ids, so the same run renders to the same file
}
# Without these keys matplotlib writes an RDF block full of namespace URLs and a date.
_SVG_METADATA = {"Creator": None, "Date": None, "Format": None, "Type": None}


@dataclass
class Chart:
    slug: str            # file name stem, unique within a run
    title: str
    caption: str
    figure: Figure


def target_colors(summary: RunSummary) -> dict[str, str]:
    """One colour per target, the same in every figure and in the HTML legend."""
    others = cycle(PALETTE)
    return {t: BASELINE_COLOR if t == summary.baseline else next(others)
            for t in summary.targets}


def figure_labels(labels: dict[str, str]) -> dict[str, str]:
    """Each target's name as figures show it: on lines of at most LABEL_LINE characters
    (broken at a hyphen where one is), a name longer than MAX_LABEL cut in the middle (its
    start and end kept; the tables beside a figure give it whole), a control character
    as its escape. Two names cut alike are numbered, so no two targets read the same."""
    half = (MAX_LABEL - 1) // 2
    shown = {t: printable(label) for t, label in labels.items()}   # no glyph for an ESC
    cut = {t: label if len(label) <= MAX_LABEL else f"{label[:half]}…{label[-half:]}"
           for t, label in shown.items()}
    alike = Counter(cut.values())
    return {t: "\n".join(textwrap.wrap(f"{label} [{n}]" if alike[label] > 1 else label,
                                       LABEL_LINE))
            for n, (t, label) in enumerate(cut.items(), 1)}


def titled_with_legend(ax: Axes, title: str, columns: int) -> None:
    """The axes' title, and above it on the right their legend in up to four columns
    (columns: how many it would fill in one row); the title is raised by as many lines as
    the legend may have, a name of several lines (figure_labels) among them."""
    handles, names = ax.get_legend_handles_labels()
    ncols = max(1, min(columns, 4))
    rows = -(-len(names) // ncols)
    lines = rows * max((name.count("\n") + 1 for name in names), default=0)
    ax.set_title(title, pad=10 + 12 * lines)
    ax.legend(handles, names, ncols=ncols, loc="lower right", bbox_to_anchor=(1, 1.0),
              fontsize=8, handlelength=1.2, borderaxespad=0.2)


def slugify(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "chart"


def metric_label(row: Row) -> str:
    return row.label if row.unit in row.metric else f"{row.label} ({row.unit})"


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)



def render(chart: Chart, fmt: str) -> bytes:
    """The figure as "png" or "svg" file contents."""
    buf = io.BytesIO()
    with matplotlib.rc_context(STYLE):
        chart.figure.savefig(buf, format=fmt, dpi=DPI, facecolor="white",
                             metadata=_SVG_METADATA if fmt == "svg" else None)
    return buf.getvalue()


_XML_PROLOG = re.compile(r"<\?xml[^>]*\?>\s*|<!DOCTYPE[^>]*>\s*", re.DOTALL)
_ID = re.compile(r'\bid="([^"]+)"')


def inline_svg(chart: Chart, prefix: str) -> str:
    """SVG markup to paste into HTML: no XML prolog or DTD URL, no namespace URLs (the
    HTML parser knows SVG), ids prefixed so several figures on one page cannot collide,
    and a width that follows the page."""
    svg = _XML_PROLOG.sub("", render(chart, "svg").decode())
    svg = re.sub(r'\s+xmlns(:xlink)?="[^"]*"', "", svg)
    svg = svg.replace("xlink:href=", "href=")
    ids = set(_ID.findall(svg))
    svg = _ID.sub(lambda m: f'id="{prefix}{m[1]}"', svg)
    svg = re.sub(r'(href="#|url\(#)([^")]+)',
                 lambda m: m[1] + (prefix + m[2] if m[2] in ids else m[2]), svg)
    return re.sub(r'<svg\s+width="[^"]*"\s+height="[^"]*"',
                  f'<svg role="img" aria-label="{escape(chart.title)}" class="chart"', svg, count=1)
