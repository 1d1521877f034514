"""A name's series in the terminal (`vmtax trend`), and as Otava's CSV input."""

from __future__ import annotations

import csv
import io
import time

from rich.console import Console

from vmtax.analysis.history import NOTHING_CHANGED, FoundChange, Series, Trend
from vmtax.report.export import csv_cell, iso_time
from vmtax.report.parts import (change_interval, fmt, method_note, recent_status,
                                runs_text, series_status)
from vmtax.report.terminal import shown_text

SPARKS = "▁▂▃▄▅▆▇█"
# Points a sparkline shows (the newest), so that a line fits 80 columns.
SPARK_POINTS = 40


def sparkline(medians: list[float], changes: set[int]) -> str:
    """The point medians as bars scaled between their smallest and largest; '|' before
    the first point of a new segment; '…' first when older points are left out."""
    start = max(0, len(medians) - SPARK_POINTS)
    shown = medians[start:]
    low, high = min(shown), max(shown)
    bars = []
    for i, value in enumerate(shown, start):
        if i in changes:
            bars.append("|")
        level = 3 if high == low else round((value - low) / (high - low) * (len(SPARKS) - 1))
        bars.append(SPARKS[level])
    return ("…" if start else "") + "".join(bars)


def _day(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


def _print_change(console: Console, c: FoundChange) -> None:
    ch = c.change
    style = "red" if c.verdict == "worse" else "green"
    console.print(f"  [{style}]▶ run {c.after.number}[/{style}] ({shown_text(c.after.id)}) "
                  f"[{style}]{c.verdict}[/{style}]: {ch.change:+.1%}"
                  f"{change_interval('ci', ch.ci[0] - 1, ch.ci[1] - 1)}", soft_wrap=True)
    p = ch.p_adjusted if ch.p_adjusted is not None else ch.p_value
    console.print(f"    median {fmt(ch.before)} → {fmt(ch.after)}, p={p:.2g} (adjusted)",
                  soft_wrap=True)
    lines = c.what_changed or [NOTHING_CHANGED]
    console.print(f"    what changed since run {c.before.number}: {shown_text(lines[0])}",
                  soft_wrap=True)
    for line in lines[1:]:
        console.print(f"      {shown_text(line)}", soft_wrap=True)
    if c.accepted:
        console.print(f"    [dim]accepted by {shown_text(c.accepted['who'])} on "
                      f"{_day(c.accepted['at'])} (from run {shown_text(c.accepted['run_id'])} "
                      "on)[/dim]", soft_wrap=True)


def _print_series(console: Console, s: Series) -> None:
    arrow = "↑" if s.higher_is_better else "↓"
    unit = f" ({s.unit})" if s.unit and s.unit != s.metric else ""
    console.print(f"[bold]{shown_text(s.label)}[/bold]{shown_text(unit)} {arrow}",
                  soft_wrap=True)
    medians = [p.median for p in s.points]
    latest = s.points[-1]
    spark = sparkline(medians, {c.change.index for c in s.changes})
    console.print(f"  {spark}  latest {fmt(latest.median)} (run {latest.run.number})  "
                  f"{shown_text(series_status(s))}", soft_wrap=True)
    for c in s.changes:
        _print_change(console, c)
    if s.accepted is not None and s.accepted_from > s.segment_start:
        console.print(f"  [dim]accepted by {shown_text(s.accepted['who'])} on "
                      f"{_day(s.accepted['at'])} as it is from run "
                      f"{s.points[s.accepted_from].run.number} on[/dim]", soft_wrap=True)
    recent = s.recent
    if recent is None or recent.verdict not in ("better", "worse", "no verdict"):
        return
    judged = recent.comparison
    against = (f"{judged.change:+.1%}"
               f"{change_interval(judged.interval, *judged.change_ci)} against "
               f"{runs_text(recent.against)}")
    head = (f"runs {recent.judged[0].run.number}–{latest.run.number}" if recent.held
            else f"newest run {latest.run.number}")
    if recent.verdict == "no verdict" and recent.spread is not None:
        low, high = recent.spread
        console.print(f"  {head}: {against}", soft_wrap=True)
        console.print(f"    within those runs' own run-to-run spread ({low:+.1%} … "
                      f"{high:+.1%}): no verdict", soft_wrap=True)
        return
    style = "red" if recent.verdict == "worse" else "green"
    console.print(f"  {head} [{style}]{recent.verdict}[/{style}]: {against}", soft_wrap=True)
    console.print(f"    p={judged.p_adjusted:.2g} (adjusted); "
                  f"{shown_text(recent_status(recent))}",
                  soft_wrap=True)


def print_trend(console: Console, trend: Trend) -> None:
    for host, runs in trend.runs.items():
        count = f"{len(runs)} run{'s' * (len(runs) != 1)}"
        span = (_day(runs[0].created) if len(runs) == 1
                else f"{_day(runs[0].created)} … {_day(runs[-1].created)}")
        console.print(f"[bold]{shown_text(trend.name)}[/bold] on {shown_text(host)}: "
                      f"{count}, {span}", soft_wrap=True)
    for note in trend.notes:
        console.print(f"[yellow]note:[/yellow] {shown_text(note)}")
    hosts = len(trend.runs) > 1
    shown_host = None
    for s in trend.series:
        if hosts and s.host != shown_host:
            shown_host = s.host
            console.print(f"\n[bold underline]{shown_text(s.host)}[/bold underline]")
        console.print()
        _print_series(console, s)
    console.print(f"\n[dim]{shown_text(method_note(trend))}[/dim]")


def _column(s: Series) -> str:
    """A series' column name: target.workload[.k=v].metric[.k=v], one token per part."""
    parts = [s.target, s.workload, *(f"{k}={v}" for k, v in (s.config or {}).items()),
             s.metric, *(f"{k}={v}" for k, v in s.dimensions.items())]
    return ".".join(part.replace(" ", "_").replace(",", ";") for part in parts)


def to_otava(trend: Trend) -> tuple[bytes, list[str]]:
    """Otava's CSV input: a `time` column (ISO 8601, UTC), the run's id and host as
    attributes, and one column per series, of its point medians (10 significant digits: a
    median of two repetitions is no longer 24756.059999999998); a row per run. The host
    column is `branch` when there are several, which Otava keeps apart (`--branch HOST`).
    Series some run lacks are left out (Otava takes no empty cell): returned by name."""
    runs = [r for host_runs in trend.runs.values() for r in host_runs]
    columns: dict[str, dict[str, float]] = {}
    for s in trend.series:
        columns.setdefault(_column(s), {}).update({p.run.id: p.median for p in s.points})
    complete = {name: by_run for name, by_run in columns.items() if len(by_run) == len(runs)}
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    # Names come from plans and hosts: escaped and guarded as in the CSV export.
    writer.writerow([csv_cell(c) for c in ["time", "run", "branch" if len(trend.runs) > 1
                                           else "host", *complete]])
    for r in sorted(runs, key=lambda r: r.created):
        writer.writerow([iso_time(r.created), r.id, csv_cell(r.host),
                         *(f"{by_run[r.id]:.10g}" for by_run in complete.values())])
    return text.getvalue().encode(), [name for name in columns if name not in complete]
