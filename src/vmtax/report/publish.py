"""`vmtax publish NAME... DIR`: a static site of series, working from file:// with nothing
fetched from elsewhere. index.html lists each name's series and runs; per name its trend
page (report.trend_html); per run its HTML report; per change point the report of the runs
on either side, the later against the earlier."""

from __future__ import annotations

import html
from pathlib import Path

from vmtax.analysis.history import Trend
from vmtax.analysis.model import analyse
from vmtax.report import export as export_mod
from vmtax.report import html as htmlreport
from vmtax.report import trend_html
from vmtax.results.store import Store


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>body {{ font: 14px system-ui, "
            "sans-serif; margin: 1.5em; }} .worse {{ color: #b00; }} .better {{ color: "
            f"#070; }}</style></head><body>\n{body}\n</body></html>\n")


def _link(href: str, text: str) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>'


def publish(store: Store, trends: list[Trend], directory: str) -> list[Path]:
    """Write the site; the files written, index first."""
    out = export_mod.output_dir(directory)
    for sub in ("runs", "trends", "changes"):
        (out / sub).mkdir(exist_ok=True)
    written: list[Path] = []
    sections = []
    for trend in trends:
        page = out / "trends" / f"{trend.name}.html"
        export_mod.write_file(page, trend_html.render(trend, linked=True).encode())
        written.append(page)
        items = []
        for s in trend.series:
            changes = []
            for c in s.changes:
                href = f"changes/{c.before.id}--{c.after.id}.html"
                if not (out / href).exists():
                    _compare_page(store, out / href, c.before.id, c.after.id)
                    written.append(out / href)
                changes.append(f'<span class="{c.verdict}">run {c.after.number} '
                               f"{c.change.change:+.1%}</span> ({_link(href, 'compare')})")
            items.append(f"<li>{html.escape(f'{s.host} · {s.label}')}: "
                         + (", ".join(changes) or "no change") + "</li>")
        runs = []
        for host, host_runs in trend.runs.items():
            for r in host_runs:
                href = f"runs/{r.id}.html"
                if not (out / href).exists():
                    run = store.load_run(r.id)
                    export_mod.write_file(out / href, htmlreport.render_html(
                        [htmlreport.build(analyse(run))]).encode())
                    written.append(out / href)
                runs.append(f"<li>{_link(href, r.id)} ({html.escape(host)}, run "
                            f"{r.number})</li>")
        sections.append(f"<h2>{_link(f'trends/{trend.name}.html', trend.name)}</h2>"
                        f"<h3>series</h3><ul>{''.join(items)}</ul>"
                        f"<h3>runs</h3><ul>{''.join(runs)}</ul>")
    index = out / "index.html"
    export_mod.write_file(index, _page("vmtax: series", "<h1>vmtax: series</h1>"
                                       + "".join(sections)).encode())
    return [index, *written]


def _compare_page(store: Store, path: Path, before: str, after: str) -> None:
    a, b = store.load_run(before), store.load_run(after)
    export_mod.write_file(path, htmlreport.render_html(
        [htmlreport.build(analyse(a)), htmlreport.build(analyse(b))],
        htmlreport.compare_runs(a, b)).encode())
