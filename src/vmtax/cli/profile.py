"""`vmtax profile`: where stored cells' host CPU time went (`--collect profile`), and which
functions grew from one cell to another per unit of work (vmtax.analysis.profile)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import click

from vmtax.analysis import profile
from vmtax.cli import bounds
from vmtax.cli.consoles import out
from vmtax.results.store import Store


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


@profile_command.command("show")
@click.argument("spec", metavar="RUN[:TARGET]")
@top_option
@results_option
@json_option
def show(spec: str, top: int, results: str, as_json: bool) -> None:
    """Top functions (by their own samples) and DSOs of each profiled cell, per thread
    class; the unresolved share, the profiler's overhead and hints from the symbols."""
    found, missing = profile.cells(Store(results, readonly=True), spec)
    if as_json:
        click.echo(json.dumps({"cells": [profile.as_json(c, top) for c in found],
                               "without": missing}, indent=2))
        return
    from vmtax.report import profile_tables

    profile_tables.print_cells(out, found, missing, top)


@profile_command.command("diff")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@top_option
@results_option
@json_option
def diff(a: str, b: str, top: int, results: str, as_json: bool) -> None:
    """Functions whose CPU time per unit of work rose from A to B (runs or RUN:TARGET
    cells of the same workload), the most added first; by share where the work is unknown."""
    store = Store(results, readonly=True)
    diffs = [(x, y, profile.diff(x, y)[:top])
             for x, y in profile.pair(profile.cells(store, a)[0], profile.cells(store, b)[0])]
    if as_json:
        click.echo(json.dumps({"pairs": [
            {"a": profile.as_json(x, top), "b": profile.as_json(y, top),
             "unit": y.work_unit, "total_us_per_unit": {"a": x.total_per_unit,
                                                         "b": y.total_per_unit},
             "rose": [asdict(c) for c in rose]}
            for x, y, rose in diffs]}, indent=2))
        return
    from vmtax.report import profile_tables

    profile_tables.print_diff(out, diffs)
