"""How vmtax writes a number or an interval: every view (terminal, HTML, Markdown, JUnit,
publish, through vmtax.report.parts) and analysis' own sentences write them so, in one
notation.

An interval is a real 95% CI in brackets, [0.94–0.96]; with too few runs for one, the
runs' range in parentheses, (0.94–0.96); from one run, nothing. Long bounds, or bounds
that carry a thousands separator, are spaced apart, (0.01976 – 0.02018), [13,472 – 18,272]
(never [13,472, 18,272]): a narrow column wraps there; signed ones are set apart by a
comma, [-7.8%, -0.1%]. A ratio has three significant digits and its bounds two, more where
fewer would put the ratio outside its shown interval or a bound on the other side of 1
than it lies (0.996 is never shown as 1.0).
"""

from __future__ import annotations

import math


def fmt(value: float | None) -> str:
    """Four significant digits, without exponent noise for everyday magnitudes."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if math.isinf(value):
        return "∞"
    if value == 0:
        return "0"
    if abs(value) >= 1e7:
        return f"{value:.3e}"
    digits = max(0, 3 - int(math.floor(math.log10(abs(value)))))
    text = f"{value:,.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def sig3(value: float) -> str:
    """Three significant digits, trailing zeros kept (a ratio: 0.970, 1.00, 12.3)."""
    return _significant(value, 3)


def _significant(value: float, digits: int) -> str:
    if not math.isfinite(value) or value == 0 or not 1e-3 <= abs(value) < 1e3:
        return fmt(value)
    if digits == 2 and abs(value) < 1:   # a bound's two digits: 0.9, not 0.90
        return f"{value:.2g}"
    return f"{value:#.{digits}g}".rstrip(".")


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").replace("∞", "inf"))
    except ValueError:
        return None


def _side_of_one(value: float) -> int:
    return (value > 1) - (value < 1)


def _bound(value: float, shown_ratio: float | None, below: bool) -> str:
    """A ratio's bound to two significant digits, or more where two would put it past the
    shown ratio (three never do: rounding to one precision keeps the order) or show it on
    the other side of 1 than it lies (below: the low bound)."""
    for digits in range(2, 16):
        text = _significant(value, digits)
        shown = _number(text)
        if shown is None or shown_ratio is None:
            return text
        crossed = _side_of_one(shown) != _side_of_one(value)
        if not crossed and (shown <= shown_ratio if below else shown >= shown_ratio):
            return text
    return repr(value)


def ratio_texts(value: float, low: float, high: float) -> tuple[str, str, str]:
    """A ratio to three significant digits and its interval's bounds to two (the width is
    what they tell); a bound gets more where two would leave the printed ratio outside the
    printed interval (1.0057 [0.904, 1.027] is 1.01 [0.9–1.03], never [0.9–1.0]) or show it
    on the other side of 1 than it is (0.996 is 0.996, not 1.0; 1.017 is 1.02)."""
    shown = sig3(value)
    number = _number(shown)
    return shown, _bound(low, number, below=True), _bound(high, number, below=False)


def percent(value: float) -> str:
    """A relative change: +4.2%."""
    return "–" if math.isnan(value) else f"{value:+.1%}"


def bracket(kind: str, low: str, high: str) -> str:
    """An interval's bounds, already written, in the notation of its kind
    (analysis.stats.interval_kind: "ci", "range", "none"; see above), after a space; ""
    for none."""
    if kind == "none":
        return ""
    if "," in low + high:           # spaced: a narrow column wraps there
        inside = f"{low} – {high}"
    elif any(b.startswith(("+", "-")) for b in (low, high)):
        inside = f"{low}, {high}"
    elif max(len(low), len(high)) > 5:
        inside = f"{low} – {high}"
    else:
        inside = f"{low}–{high}"
    return f" [{inside}]" if kind == "ci" else f" ({inside})"
