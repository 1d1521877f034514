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
from typing import Any, Callable

from vmtax.analysis.history import NOTHING_CHANGED, FoundChange, Series, SeriesLevels, Trend
from vmtax.analysis.model import RunModel
from vmtax.core import hints
from vmtax.report import html as htmlreport
from vmtax.report import trend_html
from vmtax.report.parts import change_interval, fmt, runs_text, series_status


# The index's stylesheet (a plain string: its braces are CSS's).
_STYLE = ("body { font: 14px system-ui, sans-serif; margin: 1.5em; } .worse { color: #b00; } "
          ".better { color: #070; } .note { color: #a60; } table { border-collapse: collapse; "
          "margin-bottom: 1em; } th, td { text-align: left; padding: 2px 10px 2px 0; "
          "vertical-align: top; } th { border-bottom: 1px solid #ccc; } small { color: #666; }")


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>\n"
            f"{body}\n</body></html>\n")


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
    """The pages a publish writes, named relative to DIR, decided from the trends and what
    DIR holds already (what each page there was made from, vmtax.host.site_files: a page
    is written again when that changed, or when a run's page gains its figures); the CLI
    analyses the runs each page needs, has the functions below render them and writes
    them, with what each is made from."""
    trends: list[tuple[str, Trend]] = field(default_factory=list)
    # Per change point's pair of runs: its page, the runs, each series changing there, and
    # what the page is made from.
    changes: list[tuple[str, str, str, list[tuple[Series, FoundChange]], Any]] = field(
        default_factory=list)
    runs: list[tuple[str, str, bool, Any]] = field(default_factory=list)  # run, figures, from
    index: str = ""


def _made_from(trend: Trend) -> dict[str, list[Any]]:
    """Per run, what its pages show of it: its status and how many values its series hold
    (an interrupted run resumed and finished has more)."""
    values: dict[str, int] = {}
    for s in trend.series:
        for p in s.points:
            values[p.run.id] = values.get(p.run.id, 0) + len(p.values)
    return {r.id: [r.status, values.get(r.id, 0)]
            for host_runs in trend.runs.values() for r in host_runs}


def plan(trends: list[Trend], made_from: Callable[[str], Any]) -> Site:
    """The site, given what each page DIR holds was made from (None: no such page)."""
    site = Site()
    pages: dict[str, list[tuple[Series, FoundChange]]] = {}
    sections = []
    for trend in trends:
        made = _made_from(trend)
        site.trends.append((f"trends/{trend.name}.html", trend))
        rows = []
        for s in trend.series:
            changes = []
            for c in s.changes:
                href = f"changes/{c.before.id}--{c.after.id}.html"
                state = [made[c.before.id], made[c.after.id]]
                if made_from(href) != state and href not in pages:
                    pages[href] = []
                    site.changes.append((href, c.before.id, c.after.id, pages[href], state))
                if href in pages:
                    pages[href].append((s, c))
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
                # A page is written again once its run changed, or a change point or being
                # the newest singles its run out for figures it lacks.
                before = made_from(href)
                if not isinstance(before, dict) or before.get("run") != made[r.id] or (
                        r.id in drawn and not before.get("figures")):
                    site.runs.append((href, r.id, r.id in drawn,
                                      {"run": made[r.id], "figures": r.id in drawn}))
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
_NO_FIGURES = ('\n<p class="note" id="no-figures">This site draws figures only for the runs on '
               "either side of a change point and the newest run. This run's: "
               "<code>{command}</code>.</p>")


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
