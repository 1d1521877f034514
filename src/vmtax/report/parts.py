"""What every renderer says the same way (terminal, HTML, Markdown, JUnit, publish): numbers
and the notation of intervals (vmtax.core.notation's, which analysis' sentences use too),
target labels, flags, a sweep's parameters, a trend's phrases. Plain text: each renderer
styles or escapes it its own way (a part's role says how: "gain", "loss", "interval",
"flag", "failed").

May import: `vmtax.core`, and `vmtax.analysis` and `vmtax.results` (never a renderer, nor
`vmtax.host`: what a figure needs of the host is stored with its run).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Set as AbstractSet
from typing import TYPE_CHECKING, Any

from vmtax.core.notation import bracket, fmt, percent, ratio_texts, sig3
from vmtax.core.text import printable

if TYPE_CHECKING:
    from vmtax.analysis.composite import Index
    from vmtax.analysis.history import Recent, Series, Trend
    from vmtax.analysis.summary import Cell, Row
    from vmtax.results.store import Run

__all__ = ["bracket", "fmt", "percent", "ratio_texts", "sig3"]   # the notation, for renderers

# A rendered part: its text and its role (how a renderer styles it; "" for none).
Part = tuple[str, str]


# -- numbers and intervals -------------------------------------------------------------------

def interval(s: Any) -> str:
    """A median's interval (a 95% CI, or the runs' range) in the one notation."""
    return bracket(s.interval, fmt(s.ci_low), fmt(s.ci_high))


def change_interval(kind: str, low: float, high: float) -> str:
    """A relative change's interval (bounds as changes: -0.05 is 5% lower)."""
    return bracket(kind, percent(low), percent(high))


def ratio_interval(r: Any) -> str:
    """A ratio's (or index's) interval, its bounds as ratio_texts rounds them."""
    _, low, high = ratio_texts(r.value, r.ci_low, r.ci_high)
    return bracket(r.interval, low, high)


RANGE_NOTE = "(a range: the runs' extremes, too few runs for a 95% CI)"


def interval_legend(kinds: AbstractSet[str]) -> str:
    """What the intervals shown are: "[95% CI]", a range, none (one run) or a mix."""
    parts = (["[95% CI]"] * ("ci" in kinds) + [RANGE_NOTE] * ("range" in kinds)
             + ["(no interval: one run a side)"] * (kinds == {"none"}))
    return " or ".join(parts or ["[95% CI]"])


def ranged(items: Iterable[Any]) -> bool:
    """Whether any of these ratios, indices or comparisons shows a range, not a CI."""
    return any(i.interval == "range" for i in items if i is not None)


def duration(seconds: float) -> str:
    """A repetition's length: 47.2 ms, 2.01 s."""
    return f"{seconds * 1000:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def ratio_style(value: float) -> str:
    """A ratio's role: a gain (at least the baseline), a loss (under 0.9), or neither."""
    return "gain" if value >= 1 else ("loss" if value < 0.9 else "")


def median_parts(cell: Cell | None) -> list[Part]:
    """A baseline's cell of a headline: its median, ⚠ when a flag is raised on it."""
    if cell is None:
        return []
    if cell.summary is None:
        return [(f"failed ×{cell.failed}", "failed")]
    return [(fmt(cell.summary.median), ""), *([("⚠", "flag")] if cell.flags else [])]


def ratio_parts(cell: Cell | None) -> list[Part]:
    """A target's cell of a headline: its ratio to the baseline with its interval (none
    from a single sample), or why there is none; ⚠ when a flag is raised on it."""
    if cell is None:
        return []
    if cell.summary is None:
        return [(f"failed ×{cell.failed}", "failed")]
    parts: list[Part] = []
    if cell.ratio is not None:
        parts += [(sig3(cell.ratio.value), ratio_style(cell.ratio.value)),
                  (ratio_interval(cell.ratio), "interval")]
    elif cell.no_ratio is not None:
        parts.append((cell.no_ratio, "interval"))
    return parts + ([("⚠", "flag")] if cell.flags else [])


def index_parts(index: Index | None) -> list[Part]:
    """A class's composite index of a target, with its interval."""
    if index is None:
        return []
    return [(sig3(index.value), "index"), (ratio_interval(index), "interval")]


def plain(parts: list[Part]) -> str:
    return "".join(text for text, _ in parts)


# -- labels, titles, parameters ----------------------------------------------------------------

def target_label(run: Run, name: str) -> str:
    """A target as every view names it: with its accelerator or runtime where its name
    does not say it (vm (tcg), container (runc))."""
    fp = run.targets.get(name, {}).get("fingerprint", {})
    # An ssh target: what the plan calls the machine, beside the hypervisor found there.
    detail = fp.get("accel") or fp.get("runtime") or ", ".join(dict.fromkeys(
        v for v in (fp.get("label"), fp.get("hypervisor")) if v and v not in name))
    # vmtax lab: never hardware's KVM (a vm's accel, a libvirt domain's type), nor a bare
    # host (the lab's own system, a TCG guest)
    if run.host.get("lab") and "kvm" in (detail, fp.get("domain_type")):
        detail = "nested KVM"
    elif run.host.get("lab") and fp.get("lab_host"):
        detail = "lab"
    return f"{name} ({detail})" if detail and detail not in name else name


def run_title(run: Run) -> str:
    """A run's title line: its id, name, start, status (and lab)."""
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.created))
    name = run.plan.get("name")
    lab = f"  ·  {run.host['lab']}" if run.host.get("lab") else ""
    return printable(f"run {run.id}{f' ({name})' if name else ''}  ·  {started}  ·  {run.status}"
                     + lab)


def fixed_params(rows: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """Per workload run at several parameter sets (a sweep), the parameters every set has
    the same: a table shows what varies and says these once (fixed_note). rows: anything
    with .workload and .params (repetitions, comparison rows)."""
    sets: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.params not in sets.setdefault(row.workload, []):
            sets[row.workload].append(row.params)
    fixed = {}
    for workload, params in sets.items():
        same = {k: v for k, v in params[0].items() if all(p.get(k, v) == v and k in p
                                                            for p in params[1:])}
        if len(params) > 1 and same:
            fixed[workload] = same
    return fixed


def varying(params: dict[str, Any], workload: str,
            fixed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A row's parameters less those its workload's every row has the same."""
    return {k: v for k, v in params.items() if k not in fixed.get(workload, {})}


def fixed_note(fixed: dict[str, dict[str, Any]]) -> str:
    """What a sweep keeps the same, once: "memory: memory-oper=write throughout"."""
    return "; ".join(f"{workload}: " + " ".join(f"{k}={v}" for k, v in params.items())
                     + " throughout" for workload, params in fixed.items())


def workload_parameters(reps: Iterable[Any]) -> dict[str, str]:
    """Per workload, the parameters its measured repetitions ran with (store.Rep's): one
    configuration's as KEY=VALUE words; of several, what they share, then each varied
    parameter's values ("memory-block-size=16K|1M")."""
    sets: dict[str, list[dict[str, Any]]] = {}
    for rep in reps:
        if rep.phase == "measure" and rep.params not in sets.setdefault(rep.workload, []):
            sets[rep.workload].append(rep.params)
    found = {}
    for workload, params in sets.items():
        keys = dict.fromkeys(k for p in params for k in p)
        found[workload] = " ".join(
            f"{k}=" + "|".join(dict.fromkeys(str(p[k]) if k in p else "–" for p in params))
            for k in keys)
    return {w: text for w, text in found.items() if text}


def param_changes(rows: Iterable[Any]) -> list[str]:
    """Where two sides compared (summary.CompareRow's) ran a workload with other
    parameters: "cpu: cpu-max-prime 2000 → 20000", once each."""
    lines = []
    for row in rows:
        changed = [f"{k} {row.params.get(k, '–')} → {row.params_b.get(k, '–')}"
                   for k in dict.fromkeys([*row.params, *row.params_b])
                   if row.params.get(k) != row.params_b.get(k)]
        if changed:
            lines.append(f"{row.workload}: {', '.join(changed)}")
    return list(dict.fromkeys(lines))


def fingerprint_value(value: object) -> str:
    """A fingerprint's value as text, never Python's own spelling: lists joined (records
    by "; "), a record as KEY=VALUE words, none (or an empty list) as "–", booleans as
    yes/no, floats to four significant digits (a measured 0.03536973999987007 s is
    0.03537)."""
    if value is None or value == []:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return fmt(value)
    if isinstance(value, list):
        return ("; " if any(isinstance(v, dict) for v in value) else ", ").join(
            fingerprint_value(v) for v in value)
    if isinstance(value, dict):
        return " ".join(f"{k}={fingerprint_value(v)}" for k, v in value.items())
    return str(value)


def recommendation_lines(classes: list[Any]) -> list[str]:
    """The classes' recommendations (composite.ClassIndex), one in all when no class had
    runs enough for a verdict."""
    from vmtax.analysis import composite

    lines = [ci.recommendation for ci in classes]
    if lines and all("too few runs" in line for line in lines):
        return [f"no recommendation: too few runs for a verdict (at least "
                f"{composite.MIN_RUNS} per target)"]
    return lines


# -- flags -----------------------------------------------------------------------------------

def flag_text(flag: str, cell: Cell) -> str:
    """A flag as a table shows it, with the figure that raised it where one helps."""
    from vmtax.analysis import composite
    from vmtax.analysis.summary import TOO_SHORT

    if flag == TOO_SHORT and cell.duration is not None:
        return f"{flag} ({duration(cell.duration)})"
    if flag == composite.FASTER and cell.ratio is not None and cell.ratio.interval != "ci":
        return f"{flag} (too few runs to test it: n={cell.n})"
    return flag


def flag_counts(rows: list[Row]) -> dict[str, int]:
    """How many cells of these rows raise each kind of flag, most frequent first (a flag
    "KIND: detail" counts as its kind)."""
    counts: dict[str, int] = {}
    for row in rows:
        for cell in row.cells.values():
            for flag in {f.partition(": ")[0] for f in cell.flags}:
                counts[flag] = counts.get(flag, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def flags_line(rows: list[Row], context: str = "") -> str:
    """The flags of the headline's rows, the primary metrics (RunModel.headline: every view
    counts these, so a report and the terminal give one count) in one line: "primary
    metrics: 3 cells noisy (CV > 5%), 1 clock skew"; context: the host's load during the
    run (RunModel.load_note)."""
    from vmtax.analysis import summary as analysis

    counts = flag_counts(rows)
    if not counts:
        return ""
    why = {"noisy": f"CV > {analysis.NOISY_CV:.0%}",
           analysis.TOO_SHORT: "repetitions too short to time",
           "faster than baseline": "suspicious", "clock skew": "guest clock disagreed"}
    parts = [f"{n} cell{'s' * (n != 1)} {flag}" + (f" ({why[flag]})" if flag in why
                                                    else "")
             for flag, n in counts.items()]
    return "⚠ primary metrics: " + ", ".join(parts) + (f": {context}" if context else "")


# -- a trend ---------------------------------------------------------------------------------

def runs_text(points: list[Any]) -> str:
    """"run 5", or "runs 1–4" (history.Point's, by their numbers among the host's runs of
    the name)."""
    first, last = points[0].run.number, points[-1].run.number
    return f"run {first}" if first == last else f"runs {first}–{last}"


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
        from vmtax.analysis.history import HELD_AT_MOST

        return f"no change point there within {HELD_AT_MOST} more runs like these"
    if recent.more_runs:
        more = recent.more_runs
        return (f"up to {more} more run{'s' * (more != 1)} like "
                f"{'these' if recent.held else 'it'} before it can be a change point")
    return "not yet a change point (the adjustment across series holds it back)"


def method_note(trend: Trend) -> str:
    """How change points are found, and what one needs: said from the test itself."""
    from vmtax.analysis import changepoint   # numpy: not for `vmtax runs`

    method = "Benjamini-Hochberg" if trend.method == "bh" else "Holm"
    each = changepoint.runs_each_side(trend.alpha)
    return (f"change points: rank test over each run's median, p adjusted ({method}) over "
            f"{trend.tests} test{'s' * (trend.tests != 1)}, α={trend.alpha:g}; a clean "
            f"step is called once it has {each} runs on each side (some sooner; before the "
            "adjustment)")
