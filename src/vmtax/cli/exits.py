"""`vmtax exits`: VM exits per reason of stored runs (E2), shown, diffed and imported.

A run's exits are the metrics a collector of VM exits stored with a cell (phase "collect",
argv [its name]): one whose manifest declares perf kvm stat's metrics
(vmtax.helpers.perf_kvm.METRICS), found in the collector registry. `vmtax exits import`
stores a saved `perf kvm stat report` text the same way, as a run of its own with one target
named by --label, so a capture made elsewhere or years ago is listed, shown and diffed like
one recorded by vmtax.

A run is given as everywhere else (vmtax.results.store.Store.resolve), and also by an
import's label; `last` here is the latest run, imported reports included, as they are this
command's runs too.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from vmtax import __version__
from vmtax.cli.consoles import out
from vmtax.analysis import exits
from vmtax.cli import bounds
from vmtax.core.limits import MAX_SECONDS
from vmtax.core.errors import ParseError, VmtaxError
from vmtax.core.text import read_user_file
from vmtax.helpers import perf_kvm
from vmtax.results.store import IMPORTED, Store, check_run_name

# What made an imported report's text; IMPORTED is its workload and target kind.
IMPORT_ARGV = ["perf", "kvm", "stat", "report"]
# A report lists a few dozen exit reasons per vCPU: kilobytes. Anything larger is not one.
MAX_REPORT_BYTES = 16 << 20


results_option = click.option(
    "--results", "results", default=os.environ.get("VMTAX_RESULTS", "results"),
    show_default=True, type=click.Path(), metavar="DIR",
    help="Results directory (one SQLite database in it).")
event_option = click.option(
    "--event", type=click.Choice(list(perf_kvm.EVENTS.values())), default="vmexit",
    show_default=True, help="Which event kind's table (the collector's `events` option).")
vcpu_option = click.option(
    "--vcpu", type=bounds.count(0), metavar="N",
    help="One vCPU's table (recorded with the collector's per_vcpu option); default: all.")
workload_option = click.option(
    "--workload", metavar="NAME",
    help="The cells of one workload, where a target ran several; default: all.")


def _one(store: Store, spec: str, event: str, vcpu: int | None,
         workload: str | None) -> exits.Cell:
    found, missing = exits.cells(store, spec, event, vcpu, workload)
    if len(found) == 1:
        return found[0]
    if not found:
        from vmtax.report.terminal import grouped_notes

        collectors = exits.exits_collectors()
        why = "; ".join(grouped_notes(missing)) if missing else (
            "it was not run with --collect " + " or ".join(collectors) if collectors
            else "no collector of VM exits is installed")
        raise VmtaxError(f"{spec}: no VM exits stored ({why})")
    targets = {c.target for c in found}
    workloads = sorted({c.workload for c in found})
    how = ("name one target as RUN:TARGET" if len(targets) > 1 else
           "name one workload with --workload (" + ", ".join(workloads) + ")"
           if len(workloads) > 1 else "they differ in parameters, which no option picks yet")
    raise VmtaxError(f"{spec}: {len(found)} cells have VM exits ("
                     + "; ".join(c.label for c in found) + f"): {how}")


class _ExitsGroup(click.Group):
    """`vmtax exits RUN[:TARGET]` is `vmtax exits show RUN[:TARGET]`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            args = ["show", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_ExitsGroup)
def exits_command() -> None:
    """VM exits per reason (`--collect exits`, or imported perf kvm stat reports).

    \b
      vmtax exits RUN[:TARGET]            per-reason table (same as `exits show`)
      vmtax exits diff A B [--json]       how each reason's share moved from A to B
      vmtax exits import FILE --label L   store a saved `perf kvm stat report` text

    RUN is a run id or a unique prefix of one, a run's name, an import's label (the latest
    of that name or label), or 'last': the latest run, imported reports included.
    """


@exits_command.command("show")
@click.argument("spec", metavar="RUN[:TARGET]")
@event_option
@vcpu_option
@workload_option
@results_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def show(spec: str, event: str, vcpu: int | None, workload: str | None, results: str,
         as_json: bool) -> None:
    """Per-reason table of a run's cells, sorted by share of time, with totals."""
    store = Store(results, readonly=True)
    found, missing = exits.cells(store, spec, event, vcpu, workload)
    if not found:
        _one(store, spec, event, vcpu, workload)   # raises, saying why
    if as_json:
        click.echo(json.dumps({"cells": [asdict(c) for c in found], "without": missing},
                              indent=2))
        return
    from vmtax.report import exits_tables

    exits_tables.print_cells(out, found, missing)


@exits_command.command("diff")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@event_option
@vcpu_option
@workload_option
@results_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def diff(a: str, b: str, event: str, vcpu: int | None, workload: str | None, results: str,
         as_json: bool) -> None:
    """How each exit reason's share moved from A to B (runs or RUN:TARGET cells).

    Shares of samples and of time on both sides, the change in percentage points, exits
    per second of workload time, sorted by the size of the change; the workload's own
    result beside it, and the reasons only one side has.
    """
    store = Store(results, readonly=True)
    cell_a, cell_b = (_one(store, a, event, vcpu, workload),
                      _one(store, b, event, vcpu, workload))
    changes = exits.diff_cells(cell_a, cell_b)
    only_a = [c.reason for c in changes if c.share_b is None]
    only_b = [c.reason for c in changes if c.share_a is None]
    if as_json:
        click.echo(json.dumps({
            "event": event,
            "a": {"cell": cell_a.label, "exits": cell_a.total_samples,
                  "seconds": cell_a.seconds, "result": cell_a.result},
            "b": {"cell": cell_b.label, "exits": cell_b.total_samples,
                  "seconds": cell_b.seconds, "result": cell_b.result},
            "reasons": [asdict(c) for c in changes], "only_a": only_a, "only_b": only_b},
            indent=2))
        return
    from vmtax.report import exits_tables

    exits_tables.print_diff(out, event, cell_a, cell_b, changes, only_a, only_b)


@exits_command.command("import")
@click.argument("file", metavar="FILE", type=click.Path())
@click.option("--label", required=True, metavar="NAME",
              help="The name the report is stored, shown and diffed under: its target, "
                   "and a name of its run (a later import of the label takes the name).")
@click.option("--seconds", type=bounds.seconds(0, low_open=True, high=30 * MAX_SECONDS),
              metavar="S",
              help="How long the recording ran, for exits per second.")
@results_option
def import_command(file: str, label: str, seconds: float | None, results: str) -> None:
    """Store a saved `perf kvm stat report` text (either layout, any machine or kernel)
    as a run, to list, show and diff like recorded ones."""
    check_run_name(label, "--label")
    path = Path(file)
    text = read_user_file(path, "the perf kvm stat report", MAX_REPORT_BYTES, errors="replace")
    try:
        report = perf_kvm.parse(text, file)
    except ParseError as exc:
        raise VmtaxError(str(exc)) from None
    if not report.rows:
        raise VmtaxError(f"{file}: the report has no exits to store")
    store = Store(results)
    plan = {"name": f"{IMPORTED}: {label}", IMPORTED: str(path.resolve()),
            "targets": [{"name": label, "kind": IMPORTED, "options": {}}], "workloads": []}
    run_id = store.new_run(plan, {"hostname": None}, __version__)
    fingerprint: dict[str, Any] = {"source": str(path.resolve()), "layout": report.layout,
                                   "vendor": report.vendor, "event": report.event}
    if seconds:
        fingerprint["seconds"] = seconds
    store.set_target(run_id, label, IMPORTED, fingerprint)
    store.add_rep(run_id, target=label, workload=IMPORTED, params={}, phase="collect", idx=0,
                  status="ok", argv=IMPORT_ARGV, started=path.stat().st_mtime, stdout=text,
                  metrics=report.metrics())
    store.finish_run(run_id, "done")
    click.echo(f"stored {len(report.rows)} {report.event} reasons "
               f"({report.layout} layout{', ' + report.vendor if report.vendor else ''}) "
               f"as run {run_id} (target {label})")
