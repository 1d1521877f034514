"""`vmtax publish NAME... DIR`: a static site of series, working from file:// with nothing
fetched from elsewhere. index.html lists each name's series and runs; per name its trend
page (report.trend_html); per run its HTML report; per change point the report of the runs
on either side, the later against the earlier.

Figures are most of a report's cost (~2 s of CPU per run, against ~0.3 s for its tables):
a run's page draws them only where the site points a reader, the runs on either side of a
change point and each host's newest run. Every other run's page has the tables, headline
and findings, and says how to get its figures (`vmtax report ID --html`); 400 runs then
publish in under a minute of CPU instead of most of an hour."""

from __future__ import annotations

import html
import time
from dataclasses import dataclass, field
from pathlib import Path

from vmtax.analysis.history import NOTHING_CHANGED, FoundChange, Series, SeriesLevels, Trend
from vmtax.analysis.model import RunModel
from vmtax.core import hints
from vmtax.report import html as htmlreport
from vmtax.report import trend_html
from vmtax.report.parts import change_interval, fmt, runs_text, series_status


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>body {{ font: 14px system-ui, "
            "sans-serif; margin: 1.5em; }} .worse {{ color: #b00; }} .better {{ color: "
            "#070; }} .note {{ color: #a60; }} table {{ border-collapse: collapse; "
            "margin-bottom: 1em; }} th, td {{ text-align: left; padding: 2px 10px 2px 0; "
            "vertical-align: top; }} th {{ border-bottom: 1px solid #ccc; }} small {{ "
            f"color: #666; }}</style></head><body>\n{body}\n</body></html>\n")


def _link(href: str, text: str) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>'


def _table(head: list[str], rows: list[list[str]]) -> str:
    """Cells already HTML."""
    return ("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
            + "</table>")


def _day(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


def change_text(c: FoundChange) -> str:
    """A change as the index and the trend page say it: its run, verdict and effect, and
    whether it was accepted."""
    accepted = (f", accepted by {c.accepted['who']} on {_day(c.accepted['at'])}"
                if c.accepted else (", not accepted" if c.verdict == "worse" else ""))
    return f"run {c.after.number} {c.verdict} {c.change.change:+.1%}{accepted}"


@dataclass
class Site:
    """The pages a publish writes, decided from the trends and what the directory holds
    already (a page written before is not written again, but for a run's page that gains
    its figures); the CLI analyses the runs each page needs, has the functions below render
    them and writes them (a renderer writes no file: vmtax.host.outputs does)."""
    out: Path
    trends: list[tuple[Path, Trend]] = field(default_factory=list)
    # Per change point's pair of runs: its page, the runs, and each series changing there.
    changes: list[tuple[Path, str, str, list[tuple[Series, FoundChange]]]] = field(
        default_factory=list)
    runs: list[tuple[Path, str, bool]] = field(default_factory=list)     # run, figures
    index: str = ""


SUBDIRECTORIES = ("runs", "trends", "changes")


def plan(trends: list[Trend], out: Path) -> Site:
    """The site in out, a directory holding SUBDIRECTORIES."""
    site = Site(out)
    pages: dict[Path, list[tuple[Series, FoundChange]]] = {}
    sections = []
    for trend in trends:
        site.trends.append((out / "trends" / f"{trend.name}.html", trend))
        rows = []
        for s in trend.series:
            changes = []
            for c in s.changes:
                href = f"changes/{c.before.id}--{c.after.id}.html"
                if not (out / href).exists() and (out / href) not in pages:
                    pages[out / href] = []
                    site.changes.append((out / href, c.before.id, c.after.id, pages[out / href]))
                if out / href in pages:
                    pages[out / href].append((s, c))
                changes.append(f'<span class="{c.verdict}">{html.escape(change_text(c))}</span>'
                               f" ({_link(href, 'the segments compared')})")
            regression = s.regression()
            rows.append([html.escape(s.host), html.escape(s.target),
                         html.escape(" ".join(filter(None, (s.workload, *(
                             f"{k}={v}" for k, v in (s.config or {}).items()))))),
                         html.escape(s.label.rpartition(" · ")[2]),
                         f"{fmt(s.points[-1].median)} {html.escape(s.unit)} "
                         f"<small>(run {s.points[-1].run.number})</small>",
                         "<br>".join(changes) or html.escape(series_status(s)),
                         f'<span class="worse">regressed: {html.escape(regression)}</span>'
                         if regression else ""])
        drawn = ({r.id for c in (c for s in trend.series for c in s.changes)
                  for r in (c.before, c.after)}
                 | {host_runs[-1].id for host_runs in trend.runs.values() if host_runs})
        runs = []
        for host, host_runs in trend.runs.items():
            for r in host_runs:
                href = f"runs/{r.id}.html"
                # A page written before without figures gets them once a change point or
                # being the newest singles its run out.
                if not (out / href).exists() or (
                        r.id in drawn and _NO_FIGURES_MARK in (out / href).read_text()):
                    site.runs.append((out / href, r.id, r.id in drawn))
                runs.append([str(r.number), _link(href, r.id), html.escape(_day(r.created)),
                             html.escape(r.status), html.escape(host)])
        notes = "".join(f'<p class="note">{html.escape(note)}</p>' for note in trend.notes)
        sections.append(
            f"<h2>{_link(f'trends/{trend.name}.html', trend.name)}</h2>{notes}"
            "<h3>series</h3>" + _table(["host", "target", "workload", "metric", "latest",
                                        "change points", "gate"], rows)
            + "<h3>runs</h3>" + _table(["run", "id", "started", "status", "host"], runs))
    site.index = _page("vmtax: series", "<h1>vmtax: series</h1>" + "".join(sections))
    return site


def trend_page(trend: Trend, levels: list[SeriesLevels]) -> bytes:
    return trend_html.render(trend, levels, linked=True).encode()


def run_page(run_id: str, model: RunModel, figures: bool, results: str | None = None) -> bytes:
    page = htmlreport.render_html([htmlreport.build(model, charts=figures)])
    if not figures:
        command = hints.command("report", run_id, "--html", "report.html", results=results)
        page = page.replace(_MAIN, _MAIN + _NO_FIGURES.format(command=html.escape(command)), 1)
    return page.encode()


# A page without figures says so at its top (report.html.j2 opens its content with _MAIN).
_MAIN = '<main class="wrap">'
_NO_FIGURES_MARK = '<p class="note" id="no-figures">'
_NO_FIGURES = ("\n" + _NO_FIGURES_MARK + "This site draws figures only for the runs on either "
               "side of a change point and the newest run. This run's: <code>{command}</code>"
               ".</p>")


def compare_page(before: RunModel, after: RunModel,
                 changes: list[tuple[Series, FoundChange]]) -> bytes:
    """A change point's page: the segments on either side of it compared, as the trend
    compares them (a run against the run before alone is no such comparison: that run may
    be the segment's highest), what changed between the runs, then both runs' reports."""
    page = htmlreport.render_html([htmlreport.build(before), htmlreport.build(after)])
    return page.replace(_MAIN, _MAIN + _segments(changes), 1).encode()


def _segments(changes: list[tuple[Series, FoundChange]]) -> str:
    rows = []
    for s, c in changes:
        before, after = s.sides(c)
        ch = c.change
        p = ch.p_adjusted if ch.p_adjusted is not None else ch.p_value
        rows.append([html.escape(s.label), f"{html.escape(runs_text(before))}: {fmt(ch.before)}",
                     f"{html.escape(runs_text(after))}: {fmt(ch.after)}",
                     f'<span class="{c.verdict}">{c.verdict} {ch.change:+.1%}</span>'
                     f"{html.escape(change_interval('ci', ch.ci[0] - 1, ch.ci[1] - 1))}",
                     f"{p:.2g}", "accepted by " + html.escape(c.accepted["who"])
                     if c.accepted else ""])
    first = changes[0][1]
    lines = list(dict.fromkeys(line for _, c in changes for line in c.what_changed)) or [
        NOTHING_CHANGED]
    return ('\n<section class="run" id="segments"><h2>The segments on either side of run '
            f"{first.after.number}</h2><p class=\"note\">Each series' median of its runs' "
            "medians before the change point against after it, with the effect's 95% "
            "bootstrap interval and the p-value adjusted across the trend, as <code>vmtax "
            "trend</code> compares them.</p>"
            + _table(["series", "before", "after", "change", "p (adjusted)", ""], rows)
            + f"<h3>What changed since run {first.before.number}</h3><ul>"
            + "".join(f"<li>{html.escape(line)}</li>" for line in lines) + "</ul></section>")
