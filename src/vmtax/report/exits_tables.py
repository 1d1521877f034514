"""`vmtax exits`' tables: per reason of a cell's VM exits, and how each reason's share
moved from A to B (vmtax.analysis.exits computes them). They fit an 80-column terminal."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vmtax.analysis.exits import Cell, Change
from vmtax.core.text import printable
from vmtax.report.parts import fmt
from vmtax.report.terminal import grouped_notes


def _shown(text: str) -> str:
    """Stored text (a label, an imported report's reasons) as markup that prints it as it
    is: markup and control characters escaped."""
    return escape(printable(text, newlines=True))


def _result_text(cell: Cell) -> str:
    """The workload's medians: "latency max[thread=0] 41 µs, ..." """
    return ", ".join(f"{key.rsplit(' ', 1)[0]} {value:g} {key.rsplit(' ', 1)[1]}"
                     for key, value in cell.result.items())


def _num(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "—" if value is None else f"{value:,.{digits}f}{suffix}"


def _table(title: str, headers: list[str], rows: list[list[str]],
           total: list[str] | None = None) -> Table:
    """Fits an 80-column terminal: the reason (the first column) folds, a number is never
    broken, and a header may take two lines ("A", then "time %"). A table wider than the
    terminal even so is printed uncropped."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  padding=(0, 1), collapse_padding=True, show_edge=False)
    table.add_column(headers[0], overflow="fold")
    for header in headers[1:]:
        table.add_column(header, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    if total:
        table.add_section()
        table.add_row(*total)
    return table


def print_cells(out: Console, found: list[Cell], missing: list[str]) -> None:
    """Each cell's per-reason table with totals, then why the cells without exits have none."""
    def micros(value: float | None) -> str:
        """Four significant digits (521.6, 1,227): the room goes to the reasons' names."""
        return "—" if value is None else fmt(value)

    for cell in found:
        rows = [[_shown(r.reason), f"{r.samples:,}", _num(r.share), _num(r.time_share),
                 micros(r.avg), micros(r.min), micros(r.max), _num(r.spread),
                 _num(r.per_second, 1)] for r in cell.reasons]
        times = cell.times_impossible is None
        total = ["total", f"{cell.total_samples:,}", "100", "100" if times else "—",
                 micros(cell.total_time / cell.total_samples
                        if cell.total_samples and times else None),
                 "", "", "", _num(cell.total_samples / cell.seconds if cell.seconds else None, 1)]
        table = _table(_shown(cell.label), ["reason", "samples", "%", "time\n%", "avg\nµs",
                                            "min\nµs", "max\nµs", "±\n%", "/s"], rows, total)
        out.print(table, crop=False)
        seconds = f"{cell.seconds:.2f} s of workload time" if cell.seconds else "unknown time"
        if times:
            out.print(f"  {cell.total_samples:,} exits handled in {cell.total_time:,.2f} µs "
                      f"over {seconds}")
        else:
            out.print(f"  {cell.total_samples:,} exits over {seconds}; their times are not "
                      f"shown, as they cannot be true: {_shown(cell.times_impossible or '')} "
                      "(perf times an exit until the vCPU's next entry, across the pauses "
                      "of the guest between repetitions and a nested clock's jumps); the "
                      "samples and their shares stand", soft_wrap=False)
        if cell.result:
            out.print(f"  {_shown(cell.workload)}: {_shown(_result_text(cell))}")
    for line in grouped_notes(missing):   # once for all TCG guests, not once each
        out.print(_shown(line))


def print_diff(out: Console, event: str, cell_a: Cell, cell_b: Cell, changes: list[Change],
               only_a: list[str], only_b: list[str]) -> None:
    """The reasons' shares of A and B side by side, the change, and each cell's result."""
    rows = []
    for c in changes:
        side = " (A only)" if c.share_b is None else " (B only)" if c.share_a is None else ""
        rows.append([_shown(c.reason) + side, _num(c.share_a), _num(c.share_b),
                     f"{c.change:+.2f}", _num(c.time_share_a), _num(c.time_share_b),
                     "—" if c.time_change is None else f"{c.time_change:+.2f}",
                     _num(c.per_second_a, 1), _num(c.per_second_b, 1)])
    table = _table(f"exits ({event}): A → B", ["reason", "A %", "B %", "Δ pp", "A\ntime %",
                                                "B\ntime %", "Δ time\npp", "A /s", "B /s"],
                   rows)
    out.print(table, crop=False)
    for name, cell in (("A", cell_a), ("B", cell_b)):
        result = _result_text(cell)
        out.print(f"{name}: {_shown(cell.label)}: {cell.total_samples:,} exits"
                  + (f" in {cell.seconds:.2f} s" if cell.seconds else "")
                  + (f"; {_shown(cell.workload)}: {_shown(result)}" if result else ""))
    for name, cell in (("A", cell_a), ("B", cell_b)):
        if cell.times_impossible:
            out.print(f"{name}'s exit times cannot be true "
                      f"({_shown(cell.times_impossible)}): no change of time share is given")
    if only_a or only_b:
        out.print(_shown("only in A: " + (", ".join(only_a) or "—") + "; only in B: "
                         + (", ".join(only_b) or "—")))
