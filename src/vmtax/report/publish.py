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
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

from vmtax.analysis.history import SeriesLevels, Trend
from vmtax.analysis.model import RunComparison, RunModel
from vmtax.report import html as htmlreport
from vmtax.report import trend_html
from vmtax.report.site_files import SiteFiles


# The index's stylesheet (a plain string: its braces are CSS's).
_STYLE = ("body { font: 14px system-ui, sans-serif; margin: 1.5em; } .worse { color: #b00; } "
          ".better { color: #070; }")


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>\n"
            f"{body}\n</body></html>\n")


def _link(href: str, text: str) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>'


@dataclass
class Site:
    """The pages a publish writes, decided from the trends and what the directory holds
    already (vmtax.report.site_files: a page is written again when what it was made from
    changed, or when a run's page gains its figures); the CLI analyses the runs each page
    needs and hands them to the writers below. Pages are named relative to the site."""
    files: SiteFiles
    trends: list[tuple[str, Trend]] = field(default_factory=list)
    changes: list[tuple[str, str, str, Any]] = field(default_factory=list)   # before, after
    runs: list[tuple[str, str, bool, Any]] = field(default_factory=list)     # run, figures
    index: str = ""

    @property
    def out(self) -> Path:
        return self.files.path


def _made_from(trend: Trend) -> dict[str, list[Any]]:
    """Per run, what its pages show of it: its status and how many values its series hold
    (an interrupted run resumed and finished has more)."""
    values: dict[str, int] = {}
    for s in trend.series:
        for p in s.points:
            values[p.run.id] = values.get(p.run.id, 0) + len(p.values)
    return {r.id: [r.status, values.get(r.id, 0)]
            for host_runs in trend.runs.values() for r in host_runs}


def plan(trends: list[Trend], directory: str) -> Site:
    site = Site(SiteFiles(directory))
    files = site.files
    sections = []
    for trend in trends:
        made = _made_from(trend)
        site.trends.append((f"trends/{trend.name}.html", trend))
        items = []
        for s in trend.series:
            changes = []
            for c in s.changes:
                href = f"changes/{c.before.id}--{c.after.id}.html"
                state = [made[c.before.id], made[c.after.id]]
                if files.made_from(href) != state and href not in {
                        page for page, *_ in site.changes}:
                    site.changes.append((href, c.before.id, c.after.id, state))
                changes.append(f'<span class="{c.verdict}">run {c.after.number} '
                               f"{c.change.change:+.1%}</span> ({_link(href, 'compare')})")
            items.append(f"<li>{html.escape(f'{s.host} · {s.label}')}: "
                         + (", ".join(changes) or "no change") + "</li>")
        drawn = ({r.id for c in (c for s in trend.series for c in s.changes)
                  for r in (c.before, c.after)}
                 | {host_runs[-1].id for host_runs in trend.runs.values() if host_runs})
        runs = []
        for host, host_runs in trend.runs.items():
            for r in host_runs:
                href = f"runs/{r.id}.html"
                # A page is written again once its run changed, or a change point or being
                # the newest singles its run out for figures it lacks.
                before = files.made_from(href)
                if not isinstance(before, dict) or before.get("run") != made[r.id] or (
                        r.id in drawn and not before.get("figures")):
                    site.runs.append((href, r.id, r.id in drawn,
                                      {"run": made[r.id], "figures": r.id in drawn}))
                runs.append(f"<li>{_link(href, r.id)} ({html.escape(host)}, run "
                            f"{r.number}{', interrupted' if r.status == 'interrupted' else ''}"
                            ")</li>")
        notes = "".join(f'<p class="note">{html.escape(note)}</p>' for note in trend.notes)
        sections.append(f"<h2>{_link(f'trends/{trend.name}.html', trend.name)}</h2>{notes}"
                        f"<h3>series</h3><ul>{''.join(items)}</ul>"
                        f"<h3>runs</h3><ul>{''.join(runs)}</ul>")
    site.index = _page("vmtax: series", "<h1>vmtax: series</h1>" + "".join(sections))
    return site


def trend_page(site: Site, page: str, trend: Trend, levels: list[SeriesLevels]) -> None:
    site.files.write(page, trend_html.render(trend, levels, linked=True).encode())


def run_page(site: Site, page: str, run_id: str, model: RunModel, figures: bool,
             made_from: Any) -> None:
    text = htmlreport.render_html([htmlreport.build(model, charts=figures)])
    if not figures:
        text = text.replace(_MAIN, _MAIN + _NO_FIGURES.format(id=html.escape(run_id)), 1)
    site.files.write(page, text.encode(), made_from)


# A page without figures says so at its top (report.html.j2 opens its content with _MAIN).
_MAIN = '<main class="wrap">'
_NO_FIGURES_MARK = '<p class="note" id="no-figures">'
_NO_FIGURES = ("\n" + _NO_FIGURES_MARK + "This site draws figures only for the runs on either "
               "side of a change point and the newest run. This run's: <code>vmtax report "
               "{id} --html report.html</code>.</p>")


def compare_page(site: Site, page: str, before: RunModel, after: RunModel,
                 comparison: RunComparison | None, made_from: Any) -> None:
    site.files.write(page, htmlreport.render_html(
        [htmlreport.build(before), htmlreport.build(after)], comparison).encode(), made_from)


def index_page(site: Site) -> Path:
    """The index, written last, and the manifest as the pages now are."""
    site.files.write("index.html", site.index.encode())
    site.files.finish()
    return site.out / "index.html"
