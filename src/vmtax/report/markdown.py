"""`vmtax export RUN --format markdown`: a run's answer as a Markdown table, for a pull
request or a CI step summary ($GITHUB_STEP_SUMMARY), as hyperfine's --export-markdown.

It is the terminal's headline (vmtax.report.terminal.print_headline) with the same numbers
in the same words, both from vmtax.report.parts: per workload its primary metric, the
baseline's median and each other target's ratio to it with its interval, each class's
index; then the legend, the recommendations, each suspicious win and the flags. A fleet
run set gets a section per host.
"""

from __future__ import annotations

import re

from vmtax.analysis.model import RunModel
from vmtax.core.text import printable
from vmtax.report import parts

# What Markdown (GitHub's included) would read as markup, a cell's end or HTML; a bracket
# only where it would close a link's text (intervals keep their plain brackets).
SPECIAL = re.compile(r"([\\`*_<>|~]|\](?=\())")


def _md(text: str) -> str:
    """Stored text as Markdown that shows it as it is, on one line of one table cell."""
    return SPECIAL.sub(r"\\\1", printable(text))


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _run(model: RunModel, heading: str) -> list[str]:
    run, summary = model.run, model.summary
    others = [t for t in summary.targets if t != summary.baseline]
    names = [summary.baseline, *others]
    lines = [f"{heading} {_md(parts.run_title(run))}", "",
             _row(["workload", "metric", *(_md(parts.target_label(run, t)) for t in names)]),
             _row([":--", ":--", *("--:" for _ in names)])]
    for row in model.headline:
        tags = " ".join(f"{k}={v}" for k, v in {**row.params, **row.dimensions}.items())
        unit = "" if row.unit == row.metric else f" ({row.unit})"
        lines.append(_row([_md(f"{row.workload} {tags}".strip()),
                           f"{'↑' if row.higher_is_better else '↓'} {_md(row.metric + unit)}",
                           _md(parts.plain(parts.median_parts(row.cells.get(summary.baseline)))),
                           *(_md(parts.plain(parts.ratio_parts(row.cells.get(t))))
                             for t in others)]))
    for ci in model.classes:
        lines.append(_row(["**index**", f"**{_md(ci.cls)}**", "1", *(
            _md(parts.plain(parts.index_parts(ci.by_target.get(t)))) for t in others)]))
    lines += ["", f"{_md(summary.baseline)}: median of its runs; others: ratio to it "
              + _md(parts.interval_legend(model.interval_kinds()))
              + ", below 1 = worse (↑ higher is better, ↓ lower)"
              + ("; index: geometric mean of a class's workloads" if model.classes else ""), ""]
    said = [f"→ {line}" for line in parts.recommendation_lines(model.classes)]
    said += [f"⚠ suspicious win: {line}" for line in (model.explanations if model.classes else [])]
    said += [line for line in [parts.flags_line(model.headline, model.load_note)] if line]
    if summary.failures:
        said.append(f"{len(summary.failures)} failed repetitions")
    return lines + [f"- {_md(line)}" for line in said] + ([""] if said else [])


def render(model: RunModel) -> bytes:
    """The run (analysis.model.analyse) as Markdown."""
    return "\n".join(_run(model, "###")).encode()


def render_fleet(run_id: str, per_host: dict[str, RunModel]) -> bytes:
    """Each host's run of a fleet run set as Markdown."""
    lines = [f"## {_md(f'fleet run {run_id}')}", ""]
    for host, host_model in per_host.items():
        lines += _run(host_model, f"### {_md(host)}:")
    return "\n".join(lines).encode()
