"""Terminal tables of stored runs (rich)."""

from __future__ import annotations

import math
import time

from rich.console import Console
from rich.table import Table
from rich.text import Text

from vmtax.analysis import Cell, RunSummary
from vmtax.store import Run

FLAG_STYLE = "bold yellow"


def fmt(value: float | None) -> str:
    """Four significant digits, without exponent noise for everyday magnitudes."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if math.isinf(value):
        return "∞"
    if value == 0:
        return "0"
    digits = max(0, 3 - int(math.floor(math.log10(abs(value)))))
    return f"{value:,.{digits}f}" if abs(value) < 1e7 else f"{value:.3e}"


def target_label(run: Run, name: str) -> str:
    fp = run.targets.get(name, {}).get("fingerprint", {})
    detail = fp.get("accel") or fp.get("runtime")
    return f"{name} ({detail})" if detail and detail not in name else name


def cell_text(cell: Cell | None, unit: str, is_baseline: bool) -> Text:
    text = Text()
    if cell is None:
        return text
    if cell.summary is None:
        text.append(f"failed ×{cell.failed}", style="red")
        return text
    s = cell.summary
    text.append(f"{fmt(s.median)}")
    if s.n > 1:
        text.append(f" [{fmt(s.ci_low)}, {fmt(s.ci_high)}]", style="dim")
    if cell.ratio is not None:
        r = cell.ratio
        style = "green" if r.value >= 1 else ("red" if r.value < 0.9 else "")
        text.append(f"\n×{r.value:.3f}", style=style)
        text.append(f" [{r.ci_low:.3f}, {r.ci_high:.3f}]", style="dim")
    elif is_baseline:
        text.append("\n×1 (baseline)", style="dim")
    if cell.failed:
        text.append(f"\n{cell.failed} failed", style="red")
    for flag in cell.flags:
        text.append(f"\n⚠ {flag}", style=FLAG_STYLE)
    return text


def print_summary(console: Console, run: Run, summary: RunSummary) -> None:
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.created))
    table = Table(title=f"run {run.id}  ·  {started}  ·  {run.status}",
                  caption="median [95% CI] over the measured runs; ×ratio to "
                          f"{summary.baseline} (below 1 = worse, whatever the metric's direction)",
                  show_lines=True)
    table.add_column("workload")
    table.add_column("metric")
    for name in summary.targets:
        table.add_column(target_label(run, name), justify="right")
    for row in summary.rows:
        params = " ".join(f"{k}={v}" for k, v in row.params.items())
        arrow = "↑" if row.higher_is_better else "↓"
        table.add_row(f"{row.workload}" + (f"\n{params}" if params else ""),
                      f"{row.metric} ({row.unit}) {arrow}",
                      *[cell_text(row.cells.get(t), row.unit, t == summary.baseline)
                        for t in summary.targets])
    console.print(table)
    for failure in summary.failures[:10]:
        console.print(f"[red]failed[/red] {failure['target']} · {failure['workload']} · "
                      f"{failure['phase']} {failure['idx'] + 1}: {failure['error']}")
    if len(summary.failures) > 10:
        console.print(f"[red]… and {len(summary.failures) - 10} more failed repetitions[/red]")


def print_runs(console: Console, runs: list[dict]) -> None:
    table = Table(title="stored runs")
    for col in ("id", "started", "status", "targets", "workloads", "runs", "failed"):
        table.add_column(col)
    for r in runs:
        table.add_row(r["id"], time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"])),
                      r["status"], ", ".join(r["targets"]), ", ".join(r["workloads"]),
                      str(r["reps"]), str(r["failed"]))
    console.print(table)
