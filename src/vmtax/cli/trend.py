"""`vmtax trend NAME`: the runs of one name as series, their change points and what changed
(vmtax.analysis.history); `--fail-on regression` for CI, `--accept RUN` to accept a change."""

from __future__ import annotations

import datetime
import getpass
import json
import os
import re
import sys

import click
from rich.console import Console

from vmtax.analysis import drift, history
from vmtax.cli import bounds
from vmtax.cli.main import _csv, results_option
from vmtax.core import hints
from vmtax.core.errors import VmtaxError
from vmtax.core.text import printable
from vmtax.results.store import Store, check_run_name


# How a date is written: 2026-11-28, with dashes (a run id, 20261201-230955-2105, is digits
# that ISO 8601's basic format reads as a date, a time and a UTC offset: 23:09:55-21:05).
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _when(store: Store, text: str | None, flag: str) -> float | None:
    """--since/--until: a date or time (local), or a run (its start): a run first, unless
    it is written as a date."""
    if text is None:
        return None
    readings = [_run_time, _iso_time] if not _DATE.match(text) else [_iso_time, _run_time]
    for reading in readings:
        found = reading(store, text)
        if found is not None:
            return found
    raise VmtaxError(f"{flag}: expected a date (2026-11-28), a time (2026-11-28T09:30) "
                     f"or a run, got {text!r}")


def _run_time(store: Store, text: str) -> float | None:
    try:
        return store.load_run(text).created
    except VmtaxError:
        return None


def _iso_time(store: Store, text: str) -> float | None:
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _who() -> str:
    """Who accepts: the user behind sudo, else this one."""
    return os.environ.get("SUDO_USER") or getpass.getuser()


def _accept(results: str, name: str, spec: str) -> None:
    store = Store(results)
    run = store.load_run(spec)
    if run.plan.get("name") != name:
        raise VmtaxError(f"--accept: run {run.id} is not a run of {name!r} "
                         + (f"(it is one of {run.plan['name']!r})" if run.plan.get("name")
                            else "(it has no name)"))
    host = drift.host_of(run.host)
    # What the acceptance covers: the series of its host that regressed from it or before.
    covered = [s for s, _ in load_trend(results, name).regressions()
               if s.host == host and (r := s.regressed_from) is not None
               and r.created <= run.created]
    who = _who()
    store.accept(name, host, run.id, who)
    gate = hints.command('trend', name, '--fail-on', 'regression', results=results)
    if covered:
        click.echo(f"accepted {name} on {host} as it is from run {run.id} on (by {who}): "
                   f"{len(covered)} series that regressed ({printable(covered[0].label)}"
                   + (f" and {len(covered) - 1} more" if len(covered) > 1 else "")
                   + f"); `{gate}` no longer fails on changes up to it")
    else:
        click.echo(f"accepted {name} on {host} as it is from run {run.id} on (by {who}); "
                   "nothing of it had regressed up to that run, so this only makes it the "
                   "baseline the runs after it are judged against")


def load_trend(results: str, name: str, *, since: str | None = None,
               until: str | None = None, targets: list[str] | None = None,
               metrics: list[str] | None = None,
               alpha: float = 0.05, noise_floor: float = 0.02,
               method: str = "bh") -> history.Trend:
    store = Store(results, readonly=True)
    until_time = _when(store, until, "--until")
    trend = history.load(store, name, since=_when(store, since, "--since"),
                         until=until_time, targets=targets, metrics=metrics)
    # The series as it was then: acceptances made later are not yet made.
    accepted = [a for a in store.accepted(name) if until_time is None or a["at"] <= until_time]
    return history.judge(trend, alpha=alpha, noise_floor=noise_floor,
                         method=method,  # type: ignore[arg-type]
                         accepted=accepted)


@click.command("trend")
@click.argument("name")
@click.option("--metric", "metrics", metavar="NAME,...",
              help="These metrics (e.g. 'events/s', or with dimensions 'IOPS[job=randread]') "
                   "instead of each workload's headline metric.")
@click.option("--target", "targets", metavar="NAME,...", help="Only these targets.")
@click.option("--since", metavar="DATE|RUN",
              help="Only runs from this date or time (2026-11-28, 2026-11-28T09:30, local) "
                   "or run on.")
@click.option("--until", metavar="DATE|RUN",
              help="Only runs up to this date or time, or run: the series as it was then.")
@click.option("--alpha", type=bounds.ALPHA, default=0.05, show_default=True,
              help="Significance level after the adjustment across every series shown "
                   f"(false discovery rate with bh; {bounds.ALPHA.words}).")
@click.option("--noise-floor", type=bounds.NOISE_FLOOR, default=0.02, show_default=True,
              help=f"Relative changes smaller than this are never called "
                   f"({bounds.NOISE_FLOOR.words}).")
@click.option("--method", type=click.Choice(["bh", "holm"]), default="bh", show_default=True,
              help="Adjustment across series: Benjamini-Hochberg or Holm.")
@click.option("--fail-on", type=click.Choice(["regression"]),
              help="Exit with status 1 while a series' newest run lies in a segment worse "
                   "than the one before it (or is itself worse than the runs before it), "
                   "unless accepted: for CI.")
@click.option("--accept", "accept_run", metavar="RUN",
              help="Accept the series of NAME on RUN's host as it is from RUN on: changes "
                   "up to RUN no longer fail --fail-on (who and when are recorded).")
@click.option("--html", "html_path", type=click.Path(), metavar="FILE",
              help="Also write the series as one HTML page (each run's median and interval, "
                   "change points marked, what changed beside; opens offline).")
@results_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def trend_command(name, metrics, targets, since, until, alpha, noise_floor, method, fail_on,
                  accept_run, html_path, results, as_json) -> None:
    """The runs named NAME (`vmtax run --name NAME`) as series, per host: for each target ×
    workload × headline metric the latest value, a sparkline of the runs' medians, the
    change points (effect, CI, adjusted p) and what changed between the runs on either
    side of each: plans, host and target fingerprints, vmtax's version."""
    if accept_run is not None:
        _accept(results, name, accept_run)
        return
    trend = load_trend(results, name, since=since, until=until, targets=_csv(targets, "--target"),
                       metrics=_csv(metrics, "--metric"), alpha=alpha,
                       noise_floor=noise_floor, method=method)
    if as_json:
        click.echo(json.dumps(history.to_json(trend), indent=2, default=str))
    else:
        from vmtax.report import trend as trend_report

        trend_report.print_trend(Console(highlight=False), trend)
    if html_path:
        from vmtax.host import outputs
        from vmtax.report import trend_html

        outputs.write_file(html_path,
                              trend_html.render(trend, history.levels(trend)).encode())
        click.echo(f"wrote {html_path}", err=True)
    regressions = trend.regressions()
    if fail_on and regressions:
        shown = "; ".join(f"{s.label} {why}" for s, why in regressions[:3])
        more = f" and {len(regressions) - 3} more" if len(regressions) > 3 else ""
        # One acceptance per host covers every regression of it up to the run it names.
        latest: dict[str, history.SeriesRun] = {}
        for s, _ in regressions:
            run = s.regressed_from
            if run is not None and (s.host not in latest or run.created > latest[s.host].created):
                latest[s.host] = run
        click.echo(f"vmtax: {len(regressions)} series regressed (--fail-on regression): "
                   f"{printable(shown)}{more}; if intended: "
                   + "; ".join(printable(hints.command("trend", name, "--accept", run.id,
                                                       results=results))
                               for run in latest.values()), err=True)
        sys.exit(1)


def series_name(store: Store, spec: str) -> str:
    """The name whose series spec means: a name of runs, or a run of one ('last', an id)."""
    if store.named_runs(spec):
        return spec
    try:
        run = store.load_run(spec)
    except VmtaxError:
        return spec        # history.load names the names there are
    if not run.plan.get("name"):
        raise VmtaxError(f"run {run.id} has no name, so no series: give a name of runs "
                         "(vmtax run --name NAME)")
    return str(run.plan["name"])


def export_otava(results: str, name: str) -> None:
    """`vmtax export NAME --format otava`: the series of NAME as Otava's CSV, on stdout."""
    from vmtax.report import trend as trend_report

    store = Store(results, readonly=True)
    trend = history.load(store, series_name(store, name))
    data, left_out = trend_report.to_otava(trend)
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    for note in trend.notes:   # Otava's CSV has no place for them
        click.echo(f"vmtax: note: {printable(note)}", err=True)
    if left_out:
        click.echo(f"vmtax: {len(left_out)} series not in every run of {name} left out "
                   f"(Otava takes no empty cell): {printable(', '.join(left_out[:5]))}"
                   + (" …" if len(left_out) > 5 else ""), err=True)


@click.command("publish")
@click.argument("names", metavar="NAME... DIR", nargs=-1, required=True)
@results_option
def publish_command(names, results) -> None:
    """Write a static site of the runs named NAME... into DIR: an index of series and runs,
    each name's trends, each run's report, a comparison per change point; it opens from
    file:// and fetches nothing."""
    if len(names) < 2:
        raise VmtaxError("publish takes one or more names and a directory: NAME... DIR")
    *given, directory = names
    # Each name once (a name given twice would list its series twice), each a run's name:
    # never a path of a page.
    series_names = [check_run_name(name, "publish NAME") for name in dict.fromkeys(given)]
    from vmtax.analysis.model import analyse
    from vmtax.host.site_files import SiteFiles
    from vmtax.report import publish

    store = Store(results, readonly=True)
    trends = [history.judge(history.load(store, name), accepted=store.accepted(name))
              for name in series_names]
    # The site decides its pages; each run they show is analysed here, once, rendered,
    # and written into DIR (vmtax.host.site_files: only a DIR publish owns).
    with SiteFiles(directory) as files:
        site = publish.plan(trends, files.made_from)
        for page, trend in site.trends:
            files.write(page, publish.trend_page(trend, history.levels(trend)))
        for page, before_id, after_id, changes, made_from in site.changes:
            files.write(page, publish.compare_page(analyse(store.load_run(before_id)),
                                                   analyse(store.load_run(after_id)),
                                                   changes), made_from)
        for page, run_id, figures, made_from in site.runs:
            files.write(page, publish.run_page(run_id, analyse(store.load_run(run_id)),
                                               figures, results), made_from)
        files.write("index.html", site.index.encode())
        files.finish()
    pages = len(site.trends) + len(site.changes) + len(site.runs)
    click.echo(f"wrote {files.path / 'index.html'} and {pages} more page{'s' * (pages != 1)}")
