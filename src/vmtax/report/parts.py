"""What every renderer says the same way (terminal, HTML, Markdown, JUnit, publish): numbers,
the notation of intervals, target labels, flags, a sweep's parameters, a trend's phrases.
Plain text only: each renderer styles or escapes it its own way.

May import: `vmtax.core`, and `vmtax.analysis` and `vmtax.results` for types (never a
renderer, nor `vmtax.host`: what a figure needs of the host is stored with its run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vmtax.analysis import changepoint

if TYPE_CHECKING:
    from vmtax.analysis.history import Recent, Series, Trend


# -- a trend ---------------------------------------------------------------------------------

def series_status(s: Series) -> str:
    """A series' change points in a word, or why there are none yet."""
    if s.detection is None:
        return s.note
    if s.detection.points_needed:
        return (f"{len(s.points)} run{'s' * (len(s.points) != 1)}: up to "
                f"{s.detection.points_needed} more before a change can be called")
    count = len(s.changes)
    return f"{count} change{'s' * (count != 1)}" if count else "no change"


def recent_status(recent: Recent) -> str:
    """Why the newest runs' verdict is no change point yet, and what one needs."""
    if recent.more_runs is None:
        return "too few runs before it for a change point there"
    if recent.more_runs:
        more = recent.more_runs
        return (f"up to {more} more run{'s' * (more != 1)} like "
                f"{'these' if recent.held else 'it'} before it can be a change point")
    return "not yet a change point (the adjustment across series holds it back)"


def method_note(trend: Trend) -> str:
    """How change points are found, and what one needs: said from the test itself."""
    method = "Benjamini-Hochberg" if trend.method == "bh" else "Holm"
    each = changepoint.runs_each_side(trend.alpha)
    return (f"change points: rank test over each run's median, p adjusted ({method}) over "
            f"{trend.tests} test{'s' * (trend.tests != 1)}, α={trend.alpha:g}; a clean "
            f"step is called once it has {each} runs on each side (some sooner; before the "
            "adjustment)")
