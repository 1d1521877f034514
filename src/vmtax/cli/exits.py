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
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vmtax import __version__
from vmtax.cli import bounds
from vmtax.core.limits import MAX_SECONDS
from vmtax.core import collector, workload
from vmtax.core.errors import ParseError, VmtaxError
from vmtax.core.text import printable, read_user_file
from vmtax.helpers import perf_kvm
from vmtax.results.store import IMPORTED, Rep, Run, Store, check_run_name

out = Console(highlight=False)
# What made an imported report's text; IMPORTED is its workload and target kind.
IMPORT_ARGV = ["perf", "kvm", "stat", "report"]
# A report lists a few dozen exit reasons per vCPU: kilobytes. Anything larger is not one.
MAX_REPORT_BYTES = 16 << 20


def _shown(text: str) -> str:
    """Stored text (a label, an imported report's reasons) as markup that prints it as it
    is: markup and control characters escaped."""
    return escape(printable(text, newlines=True))

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


@dataclass
class Reason:
    reason: str
    samples: int
    share: float                 # % of samples
    time_share: float            # % of handling time
    avg: float                   # µs
    min: float | None
    max: float | None
    spread: float | None         # ± % of the mean
    per_second: float | None     # samples per second of workload time


@dataclass
class Cell:
    """One cell's exits: a target running one workload with its parameters."""
    run: str
    target: str
    workload: str
    params: dict[str, Any]
    event: str
    reasons: list[Reason]
    total_samples: int
    total_time: float            # µs
    seconds: float | None        # workload time the recording spans
    result: dict[str, float] = field(default_factory=dict)   # the workload's own medians

    @property
    def label(self) -> str:
        params = ", ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.run}:{self.target} · {self.workload}" + (f" ({params})" if params else "")


def _measured(run: Run, rep: Rep) -> list[Rep]:
    return [r for r in run.reps if r.phase == "measure" and r.status == "ok"
            and (r.target, r.workload, r.params) == (rep.target, rep.workload, rep.params)]


def _result(name: str, reps: list[Rep]) -> dict[str, float]:
    """Medians of the workload's headline metrics over the cell's measured repetitions."""
    try:
        cls = workload.get(name)
    except VmtaxError:   # an imported report's, or a workload no longer installed
        return {}
    wanted = {s.name for s in cls.metrics if s.group and not s.secondary}
    values: dict[str, list[float]] = {}
    for rep in reps:
        for m in rep.metrics:
            if m.name in wanted:
                values.setdefault(f"{m.key} {m.unit}", []).append(m.value)
    return {key: statistics.median(v) for key, v in values.items()}


def _selected(dimensions: dict[str, str] | Any, event: str, vcpu: int | None) -> bool:
    return (dimensions.get("event") == event
            and dimensions.get("vcpu") == (None if vcpu is None else str(vcpu)))


def _cell(run: Run, rep: Rep, event: str, vcpu: int | None) -> Cell:
    found: dict[str, dict[str, float]] = {}
    totals: dict[str, float] = {}
    for m in rep.metrics:
        if not _selected(m.dimensions, event, vcpu):
            continue
        if "reason" in m.dimensions:
            found.setdefault(m.dimensions["reason"], {})[m.name] = m.value
        else:
            totals[m.name] = m.value
    if imported := run.targets.get(rep.target, {}).get("fingerprint", {}).get("seconds"):
        seconds: float | None = float(imported)
        measured: list[Rep] = []
    else:
        measured = _measured(run, rep)
        times = [r.host_elapsed for r in measured if r.host_elapsed is not None]
        seconds = sum(times) if times else None
    reasons = [Reason(name, int(v["exits"]), v["exit share"], v["exit time share"],
                      v["exit time avg"], v.get("exit time min"), v.get("exit time max"),
                      v.get("exit time spread"),
                      v["exits"] / seconds if seconds else None)
               for name, v in found.items()]
    reasons.sort(key=lambda r: (-r.time_share, r.reason))
    return Cell(run.id, rep.target, rep.workload, rep.params, event, reasons,
                int(totals.get("exits total", 0)), totals.get("exit time total", 0.0), seconds,
                _result(rep.workload, measured))


def exits_collectors() -> list[str]:
    """The collectors that record VM exits: their manifest declares perf kvm stat's metrics."""
    wanted = {spec.name for spec in perf_kvm.METRICS}
    return sorted(name for name, cls in collector.registered().items()
                  if wanted <= {spec.name for spec in cls.metrics})


def _records_exits(run: Run, rep: Rep, collectors: list[str]) -> bool:
    """Is rep a cell's record of VM exits: a collector's (argv [NAME]) or an import's?"""
    if rep.phase != "collect":
        return False
    return IMPORTED in run.plan or (len(rep.argv) == 1 and rep.argv[0] in collectors)


def cells(store: Store, spec: str, event: str, vcpu: int | None = None,
          workload: str | None = None) -> tuple[list[Cell], list[str]]:
    """The cells of RUN or RUN:TARGET (of one workload, or all) with exits of `event` (of
    all vCPUs, or of one), and why each other cell asked to record them has none
    ("vm:tcg · cyclictest: exits: unavailable — ...")."""
    run_id, _, target = spec.partition(":")
    run = store.load_run(run_id, last_may_be_imported=True)
    if target and target not in run.targets:
        raise VmtaxError(f"run {run.id} has no target {target!r}; it has: "
                         + ", ".join(run.targets))
    collectors = exits_collectors()
    recorded = [rep for rep in run.reps if _records_exits(run, rep, collectors)
                and target in ("", rep.target)]
    if workload is not None and workload not in {rep.workload for rep in recorded}:
        raise VmtaxError(f"{spec}: no workload {workload!r} recorded VM exits; these did: "
                         + (", ".join(sorted({rep.workload for rep in recorded})) or "none"))
    found, missing = [], []
    for rep in recorded:
        if workload not in (None, rep.workload):
            continue
        if any(_selected(m.dimensions, event, vcpu) for m in rep.metrics):
            found.append(_cell(run, rep, event, vcpu))
        else:
            asked = f"--event={event}" + ("" if vcpu is None else f" --vcpu={vcpu}")
            missing.append(f"{rep.target} · {rep.workload}: "
                           + (rep.error or f"no {asked} recorded"))
    return found, missing


def _one(store: Store, spec: str, event: str, vcpu: int | None,
         workload: str | None) -> Cell:
    found, missing = cells(store, spec, event, vcpu, workload)
    if len(found) == 1:
        return found[0]
    if not found:
        from vmtax.report.terminal import grouped_notes

        collectors = exits_collectors()
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
def show(spec, event, vcpu, workload, results, as_json) -> None:
    """Per-reason table of a run's cells, sorted by share of time, with totals."""
    store = Store(results, readonly=True)
    found, missing = cells(store, spec, event, vcpu, workload)
    if not found:
        _one(store, spec, event, vcpu, workload)   # raises, saying why
    if as_json:
        click.echo(json.dumps({"cells": [asdict(c) for c in found], "without": missing},
                              indent=2))
        return
    from vmtax.report.terminal import fmt, grouped_notes

    def micros(value: float | None) -> str:
        """Four significant digits (521.6, 1,227): the room goes to the reasons' names."""
        return "—" if value is None else fmt(value)

    for cell in found:
        rows = [[_shown(r.reason), f"{r.samples:,}", _num(r.share), _num(r.time_share),
                 micros(r.avg), micros(r.min), micros(r.max), _num(r.spread),
                 _num(r.per_second, 1)] for r in cell.reasons]
        total = ["total", f"{cell.total_samples:,}", "100", "100",
                 micros(cell.total_time / cell.total_samples if cell.total_samples else None),
                 "", "", "", _num(cell.total_samples / cell.seconds if cell.seconds else None, 1)]
        table = _table(_shown(cell.label), ["reason", "samples", "%", "time\n%", "avg\nµs",
                                            "min\nµs", "max\nµs", "±\n%", "/s"], rows, total)
        out.print(table, crop=False)
        seconds = f"{cell.seconds:.2f} s of workload time" if cell.seconds else "unknown time"
        out.print(f"  {cell.total_samples:,} exits handled in {cell.total_time:,.2f} µs "
                  f"over {seconds}")
        if cell.result:
            out.print(f"  {_shown(cell.workload)}: {_shown(_result_text(cell))}")
    for line in grouped_notes(missing):   # once for all TCG guests, not once each
        out.print(_shown(line))


@dataclass
class Change:
    reason: str
    share_a: float | None        # % of samples
    share_b: float | None
    change: float                # percentage points, B - A (absent counts as 0)
    time_share_a: float | None
    time_share_b: float | None
    time_change: float
    per_second_a: float | None
    per_second_b: float | None


def diff_cells(a: Cell, b: Cell) -> list[Change]:
    """Per reason, how its shares moved from A to B, sorted by |change| of sample share."""
    ra, rb = {r.reason: r for r in a.reasons}, {r.reason: r for r in b.reasons}
    changes = []
    for name in [*ra, *(n for n in rb if n not in ra)]:
        x, y = ra.get(name), rb.get(name)
        changes.append(Change(
            name, x.share if x else None, y.share if y else None,
            round((y.share if y else 0.0) - (x.share if x else 0.0), 2),
            x.time_share if x else None, y.time_share if y else None,
            round((y.time_share if y else 0.0) - (x.time_share if x else 0.0), 2),
            x.per_second if x else None, y.per_second if y else None))
    changes.sort(key=lambda c: (-abs(c.change), c.reason))
    return changes


@exits_command.command("diff")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@event_option
@vcpu_option
@workload_option
@results_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def diff(a, b, event, vcpu, workload, results, as_json) -> None:
    """How each exit reason's share moved from A to B (runs or RUN:TARGET cells).

    Shares of samples and of time on both sides, the change in percentage points, exits
    per second of workload time, sorted by the size of the change; the workload's own
    result beside it, and the reasons only one side has.
    """
    store = Store(results, readonly=True)
    cell_a, cell_b = (_one(store, a, event, vcpu, workload),
                      _one(store, b, event, vcpu, workload))
    changes = diff_cells(cell_a, cell_b)
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
    rows = []
    for c in changes:
        side = " (A only)" if c.share_b is None else " (B only)" if c.share_a is None else ""
        rows.append([_shown(c.reason) + side, _num(c.share_a), _num(c.share_b),
                     f"{c.change:+.2f}", _num(c.time_share_a), _num(c.time_share_b),
                     f"{c.time_change:+.2f}", _num(c.per_second_a, 1), _num(c.per_second_b, 1)])
    table = _table(f"exits ({event}): A → B", ["reason", "A %", "B %", "Δ pp", "A\ntime %",
                                                "B\ntime %", "Δ time\npp", "A /s", "B /s"],
                   rows)
    out.print(table, crop=False)
    for name, cell in (("A", cell_a), ("B", cell_b)):
        result = _result_text(cell)
        out.print(f"{name}: {_shown(cell.label)}: {cell.total_samples:,} exits"
                  + (f" in {cell.seconds:.2f} s" if cell.seconds else "")
                  + (f"; {_shown(cell.workload)}: {_shown(result)}" if result else ""))
    if only_a or only_b:
        out.print(_shown("only in A: " + (", ".join(only_a) or "—") + "; only in B: "
                         + (", ".join(only_b) or "—")))


@exits_command.command("import")
@click.argument("file", metavar="FILE", type=click.Path())
@click.option("--label", required=True, metavar="NAME",
              help="The name the report is stored, shown and diffed under: its target, "
                   "and a name of its run (a later import of the label takes the name).")
@click.option("--seconds", type=bounds.seconds(0, low_open=True, high=30 * MAX_SECONDS),
              metavar="S",
              help="How long the recording ran, for exits per second.")
@results_option
def import_command(file, label, seconds, results) -> None:
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
