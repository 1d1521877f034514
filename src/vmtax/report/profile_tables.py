"""`vmtax profile`'s tables: each profiled cell's top functions, DSOs and thread classes,
and the functions whose CPU time per unit of work rose from one cell to another (as
vmtax.analysis.profile computes them)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from vmtax.analysis import profile
from vmtax.core.text import markup as escape  # control characters too


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _table(title: str, columns: list[str]) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for i, column in enumerate(columns):
        # the first column (a function's name) takes what the numbers leave
        table.add_column(column, justify="left" if i == 0 else "right", overflow="fold",
                         no_wrap=i > 0, ratio=1 if i == 0 else None)
    return table


def print_cells(out: Console, found: list[profile.CellProfile], missing: list[str],
                top: int) -> None:
    """Each profiled cell: its totals, thread classes, top functions and DSOs, hints."""
    for cell in found:
        cpu = f"{cell.sampled_cpu:.2f} s of CPU" if cell.sampled_cpu is not None else "CPU"
        out.print(f"[bold]{escape(cell.label)}[/] · {cell.samples:,.0f} samples ({cpu}) · "
                  f"unresolved {_pct(cell.unresolved)}% · profiler overhead "
                  f"{_pct(cell.overhead)}% of the sampled CPU")
        if cell.symbols_note:
            out.print(f"  [dim]{escape(cell.symbols_note)}[/]")
        if len(cell.classes) > 1:
            table = _table("thread classes", ["class", "samples", "%"])
            for share in cell.classes[:top]:
                table.add_row(escape(share.name), f"{share.samples:,.0f}", _pct(share.share))
            out.print(table)
        table = _table("functions (own samples)", ["function", "DSO", "class", "%"])
        for share in cell.functions[:top]:
            table.add_row(escape(share.name), escape(share.dso), escape(share.cls),
                          _pct(share.share))
        out.print(table)
        table = _table("DSOs (own samples)", ["DSO", "class", "%"])
        for share in cell.dsos[:top]:
            table.add_row(escape(share.name), escape(share.cls), _pct(share.share))
        out.print(table)
        for hint in cell.hints:
            out.print(f"  {escape(hint)}")
        out.print()
    for line in missing:
        out.print(escape(line))


def print_diff(out: Console, diffs: list[tuple[profile.CellProfile, profile.CellProfile,
                                                 list[profile.Change]]]) -> None:
    """Per pair of cells, the functions whose CPU time per unit of work rose, A to B
    (profile.diff's top ones)."""
    for x, y, rose in diffs:
        table = _table(f"{escape(x.label)} → {escape(y.label)}: CPU µs per "
                       f"{escape(y.unit)}",
                       ["function", "DSO", "A %", "B %", "A µs", "B µs", "added µs"])
        for change in rose:
            table.add_row(escape(change.function), escape(change.dso), _pct(change.share_a),
                          _pct(change.share_b), _num(change.per_unit_a),
                          _num(change.per_unit_b), _num(change.added))
        out.print(table)
        out.print(_total_line(x, y))
        for side, cell in (("A", x), ("B", y)):
            if cell.symbols_note:
                out.print(f"  [dim]{side}: {escape(cell.symbols_note)}[/]")
        for hint in y.hints:
            out.print(f"  B: {escape(hint)}")
        out.print()


def _total_line(a: profile.CellProfile, b: profile.CellProfile) -> str:
    """Both sides' whole sampled CPU per unit of work: what the functions above add to."""
    ta, tb = a.total_per_unit, b.total_per_unit
    if ta is None or tb is None:
        return ("  total: no CPU time per unit of work (a side's work or CPU time is "
                "unknown): functions are ranked by share")
    return (f"  total CPU per {escape(b.unit)}: A {_num(ta)} µs, B {_num(tb)} µs "
            f"({'+' if tb >= ta else ''}{_num(tb - ta)} µs, ×{tb / ta:.3g})"
            if ta else f"  total CPU per {escape(b.unit)}: A {_num(ta)} µs, B {_num(tb)} µs")


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:,.3g}"
