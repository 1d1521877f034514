"""Terminal tables of stored runs (rich)."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from vmtax.core import hints
from vmtax.core.text import printable
from vmtax.report.export import flatten
from vmtax.report.parts import (Part, fingerprint_value, fixed_note, fixed_params, flag_text,
                                flags_line, fmt, index_parts, interval, interval_legend,
                                median_parts, ranged, ratio_interval, ratio_parts,
                                ratio_style, recommendation_lines, run_title, sig3,
                                target_label, workload_parameters)

if TYPE_CHECKING:   # analysis loads numpy and the plugins: `vmtax runs` needs neither
    from vmtax.analysis import composite
    from vmtax.analysis.model import RunModel
    from vmtax.analysis.summary import Cell, Row, RunSummary
    from vmtax.results.store import Run

FLAG_STYLE = "bold yellow"
# How the terminal styles each role of a rendered part (vmtax.report.parts).
STYLES = {"gain": "green", "loss": "red", "interval": "dim", "flag": FLAG_STYLE,
          "failed": "red", "index": "bold", "": ""}


def styled(parts: list[Part]) -> Text:
    """Parts as one line of rich text, each styled by its role."""
    text = Text()
    for part, role in parts:
        text.append(part, style=STYLES[role])
    return text


def shown_text(text: str) -> str:
    """Stored text (names, parameters, errors) as rich markup that prints it as it is:
    markup escaped, and control characters, which a name stored before they were refused
    may hold, escaped so they cannot drive the terminal."""
    return escape(printable(text, newlines=True))


def cell_text(cell: Cell | None, width: int | None = None) -> Text:
    """A cell of `show --all`: median, interval, cv, ratio to the baseline with its
    interval, why there is none, failures, flags. With a width (a narrow console's column),
    the median's parts share a line, and the ratio's theirs, where they fit in it; a part
    that does not fit starts a line of its own, so a column wraps only where a part begins
    (or inside an interval wider than the column, at its " – "), never inside a number."""
    text = Text()
    if cell is None:
        return text
    if cell.summary is None:
        if cell.not_recorded is not None and not cell.failed:
            return text.append(f"not recorded: {cell.not_recorded}", style="dim")
        text.append(f"failed ×{cell.failed}", style="red")
        return text
    median: list[tuple[str, str]] = [(fmt(cell.summary.median), ""),
                                     (interval(cell.summary).lstrip(), "dim")]
    if cell.summary.cv is not None:
        median.append((f"cv {cell.summary.cv:.1%}", "dim"))
    _append_packed(text, median, width, orders=((0, 1, 2), (0, 2, 1)))
    if cell.ratio is not None:
        r = cell.ratio
        text.append("\n")
        _append_packed(text, [(f"×{sig3(r.value)}", STYLES[ratio_style(r.value)]),
                              (ratio_interval(r).lstrip(), "dim")], width)
    if cell.no_ratio is not None:
        text.append(f"\n{cell.no_ratio}", style="dim")
    if cell.failed:
        text.append(f"\n{cell.failed} failed", style="red")
    for flag in cell.flags:
        text.append(f"\n⚠ {flag_text(flag, cell)}", style=FLAG_STYLE)
    return text


def _append_packed(text: Text, parts: list[tuple[str, str]], width: int | None,
                   orders: tuple[tuple[int, ...], ...] = ((0, 1),)) -> None:
    """Append parts (text, style; empty ones left out) to text, one line where width is
    None, else packed into as few lines of at most width as the first of orders that
    needs fewest gives (a part wider than width on a line of its own)."""
    def lines(order: tuple[int, ...]) -> list[list[tuple[str, str]]]:
        packed: list[list[tuple[str, str]]] = []
        for part in (parts[i] for i in order if i < len(parts) and parts[i][0]):
            line = packed[-1] if packed else None
            if line is not None and (width is None or sum(len(t) + 1 for t, _ in line)
                                     + len(part[0]) <= width):
                line.append(part)
            else:
                packed.append([part])
        return packed

    best = min((lines(order) for order in orders), key=len)
    for number, line in enumerate(best):
        for i, (part, style) in enumerate(line):
            text.append(("\n" if number and not i else " " if i else "") + part, style=style)


def print_headline(console: Console, model: RunModel,
                   results: str | os.PathLike | None = None) -> None:
    """The answer on one screen: per workload its primary metric, the baseline's median and
    each target's ratio to it with its 95% CI, then each class's composite index (E3's
    geometric mean of its workloads' ratios, with its CI) and overall; one recommendation
    line per class, each suspicious win explained, every flag in one line. `vmtax show
    --all` has every metric (its hint names results, the run's results directory)."""
    run, summary, rows = model.run, model.summary, model.headline
    others = [t for t in summary.targets if t != summary.baseline]
    # The title on a line of its own: a table's title wraps at the table's width.
    console.print(Text(run_title(run), style="bold"))
    classes = model.classes

    def table_of(shown: list[str]) -> Table:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
        # What tells rows apart (parameters, dimensions) goes with the workload; names wrap
        # at their spaces, and a ratio's interval goes under it before a name is cut.
        table.add_column("workload", overflow="fold",
                         min_width=min(14, _longest_row_word(rows)))
        table.add_column("metric", overflow="fold", min_width=8)
        # A target's detail goes under its name, so long names cannot squeeze the row
        # names out of an 80-column table.
        for name in [summary.baseline, *shown]:
            table.add_column(shown_text(target_label(run, name)).replace(" (", "\n(", 1),
                             justify="right", overflow="fold", no_wrap=True)
        for row in rows:
            tags = " ".join(f"{k}={v}" for k, v in {**row.params, **row.dimensions}.items())
            unit = "" if row.unit == row.metric else f" ({row.unit})"
            base = row.cells.get(summary.baseline)
            table.add_row(shown_text(row.workload + (f" {tags}" if tags else "")),
                          f"{'↑' if row.higher_is_better else '↓'} {shown_text(row.metric)}"
                          f"{unit}", styled(median_parts(base)),
                          *[styled(ratio_parts(row.cells.get(t))) for t in shown])
        if classes:
            table.add_section()
            for ci in classes:
                table.add_row(Text("index", style="bold"),
                              # a long name may wrap at its "/": threads / scheduling
                              Text(ci.cls.replace("/", " / ") if len(ci.cls) > 12
                                   else ci.cls, style="bold"),
                              "1", *[styled(index_parts(ci.by_target.get(t))) for t in shown])
        # Names wrap at their spaces first; when the ratios on one line leave the names too
        # little room even so, the intervals go under the ratios instead.
        if not fits(console, table):
            for column in table.columns[3:]:
                column.no_wrap = False
        return table

    for table in by_targets(console, table_of, others):
        console.print(table)
    console.print(f"[dim]{shown_text(summary.baseline)}: median of its runs; others: ratio to it "
                  + interval_legend(model.interval_kinds())
                  + ", below 1 = worse (↑ higher is better, ↓ lower)"
                  + ("; index: geometric mean of a class's workloads" if classes else "")
                  + "[/dim]")
    # The rows show the parameters a sweep varies (analysis.summary); what it keeps, once.
    fixed = fixed_params(r for r in run.reps if r.phase == "measure")
    if fixed:
        console.print(Text(printable(fixed_note(fixed)), style="dim"))
    _print_verdicts(console, classes, model.explanations if classes else [])
    for target, line in model.hypotheses.items():
        if target in others:
            console.print(Text(f"→ why {printable(target)}, its profile suggests: "
                               f"{printable(line)}"))
    line = flags_line(rows, model.load_note)
    if line:
        console.print(Text(line, style=FLAG_STYLE))
    _print_failures(console, summary)
    hidden = len(summary.rows) - len(rows)
    if hidden:
        console.print(Text(f"{hidden} more metric rows: "
                           + hints.command("show", run.id, "--all", results=results),
                           style="dim"), soft_wrap=True)   # a command pastes whole


def by_targets(console: Console, table_of: Callable[[list[str]], Table],
               targets: list[str]) -> list[Table]:
    """The targets in as few tables as show every name and number whole at the console's
    width, each table_of its share (in order); too many for one 80-column table are two,
    never a column cropped off or a number cut."""
    for size in range(len(targets), 1, -1):
        tables = [table_of(targets[i:i + size]) for i in range(0, len(targets), size)]
        if all(fits(console, table) for table in tables):
            return tables
    return [table_of([t]) for t in targets] or [table_of([])]


def fits(console: Console, table: Table) -> bool:
    """Whether the table prints at the console's width without cutting a number or a word
    (rendered once to a scratch console, every column marking a cut with "…")."""
    probe = Console(width=console.width, file=io.StringIO(), color_system=None)
    saved = [column.overflow for column in table.columns]
    for column in table.columns:
        column.overflow = "ellipsis"
    probe.print(table)
    for column, overflow in zip(table.columns, saved):
        column.overflow = overflow
    return "…" not in probe.file.getvalue()   # type: ignore[attr-defined]


def _longest_row_word(rows: list[Row]) -> int:
    """The longest word of the workload column (a name, or one of its KEY=VALUE tags)."""
    return max((len(word) for row in rows
                for word in [row.workload, *(f"{k}={v}" for k, v in
                                             {**row.params, **row.dimensions}.items())]),
               default=8)


def _print_verdicts(console: Console, classes: list[composite.ClassIndex],
                    explained: list[str]) -> None:
    """One recommendation line per class (one in all when no class has enough runs),
    then each suspicious win with its likely cause."""
    for line in recommendation_lines(classes):
        console.print(Text("→ " + printable(line), style="" if any(
            words in line for words in ("significant", "not told apart")) else "bold"))
    for line in explained:
        console.print(Text(f"⚠ suspicious win: {printable(line)}", style=FLAG_STYLE))


def _print_failures(console: Console, summary: RunSummary) -> None:
    for failure in summary.failures[:10]:
        console.print("[red]failed[/red] " + shown_text(
            f"{failure['target']} · {failure['workload']} · {failure['phase']} "
            f"{failure['idx'] + 1}: {failure['error']}"), highlight=False)
    if len(summary.failures) > 10:
        console.print(f"[red]… and {len(summary.failures) - 10} more failed repetitions[/red]")
    for note in grouped_notes(summary.notes):
        console.print("[yellow]not recorded[/yellow] " + shown_text(note), highlight=False)


def grouped_notes(notes: list[str]) -> list[str]:
    """Notes "TARGET · WORKLOAD: why" saying the same of several targets, in one naming
    them all: "a, b · cyclictest: exits: unavailable — each runs under TCG, …" (each TCG
    guest of a plan would otherwise repeat the same four lines)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for note in notes:
        target, _, rest = note.partition(" · ")
        workload, _, why = rest.partition(": ")
        if why:
            groups.setdefault((workload, why.replace(target, "\0")), []).append(target)
        else:   # not of that shape: as it is
            groups.setdefault((note, ""), [])
    return [f"{', '.join(targets)} · {workload}: "
            + why.replace("\0", "each" if len(targets) > 1 else targets[0])
            if targets else workload for (workload, why), targets in groups.items()]


# A line of a compact cell that must stay whole: a number, an interval, a cv, a ratio
# (words, such as a flag or why there is no ratio, wrap).
_UNBROKEN = re.compile(r"[-+\d(\[×∞–]|cv ")


def print_summary(console: Console, run: Run, summary: RunSummary) -> None:
    """Every metric of the run, with every flag spelt out (`vmtax show --all`)."""
    compact = is_compact(console)
    ranges = ranged(c.ratio for row in summary.rows for c in row.cells.values())
    title = escape(run_title(run))
    caption = (f"median [95% CI] or (range) when too few runs for a 95% CI, "
               "cv = coefficient of variation; "
               f"×ratio to {summary.baseline} [95% CI]"
               + (" or (range)" if ranges else "") + ": below 1 = worse, "
               "whatever the metric's direction (↑ higher is better, ↓ lower)")
    fixed = fixed_params(r for r in run.reps if r.phase == "measure")
    if fixed:
        caption += "; " + shown_text(fixed_note(fixed))
    others = [t for t in summary.targets if t != summary.baseline]
    tables = by_targets(console, lambda group: _summary_table(
        console, run, summary, [summary.baseline, *group], title, caption, compact), others)
    for table in tables[:-1]:   # the caption once, under the last table
        table.caption = None
    for table in tables:
        console.print(table)
    _print_failures(console, summary)
    # A sweep's rows and caption say its parameters already.
    parameters = {w: words for w, words in workload_parameters(run.reps).items()
                  if w not in fixed}
    if parameters:
        console.print(Text("workload parameters", style="bold"))
        for workload, words in parameters.items():
            _print_indented(console, 2, Text(printable(f"{workload}: {words}")),
                            hanging=len(workload) + 2)
    print_fingerprints(console, run, summary.targets)


def _summary_table(console: Console, run: Run, summary: RunSummary, targets: list[str],
                   title: str, caption: str, compact: bool) -> Table:
    """`show --all`'s table of these targets."""
    table = (light_table(title=title, caption=caption) if compact
             else Table(title=title, caption=caption))
    # Compact, the workload heads its rows on a line of its own (its column's width goes to
    # the numbers) and names wrap between their words: a target's column is as wide as its
    # widest packed line within its share of what the names leave; an interval wider than
    # that wraps at its " – ", never inside a number.
    names = ((max(12, longest_word(row.label for row in summary.rows),
                  longest_word(" ".join([row.workload, *(f"{k}={v}" for k, v in
                                                     row.params.items())])
                           for row in summary.rows)),) if compact else (0, 0))
    for column, width in zip(("metric",) if compact else ("workload", "metric"), names):
        table.add_column(column, max_width=width if compact else None)
    share = max(8, (console.width - sum(names) - len(targets) - len(names) + 1)
                // len(targets))
    rows = [[cell_text(row.cells.get(t), share if compact else None) for t in targets]
            for row in summary.rows]
    for number, name in enumerate(targets):
        label = shown_text(target_label(run, name)) + (" = 1" if name == summary.baseline
                                                       else "")
        if compact:
            widest = max((len(line) for cells in rows
                          for line in cells[number].plain.split("\n")
                          if _UNBROKEN.match(line)), default=1)
            table.add_column(label.replace(" (", "\n(", 1), justify="right",
                             min_width=min(share, widest))
        else:
            # fold: a narrow terminal wraps a number rather than cutting it off with "…"
            table.add_column(label, justify="right", overflow="fold")
    previous = None
    for row, cells in zip(summary.rows, rows):
        params = " ".join(f"{k}={v}" for k, v in row.params.items())
        group = (row.workload, params)
        if previous is not None and group != previous:
            table.add_section()
        shown = shown_text(row.workload + (f"\n{params}" if params else ""))
        metric = (f"{row.label}{'' if row.unit == row.metric else f' ({row.unit})'} "
                  f"{'↑' if row.higher_is_better else '↓'}")
        if not compact:
            table.add_row(shown if group != previous else "", metric, *cells)
        else:
            if group != previous:
                table.add_row(Text(shown.replace("\n", " "), style="bold"))
            table.add_row(metric, *cells)
        previous = group
    return table


def print_fingerprints(console: Console, run: Run, order: Sequence[str] = ()) -> None:
    """What each target was (its fingerprint, as `show --json` has it): KEY VALUE lines
    under its name, nested values as dotted keys, and a value of several lines (a domain's
    XML) as a block of its own under its key; all of it escaped, as stored text is."""
    names = [*(n for n in order if n in run.targets), *(n for n in run.targets
                                                         if n not in order)]
    if not names:
        return
    console.print(Text("target fingerprints", style="bold"))
    for name in names:
        record = run.targets[name]
        console.print(Text(printable(f"{name} ({record.get('kind')})"), style="bold"))
        items = [(printable(key), fingerprint_value(value)) for key, value
                 in flatten(record.get("fingerprint") or {}).items()
                 if not (key == "kind" and value == record.get("kind"))]   # in the name's line
        width = max((len(key) for key, text in items if "\n" not in text.strip()), default=0)
        for key, text in items:
            if "\n" in text.strip():
                console.print(Text("  " + key, style="dim"))
                _print_indented(console, 4, Text(printable(text.strip("\n"), newlines=True)))
            else:
                _print_indented(console, 2, Text(key.ljust(width + 2), style="dim")
                                + Text(printable(text)), hanging=width + 2)


def _print_indented(console: Console, indent: int, text: Text, hanging: int = 0) -> None:
    """text indented, its first `hanging` characters (a key) beside what follows, which
    wraps at the console's width under itself; no trailing blanks."""
    head, body = text[:hanging], text[hanging:]
    lines = body.wrap(console, max(20, console.width - indent - hanging), overflow="fold")
    for number, line in enumerate(lines or [Text()]):
        shown = Text(" " * indent) + (head if number == 0 else Text(" " * hanging)) + line
        shown.rstrip()
        console.print(shown, soft_wrap=True)


# Below this width the tables take their compact form: a lighter box, numbers never
# broken, what every cell repeats said once (the 100-column layout is kept as it is).
COMPACT_BELOW = 100


def is_compact(console: Console) -> bool:
    return console.width < COMPACT_BELOW


def light_table(**kwargs) -> Table:
    """A table with no vertical rules (a rule under the header): the columns they would
    take go to the numbers (the box's blank divider is the only space between them)."""
    return Table(box=box.SIMPLE_HEAD, padding=0, show_edge=False, **kwargs)


def longest_word(texts) -> int:
    """The longest word of these texts: the narrowest a column wrapping them between their
    words can be."""
    return max((len(word) for text in texts for word in text.split()), default=1)
