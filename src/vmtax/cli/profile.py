"""`vmtax profile`: where stored cells' host CPU time went (`--collect profile`), and which
functions grew from one cell to another per unit of work (vmtax.analysis.profile)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import click
from rich import box
from rich.console import Console
from rich.table import Table

from vmtax.analysis import profile
from vmtax.cli import bounds
from vmtax.core.text import markup as escape  # control characters too
from vmtax.results.store import Store

out = Console(highlight=False)

results_option = click.option(
    "--results", "results", default=os.environ.get("VMTAX_RESULTS", "results"),
    show_default=True, type=click.Path(), metavar="DIR",
    help="Results directory (one SQLite database in it).")
top_option = click.option("--top", type=bounds.count(), default=15, show_default=True,
                          help="Rows per table.")
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print JSON instead of tables.")


class _ProfileGroup(click.Group):
    """`vmtax profile RUN[:TARGET]` is `vmtax profile show RUN[:TARGET]`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            args = ["show", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_ProfileGroup)
def profile_command() -> None:
    """Where profiled cells' host CPU time went (`--collect profile`): top functions per
    thread class; which rose from A to B per unit of work.

    \b
      vmtax profile RUN[:TARGET]          top functions and DSOs by share, per thread class
      vmtax profile diff A B              functions whose time per unit of work rose, A to B

    RUN is a run id or a unique prefix of one, a run's name, or 'last'; A and B name cells
    as `vmtax compare` does (last:native, last:vm:tcg).
    """


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _table(title: str, columns: list[str]) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for i, column in enumerate(columns):
        # the first column (a function's name) takes what the numbers leave
        table.add_column(column, justify="left" if i == 0 else "right", overflow="fold",
                         no_wrap=i > 0, ratio=1 if i == 0 else None)
    return table


@profile_command.command("show")
@click.argument("spec", metavar="RUN[:TARGET]")
@top_option
@results_option
@json_option
def show(spec, top, results, as_json) -> None:
    """Top functions (by their own samples) and DSOs of each profiled cell, per thread
    class; the unresolved share, the profiler's overhead and hints from the symbols."""
    found, missing = profile.cells(Store(results, readonly=True), spec)
    if as_json:
        click.echo(json.dumps({"cells": [profile.as_json(c, top) for c in found],
                               "without": missing}, indent=2))
        return
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


@profile_command.command("diff")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@top_option
@results_option
@json_option
def diff(a, b, top, results, as_json) -> None:
    """Functions whose CPU time per unit of work rose from A to B (runs or RUN:TARGET
    cells of the same workload), the most added first; by share where the work is unknown."""
    store = Store(results, readonly=True)
    pairs = profile.pair(profile.cells(store, a)[0], profile.cells(store, b)[0])
    if as_json:
        click.echo(json.dumps({"pairs": [
            {"a": profile.as_json(x, top), "b": profile.as_json(y, top),
             "unit": y.work_unit, "total_us_per_unit": {"a": x.total_per_unit,
                                                         "b": y.total_per_unit},
             "rose": [asdict(c) for c in profile.diff(x, y)[:top]]}
            for x, y in pairs]}, indent=2))
        return
    for x, y in pairs:
        table = _table(f"{escape(x.label)} → {escape(y.label)}: CPU µs per "
                       f"{escape(y.unit)}",
                       ["function", "DSO", "A %", "B %", "A µs", "B µs", "added µs"])
        for change in profile.diff(x, y)[:top]:
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
