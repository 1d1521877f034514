"""`vmtax composite`: E3's composite index of a stored run, per class and overall, with the
recommendation per class (vmtax.analysis.composite)."""

from __future__ import annotations

import json
import os

import click
from rich.console import Console

from vmtax.analysis import composite
from vmtax.analysis import summary as analysis
from vmtax.core.errors import VmtaxError
from vmtax.results.store import Store

results_option = click.option(
    "--results", "results", default=os.environ.get("VMTAX_RESULTS", "results"),
    show_default=True, type=click.Path(), metavar="DIR",
    help="Results directory (one SQLite database in it).")


@click.command()
@click.argument("run_id", default="last")
@click.option("--baseline", metavar="TARGET", help="Ratios to this target (default: the "
              "plan's baseline).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@results_option
def composite_command(run_id: str, baseline: str | None, as_json: bool, results: str) -> None:
    """The composite index of a stored run (RUN_ID, a prefix, its name or 'last'): per
    class, each target's geometric mean of its workloads' ratios to the baseline."""
    run = Store(results, readonly=True).load_run(run_id)
    names = [t["name"] for t in run.plan.get("targets", [])] or list(run.targets)
    if baseline is not None and baseline not in names:
        raise VmtaxError(f"--baseline: expected a target of run {run.id} "
                         f"({', '.join(names)}), got {baseline!r}")
    summary = analysis.summarize_run(run, baseline)
    classes, explanations = composite.composite(summary), composite.explanations(summary)
    if as_json:
        click.echo(json.dumps({"run": run.id, **composite.json_of(summary.baseline, classes,
                                                                  explanations)}, indent=2))
    else:
        from vmtax.report.composite_table import print_composite

        print_composite(Console(), summary, classes, explanations)
