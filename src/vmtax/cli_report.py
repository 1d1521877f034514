"""`vmtax report` and `vmtax export`: stored runs as an HTML report, figure files, tidy data."""

from __future__ import annotations

import os
import sys

import click

from vmtax import export as export_mod
from vmtax.errors import VmtaxError
from vmtax.store import Run, Store

# Paths are plain click.Path(): writing them reports a bad one as vmtax's usual one-line
# error, where click's own checks would print a usage block.
results_option = click.option(
    "--results", "results", default=os.environ.get("VMTAX_RESULTS", "results"),
    show_default=True, type=click.Path(), metavar="DIR",
    help="Results directory (one SQLite database in it).")


def _load(store: Store, run_id: str) -> Run:
    """A stored run that has something to show."""
    run = store.load_run(run_id)
    measured = [r for r in run.reps if r.phase == "measure"]
    if not any(r.status == "ok" for r in measured):
        failed = sum(r.status != "ok" for r in run.reps)
        raise VmtaxError(f"run {run.id} has no successful repetitions ({failed} failed); "
                         f"`vmtax show {run.id}` lists why")
    return run


@click.command()
@click.argument("run_ids", metavar="RUN_ID [RUN_ID...]", nargs=-1, required=True)
@click.option("--html", "html_path", required=True, type=click.Path(), metavar="FILE",
              help="Write the report to this file (self-contained: opens offline).")
@click.option("--png", "png_dir", type=click.Path(), metavar="DIR",
              help="Also write every figure as PNG into this directory.")
@click.option("--svg", "svg_dir", type=click.Path(), metavar="DIR",
              help="Also write every figure as SVG into this directory.")
@results_option
def report(run_ids, html_path, png_dir, svg_dir, results) -> None:
    """Write an HTML report of stored runs: findings, figures, every metric, fingerprints.

    RUN_ID may be a unique prefix of a run id, or 'last'.
    """
    from vmtax import htmlreport, plots   # matplotlib loads only for the commands that draw

    store = Store(results, readonly=True)
    runs = list({run.id: run for run in (_load(store, r) for r in run_ids)}.values())
    reports = [htmlreport.build(run) for run in runs]
    export_mod.write_file(html_path, htmlreport.render_html(reports).encode())
    written = 0
    for fmt, directory in (("png", png_dir), ("svg", svg_dir)):
        if directory:
            out_dir = export_mod.output_dir(directory)
            for rep in reports:
                for chart in rep.charts:
                    export_mod.write_file(out_dir / f"{rep.run.id}-{chart.slug}.{fmt}",
                                          plots.render(chart, fmt))
                    written += 1
    click.echo(f"wrote {html_path}" + (f" and {written} figure files" if written else ""))


@click.command()
@click.argument("run_id")
@click.option("--csv", "csv_path", type=click.Path(), metavar="FILE",
              help="Write CSV to this file (- for stdout).")
@click.option("--json", "json_path", type=click.Path(), metavar="FILE",
              help="Write JSON (a list of records) to this file (- for stdout).")
@results_option
def export(run_id, csv_path, json_path, results) -> None:
    """Write a run's tidy data: one row per repetition × metric, with every parameter and
    the host and target fingerprints as columns (for pandas, R, spreadsheets)."""
    if not csv_path and not json_path:
        raise click.UsageError("give --csv FILE or --json FILE (or both)")
    if csv_path == "-" and json_path == "-":
        raise click.UsageError("only one of --csv and --json can go to stdout (-)")
    run = _load(Store(results, readonly=True), run_id)
    for path, encode in ((csv_path, export_mod.to_csv), (json_path, export_mod.to_json)):
        if path == "-":   # stdout, for a pipe: nothing else is printed there
            sys.stdout.buffer.write(encode(run))
            sys.stdout.flush()
        elif path:
            export_mod.write_file(path, encode(run))
            click.echo(f"wrote {path}", err=True)
