"""`vmtax report` and `vmtax export`: stored runs as an HTML report, figure files, tidy data."""

from __future__ import annotations

import itertools
import os
import sys

import click

from vmtax.core import hints, paths
from vmtax.cli.main import same_run
from vmtax.core.errors import VmtaxError
from vmtax.host import outputs
from vmtax.report import export as export_mod
from vmtax.analysis.model import RunModel, analyse, compare
from vmtax.results.store import IMPORTED, Run, Store

# Paths are plain click.Path(): writing them reports a bad one as vmtax's usual one-line
# error, where click's own checks would print a usage block.
results_option = click.option(
    "--results", "results", default=os.environ.get("VMTAX_RESULTS", "results"),
    show_default=True, type=click.Path(), metavar="DIR",
    help="Results directory (one SQLite database in it).")


def _load(store: Store, run_id: str, imported_ok: bool = False) -> Run:
    """A stored run that has something to show; an imported perf kvm stat report only
    with imported_ok (its exits per reason export as tidy data, but make no report)."""
    run = store.load_run(run_id)
    if IMPORTED in run.plan:
        if imported_ok:
            return run
        label = next(iter(run.targets), run.id)
        raise VmtaxError(f"run {run.id} is an imported perf kvm stat report ({label}): VM "
                         "exits per reason, no repetitions to report; "
                         f"`{hints.command('exits', run.id, results=store.dir)}` shows them, "
                         f"`{hints.command('export', run.id, '--csv', 'FILE', results=store.dir)}`"
                         " exports them")
    measured = [r for r in run.reps if r.phase == "measure"]
    if not any(r.status == "ok" for r in measured):
        failed = sum(r.status != "ok" for r in run.reps)
        raise VmtaxError(f"run {run.id} has no successful repetitions ({failed} failed); "
                         f"`{hints.command('show', run.id, results=store.dir)}` lists why")
    return run


def _per_host(store: Store, run: Run) -> dict[str, Run] | None:
    """The fleet run set of run, per host; None for a run that was not run on a fleet."""
    if not run.host.get("fleet"):
        return None
    from vmtax.studies import fleet

    return fleet.host_runs(store, run)


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
    """Write an HTML report of stored runs: findings, figures, every metric, fingerprints;
    of two runs, also the second against the first (change, CI, verdict per metric).

    RUN_ID may be a unique prefix of a run id, a run's name, or 'last' (the latest run
    recorded here, imported perf kvm stat reports aside). One run of a fleet
    (`vmtax run --fleet`): a section per host and the spread of each ratio across them.
    """
    from vmtax.report import html as htmlreport  # matplotlib loads only for the commands that draw
    from vmtax.report import plots

    store = Store(results, readonly=True)
    loaded = [_load(store, r) for r in run_ids]
    for (spec_a, a), (spec_b, b) in itertools.combinations(zip(run_ids, loaded), 2):
        if a.id == b.id:
            raise VmtaxError(same_run(spec_a, spec_b, a.id))
    runs = loaded
    per_host = _per_host(store, runs[0]) if len(runs) == 1 else None
    spread = None
    models: list[tuple[RunModel, str | None]]    # each run's model, its fleet host's name
    # Analysis first, each run once (and two runs' comparison once), then only rendering.
    if per_host:
        from vmtax.analysis.spread import spread as spread_of

        by_host = {name: analyse(run) for name, run in per_host.items()}
        spread = spread_of(per_host, {name: model.summary for name, model in by_host.items()})
        models = [(model, name) for name, model in by_host.items()]
    else:
        models = [(analyse(run), None) for run in runs]
    # Two runs: the second against the first, metric by metric, as `vmtax compare` does.
    comparison = compare(runs[0], runs[1], store=store) if len(runs) == 2 else None
    reports = [htmlreport.build(model, host=name) for model, name in models]
    outputs.write_file(html_path,
                          htmlreport.render_html(reports, comparison, spread).encode())
    written = 0
    for fmt, directory in (("png", png_dir), ("svg", svg_dir)):
        if directory:
            out_dir = outputs.output_dir(directory)
            for rep in reports:
                for chart in rep.charts:
                    stem = f"{rep.run.id}-{rep.host}" if rep.host else rep.run.id
                    # A host's name is the fleet's to say: never a path out of out_dir.
                    outputs.write_file(paths.under(out_dir, f"{stem}-{chart.slug}.{fmt}",
                                                      "a figure file"),
                                          plots.render(chart, fmt))
                    written += 1
    click.echo(f"wrote {html_path}" + (f" and {written} figure files" if written else ""))


def _markdown(run: Run, per_host: dict[str, Run] | None = None) -> bytes:
    from vmtax.report import markdown

    if per_host:
        return markdown.render_fleet(run.id, {host: analyse(host_run)
                                              for host, host_run in per_host.items()})
    return markdown.render(analyse(run))


FORMATS = {"csv": export_mod.to_csv, "json": export_mod.to_json, "jsonl": export_mod.to_jsonl,
           "benchstat": export_mod.to_benchstat, "markdown": _markdown}


@click.command()
@click.argument("run_id")
@click.option("--csv", "csv_path", type=click.Path(), metavar="FILE",
              help="Write CSV to this file (- for stdout).")
@click.option("--json", "json_path", type=click.Path(), metavar="FILE",
              help="Write JSON (a list of records) to this file (- for stdout).")
@click.option("--jsonl", "jsonl_path", type=click.Path(), metavar="FILE",
              help="Write JSON Lines (one record a line) to this file (- for stdout).")
@click.option("--benchstat", "benchstat_path", type=click.Path(), metavar="FILE",
              help="Write Go benchmark lines, one per repetition, for `benchstat` "
                   "(- for stdout): benchstat -col /target FILE.")
@click.option("--markdown", "markdown_path", type=click.Path(), metavar="FILE",
              help="Write the run's summary as a Markdown table, for a pull request or a CI "
                   "step summary (- for stdout).")
@click.option("--format", "to_stdout", type=click.Choice([*FORMATS, "otava"]),
              help="Write this format to stdout (as --FORMAT -); otava: the series of runs "
                   "named RUN_ID, one row per run, as Apache Otava's CSV input.")
@results_option
def export(run_id, csv_path, json_path, jsonl_path, benchstat_path, markdown_path, to_stdout,
           results) -> None:
    """Write a run's tidy data: one row per repetition × metric, with every parameter and
    the host and target fingerprints as columns (for pandas, R, spreadsheets); or its
    samples for benchstat; or its summary as Markdown. Times are ISO 8601 (UTC). A run of a
    fleet (`vmtax run --fleet`) is exported with its whole fleet run set: every host's rows,
    with a `host` column."""
    if to_stdout == "otava":   # a series of runs, not one run
        from vmtax.cli.trend import export_otava

        export_otava(results, run_id)
        return
    paths = {"csv": csv_path, "json": json_path, "jsonl": jsonl_path,
             "benchstat": benchstat_path, "markdown": markdown_path}
    if to_stdout:
        if paths[to_stdout] not in (None, "-"):
            raise click.UsageError(f"--format {to_stdout} writes to stdout; --{to_stdout} "
                                   "names a file: give one of them")
        paths[to_stdout] = "-"
    if not any(paths.values()):
        raise click.UsageError("give --csv, --json, --jsonl, --benchstat or --markdown FILE (or "
                               "several), or --format FORMAT for stdout")
    if sum(p == "-" for p in paths.values()) > 1:
        raise click.UsageError("only one format can go to stdout (-)")
    store = Store(results, readonly=True)
    # benchstat's lines and the summary are of measured repetitions, which an imported
    # report has none of.
    run = _load(store, run_id, imported_ok=not (paths["benchstat"] or paths["markdown"]))
    per_host = _per_host(store, run)
    for fmt, path in paths.items():
        encode = FORMATS[fmt]
        if path == "-":   # stdout, for a pipe: nothing else is printed there
            sys.stdout.buffer.write(encode(run, per_host))
            sys.stdout.flush()
        elif path:
            outputs.write_file(path, encode(run, per_host))
            click.echo(f"wrote {path}", err=True)
