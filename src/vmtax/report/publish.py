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

from vmtax.analysis.history import SeriesLevels, Trend
from vmtax.analysis.model import RunComparison, RunModel
from vmtax.host import outputs
from vmtax.report import html as htmlreport
from vmtax.report import trend_html


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>body {{ font: 14px system-ui, "
            "sans-serif; margin: 1.5em; }} .worse {{ color: #b00; }} .better {{ color: "
            f"#070; }}</style></head><body>\n{body}\n</body></html>\n")


def _link(href: str, text: str) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>'


@dataclass
class Site:
    """The pages a publish writes, decided from the trends and what the directory holds
    already (a page written before is not written again, but for a run's page that gains
    its figures); the CLI analyses the runs each page needs and hands them to the writers
    below."""
    out: Path
    trends: list[tuple[Path, Trend]] = field(default_factory=list)
    changes: list[tuple[Path, str, str]] = field(default_factory=list)   # before, after
    runs: list[tuple[Path, str, bool]] = field(default_factory=list)     # run, figures
    index: str = ""


def plan(trends: list[Trend], directory: str) -> Site:
    out = outputs.output_dir(directory)
    for sub in ("runs", "trends", "changes"):
        (out / sub).mkdir(exist_ok=True)
    site = Site(out)
    sections = []
    for trend in trends:
        site.trends.append((out / "trends" / f"{trend.name}.html", trend))
        items = []
        for s in trend.series:
            changes = []
            for c in s.changes:
                href = f"changes/{c.before.id}--{c.after.id}.html"
                if not (out / href).exists() and (out / href) not in {
                        path for path, *_ in site.changes}:
                    site.changes.append((out / href, c.before.id, c.after.id))
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
                # A page written before without figures gets them once a change point or
                # being the newest singles its run out.
                if not (out / href).exists() or (
                        r.id in drawn and _NO_FIGURES_MARK in (out / href).read_text()):
                    site.runs.append((out / href, r.id, r.id in drawn))
                runs.append(f"<li>{_link(href, r.id)} ({html.escape(host)}, run "
                            f"{r.number})</li>")
        notes = "".join(f'<p class="note">{html.escape(note)}</p>' for note in trend.notes)
        sections.append(f"<h2>{_link(f'trends/{trend.name}.html', trend.name)}</h2>{notes}"
                        f"<h3>series</h3><ul>{''.join(items)}</ul>"
                        f"<h3>runs</h3><ul>{''.join(runs)}</ul>")
    site.index = _page("vmtax: series", "<h1>vmtax: series</h1>" + "".join(sections))
    return site


def trend_page(path: Path, trend: Trend, levels: list[SeriesLevels]) -> None:
    outputs.write_file(path, trend_html.render(trend, levels, linked=True).encode())


def run_page(path: Path, run_id: str, model: RunModel, figures: bool) -> None:
    page = htmlreport.render_html([htmlreport.build(model, charts=figures)])
    if not figures:
        page = page.replace(_MAIN, _MAIN + _NO_FIGURES.format(id=html.escape(run_id)), 1)
    outputs.write_file(path, page.encode())


# A page without figures says so at its top (report.html.j2 opens its content with _MAIN).
_MAIN = '<main class="wrap">'
_NO_FIGURES_MARK = '<p class="note" id="no-figures">'
_NO_FIGURES = ("\n" + _NO_FIGURES_MARK + "This site draws figures only for the runs on either "
               "side of a change point and the newest run. This run's: <code>vmtax report "
               "{id} --html report.html</code>.</p>")


def compare_page(path: Path, before: RunModel, after: RunModel,
                 comparison: RunComparison | None) -> None:
    outputs.write_file(path, htmlreport.render_html(
        [htmlreport.build(before), htmlreport.build(after)], comparison).encode())


def index_page(site: Site) -> Path:
    index = site.out / "index.html"
    outputs.write_file(index, site.index.encode())
    return index
