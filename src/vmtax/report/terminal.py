"""Terminal tables of stored runs (rich)."""

from __future__ import annotations

import io
import math
import os
import re
import time
from collections.abc import Sequence, Set as AbstractSet
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console, ConsoleOptions, JustifyMethod, RenderResult
from rich.markup import escape
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from vmtax.core import hints
from vmtax.core.text import bracket, printable
from vmtax.report.export import flatten

if TYPE_CHECKING:   # analysis loads numpy and the plugins: `vmtax runs` needs neither
    from vmtax.analysis import composite
    from vmtax.analysis.model import RunModel
    from vmtax.analysis.summary import Cell, Row, RunSummary
    from vmtax.results.store import Run

FLAG_STYLE = "bold yellow"


def shown_text(text: str) -> str:
    """Stored text (names, parameters, errors) as rich markup that prints it as it is:
    markup escaped, and control characters, which a name stored before they were refused
    may hold, escaped so they cannot drive the terminal."""
    return escape(printable(text, newlines=True))


def fmt(value: float | None) -> str:
    """Four significant digits, without exponent noise for everyday magnitudes."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if math.isinf(value):
        return "∞"
    if value == 0:
        return "0"
    if abs(value) >= 1e7:
        return f"{value:.3e}"
    digits = max(0, 3 - int(math.floor(math.log10(abs(value)))))
    text = f"{value:,.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def sig3(value: float) -> str:
    """Three significant digits, trailing zeros kept (a ratio: 0.970, 1.00, 12.3)."""
    if not math.isfinite(value) or value == 0 or not 1e-3 <= abs(value) < 1e3:
        return fmt(value)
    return f"{value:#.3g}".rstrip(".")


def _sig2(value: float) -> str:
    if not math.isfinite(value) or value == 0 or not 1e-3 <= abs(value) < 1e3:
        return fmt(value)
    return f"{value:.2g}" if abs(value) < 1 else f"{value:#.2g}".rstrip(".")


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").replace("∞", "inf"))
    except ValueError:
        return None


def ratio_texts(value: float, low: float, high: float) -> tuple[str, str, str]:
    """A ratio to three significant digits and its interval's bounds to two (the width is
    what they tell); a bound gets the ratio's three digits where two would leave the
    printed ratio outside the printed interval (1.0057 [0.904, 1.027] is 1.01 [0.9–1.03],
    never [0.9–1.0]). Rounding to one precision keeps the order, so three suffice."""
    shown, low_text, high_text = sig3(value), _sig2(low), _sig2(high)
    number = _number(shown)
    if number is not None:
        if (bound := _number(low_text)) is not None and bound > number:
            low_text = sig3(low)
        if (bound := _number(high_text)) is not None and bound < number:
            high_text = sig3(high)
    return shown, low_text, high_text


def target_label(run: Run, name: str) -> str:
    fp = run.targets.get(name, {}).get("fingerprint", {})
    # An ssh target: what the plan calls the machine, beside the hypervisor found there.
    detail = fp.get("accel") or fp.get("runtime") or ", ".join(dict.fromkeys(
        v for v in (fp.get("label"), fp.get("hypervisor")) if v and v not in name))
    # vmtax lab: never hardware's KVM (a vm's accel, a libvirt domain's type)
    if run.host.get("lab") and "kvm" in (detail, fp.get("domain_type")):
        detail = "nested KVM"
    return f"{name} ({detail})" if detail and detail not in name else name


def interval(s) -> str:
    """A median's interval (a 95% CI, or the runs' range) as bracket() shows it."""
    return bracket(s.interval, fmt(s.ci_low), fmt(s.ci_high))


def interval_legend(kinds: AbstractSet[str]) -> str:
    """What the intervals shown are: "[95% CI]", a range, none (one run) or a mix."""
    parts = (["[95% CI]"] * ("ci" in kinds) + [RANGE_NOTE] * ("range" in kinds)
             + ["(no interval: one run a side)"] * (kinds == {"none"}))
    return " or ".join(parts or ["[95% CI]"])


def ranged(items) -> bool:
    """Whether any of these ratios, indices or comparisons shows a range, not a CI."""
    return any(i.interval == "range" for i in items if i is not None)


RANGE_NOTE = "(a range: the runs' extremes, too few runs for a 95% CI)"


def duration(seconds: float) -> str:
    """A repetition's length: 47.2 ms, 2.01 s."""
    return f"{seconds * 1000:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def flag_text(flag: str, cell: Cell) -> str:
    """A flag as a table shows it, with the figure that raised it where one helps."""
    from vmtax.analysis import composite
    from vmtax.analysis.summary import TOO_SHORT

    if flag == TOO_SHORT and cell.duration is not None:
        return f"{flag} ({duration(cell.duration)})"
    if flag == composite.FASTER and cell.ratio is not None and cell.ratio.interval != "ci":
        return f"{flag} (too few runs to test it: n={cell.n})"
    return flag


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
        style = "green" if r.value >= 1 else ("red" if r.value < 0.9 else "")
        text.append("\n")
        _append_packed(text, [(f"×{fmt(r.value)}", style), (bracket(
            r.interval, fmt(r.ci_low), fmt(r.ci_high)).lstrip(), "dim")], width)
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


def fixed_params(rows) -> dict[str, dict]:
    """Per workload run at several parameter sets (a sweep), the parameters every set has
    the same: a table shows what varies and says these once (fixed_note). rows: anything
    with .workload and .params (repetitions, comparison rows)."""
    sets: dict[str, list[dict]] = {}
    for row in rows:
        if row.params not in sets.setdefault(row.workload, []):
            sets[row.workload].append(row.params)
    fixed = {}
    for workload, params in sets.items():
        same = {k: v for k, v in params[0].items() if all(p.get(k, v) == v and k in p
                                                            for p in params[1:])}
        if len(params) > 1 and same:
            fixed[workload] = same
    return fixed


def varying(params: dict, workload: str, fixed: dict[str, dict]) -> dict:
    """A row's parameters less those its workload's every row has the same."""
    return {k: v for k, v in params.items() if k not in fixed.get(workload, {})}


def fixed_note(fixed: dict[str, dict]) -> str:
    """What a sweep keeps the same, once: "memory: memory-oper=write throughout"."""
    return "; ".join(f"{workload}: " + " ".join(f"{k}={v}" for k, v in params.items())
                     + " throughout" for workload, params in fixed.items())


def _title(run: Run) -> str:
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.created))
    name = run.plan.get("name")
    lab = f"  ·  {run.host['lab']}" if run.host.get("lab") else ""
    return printable(f"run {run.id}{f' ({name})' if name else ''}  ·  {started}  ·  {run.status}"
                     + lab)


def _ratio_text(cell: Cell | None) -> Text:
    """A target's ratio to the baseline with its 95% CI (none from a single sample), or
    why there is none; ⚠ when a flag is raised on it."""
    text = Text()
    if cell is None:
        return text
    if cell.summary is None:
        return text.append(f"failed ×{cell.failed}", style="red")
    if cell.ratio is not None:
        r = cell.ratio
        shown, low, high = ratio_texts(r.value, r.ci_low, r.ci_high)
        text.append(shown, style="green" if r.value >= 1 else ("red" if r.value < 0.9 else ""))
        text.append(bracket(r.interval, low, high, "–"), style="dim")
    elif cell.no_ratio is not None:
        text.append(cell.no_ratio, style="dim")
    if cell.flags:   # unspaced: a narrow column never wraps it onto a line of its own
        text.append("⚠", style=FLAG_STYLE)
    return text


def flag_counts(rows: list[Row]) -> dict[str, int]:
    """How many cells of these rows raise each kind of flag, most frequent first (a flag
    "KIND: detail" counts as its kind)."""
    counts: dict[str, int] = {}
    for row in rows:
        for cell in row.cells.values():
            for flag in {f.partition(": ")[0] for f in cell.flags}:
                counts[flag] = counts.get(flag, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def flags_line(rows: list[Row], context: str = "") -> str:
    """The flags of the headline's rows, the primary metrics (RunModel.headline: every view
    counts these, so a report and the terminal give one count) in one line: "primary
    metrics: 3 cells noisy (CV > 5%), 1 clock skew"."""
    from vmtax.analysis import summary as analysis

    counts = flag_counts(rows)
    if not counts:
        return ""
    why = {"noisy": f"CV > {analysis.NOISY_CV:.0%}",
           analysis.TOO_SHORT: f"repetitions under {analysis.MIN_DURATION:g} s",
           "faster than baseline": "suspicious", "clock skew": "guest clock disagreed"}
    parts = [f"{n} cell{'s' * (n != 1)} {flag}" + (f" ({why[flag]})" if flag in why
                                                    else "")
             for flag, n in counts.items()]
    return "⚠ primary metrics: " + ", ".join(parts) + (f": {context}" if context else "")


def print_headline(console: Console, model: RunModel, context: str = "",
                   results: str | os.PathLike | None = None) -> None:
    """The answer on one screen: per workload its primary metric, the baseline's median and
    each target's ratio to it with its 95% CI, then each class's composite index (E3's
    geometric mean of its workloads' ratios, with its CI) and overall; one recommendation
    line per class, each suspicious win explained, every flag in one line. `vmtax show
    --all` has every metric (its hint names results, the run's results directory)."""
    run, summary, rows = model.run, model.summary, model.headline
    others = [t for t in summary.targets if t != summary.baseline]
    # The title on a line of its own: a table's title wraps at the table's width.
    console.print(Text(_title(run), style="bold"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    # What tells rows apart (parameters, dimensions) goes with the workload; names wrap at
    # their spaces, and a ratio's interval goes under it before a name is cut in pieces.
    table.add_column("workload", overflow="fold", min_width=min(14, _longest_word(rows)))
    table.add_column("metric", overflow="fold", min_width=8)
    # A target's detail goes under its name, so long names cannot squeeze the row names
    # out of an 80-column table.
    for name in [summary.baseline, *others]:
        table.add_column(shown_text(target_label(run, name)).replace(" (", "\n(", 1),
                         justify="right", overflow="fold", no_wrap=True)
    for row in rows:
        tags = " ".join(f"{k}={v}" for k, v in {**row.params, **row.dimensions}.items())
        unit = "" if row.unit == row.metric else f" ({row.unit})"
        base = row.cells.get(summary.baseline)
        table.add_row(shown_text(row.workload + (f" {tags}" if tags else "")),
                      f"{'↑' if row.higher_is_better else '↓'} {shown_text(row.metric)}{unit}",
                      cell_median(base), *[_ratio_text(row.cells.get(t)) for t in others])
    classes = model.classes
    if classes:
        table.add_section()
        for ci in classes:
            table.add_row(Text("index", style="bold"),
                          # a long name may wrap at its "/": threads / scheduling
                          Text(ci.cls.replace("/", " / ") if len(ci.cls) > 12 else ci.cls,
                               style="bold"),
                          "1", *[_index_text(ci.by_target.get(t)) for t in others])
    # Names wrap at their spaces first; when the ratios on one line leave the names too
    # little room even so, the intervals go under the ratios instead.
    if not _fits(console, table):
        for column in table.columns[3:]:
            column.no_wrap = False
    console.print(table)
    kinds = {c.ratio.interval for row in rows for t in others
             if (c := row.cells.get(t)) is not None and c.ratio is not None}
    kinds |= {i.interval for ci in classes for t, i in ci.by_target.items() if t in others}
    console.print(f"[dim]{shown_text(summary.baseline)}: median of its runs; others: ratio to it "
                  + interval_legend(kinds)
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
    line = flags_line(rows, context)
    if line:
        console.print(Text(line, style=FLAG_STYLE))
    _print_failures(console, summary)
    hidden = len(summary.rows) - len(rows)
    if hidden:
        console.print(Text(f"{hidden} more metric rows: "
                           + hints.command("show", run.id, "--all", results=results),
                           style="dim"), soft_wrap=True)   # a command pastes whole


def _fits(console: Console, table: Table) -> bool:
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


def _longest_word(rows: list[Row]) -> int:
    """The longest word of the workload column (a name, or one of its KEY=VALUE tags)."""
    return max((len(word) for row in rows
                for word in [row.workload, *(f"{k}={v}" for k, v in
                                             {**row.params, **row.dimensions}.items())]),
               default=8)


def _index_text(index: composite.Index | None) -> Text:
    if index is None:
        return Text()
    shown, low, high = ratio_texts(index.value, index.ci_low, index.ci_high)
    return Text(shown, style="bold").append(bracket(index.interval, low, high, "–"),
                                            style="dim")


def _print_verdicts(console: Console, classes: list[composite.ClassIndex],
                    explained: list[str]) -> None:
    """One recommendation line per class (one in all when no class has enough runs),
    then each suspicious win with its likely cause."""
    from vmtax.analysis import composite

    lines = [ci.recommendation for ci in classes]
    few = [line for line in lines if "too few runs" in line]
    if few and len(few) == len(lines):
        lines = [f"no recommendation: too few runs for a verdict (at least "
                 f"{composite.MIN_RUNS} per target)"]
    for line in lines:
        console.print(Text("→ " + printable(line),
                           style="bold" if "significant" not in line else ""))
    for line in explained:
        console.print(Text(f"⚠ suspicious win: {printable(line)}", style=FLAG_STYLE))


def cell_median(cell: Cell | None) -> Text:
    if cell is None:
        return Text()
    if cell.summary is None:
        return Text(f"failed ×{cell.failed}", style="red")
    text = Text(fmt(cell.summary.median))
    return text.append("⚠", style=FLAG_STYLE) if cell.flags else text


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
    compact = _compact(console)
    ranges = ranged(c.ratio for row in summary.rows for c in row.cells.values())
    title = escape(_title(run))
    caption = (f"median [95% CI] or (range) when too few runs for a 95% CI, "
               "cv = coefficient of variation; "
               f"×ratio to {summary.baseline} [95% CI]"
               + (" or (range)" if ranges else "") + ": below 1 = worse, "
               "whatever the metric's direction (↑ higher is better, ↓ lower)")
    fixed = fixed_params(r for r in run.reps if r.phase == "measure")
    if fixed:
        caption += "; " + shown_text(fixed_note(fixed))
    table = (_light_table(title=title, caption=caption) if compact
             else Table(title=title, caption=caption))
    # Compact, the workload heads its rows on a line of its own (its column's width goes to
    # the numbers) and names wrap between their words: a target's column is as wide as its
    # widest packed line within its share of what the names leave; an interval wider than
    # that wraps at its " – ", never inside a number.
    names = ((max(12, _longest(row.label for row in summary.rows),
                  _longest(" ".join([row.workload, *(f"{k}={v}" for k, v in
                                                     row.params.items())])
                           for row in summary.rows)),) if compact else (0, 0))
    for column, width in zip(("metric",) if compact else ("workload", "metric"), names):
        table.add_column(column, max_width=width if compact else None)
    share = max(8, (console.width - sum(names) - len(summary.targets) - len(names) + 1)
                // len(summary.targets))
    rows = [[cell_text(row.cells.get(t), share if compact else None) for t in summary.targets]
            for row in summary.rows]
    for number, name in enumerate(summary.targets):
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
    console.print(table)
    _print_failures(console, summary)
    print_fingerprints(console, run, summary.targets)


def fingerprint_value(value: object) -> str:
    """A fingerprint's value as text, never Python's own spelling: lists joined (records
    by "; "), a record as KEY=VALUE words, none (or an empty list) as "–", booleans as
    yes/no, floats to four significant digits (a measured 0.03536973999987007 s is
    0.03537)."""
    if value is None or value == []:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return fmt(value)
    if isinstance(value, list):
        return ("; " if any(isinstance(v, dict) for v in value) else ", ").join(
            fingerprint_value(v) for v in value)
    if isinstance(value, dict):
        return " ".join(f"{k}={fingerprint_value(v)}" for k, v in value.items())
    return str(value)


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


def print_runs(console: Console, runs: list[dict], source: str) -> None:
    """One row per stored run, every value whole at 80 columns: lists wrap between their
    items, and the start time, which the id spells already (YYYYMMDD-HHMMSS-…), is left
    out when the table would not fit with it."""
    console.print(Text(f"stored runs in {source}", style="bold"))
    rows = [_run_cells(r) for r in runs]
    shapes = {_shape(row): row for row in rows}
    # Whether it fits is seen on one run of each shape (ids and times are all as wide):
    # rendering hundreds of runs twice took seconds.
    started = _fits(console, _runs_table(list(shapes.values()), started=True))
    console.print(_RunsTable(rows, started))


# The cells of a run's row that every run has its own of: the rest (name, status, targets,
# workloads) is what runs of one shape share.
_OWN = ("id", "started", "reps", "failed")
# Stand-ins for those cells while rich lays out one row of each shape: one character a
# cell, from Unicode's private use area (no value holds one), each as wide as a digit.
_STAND_IN = dict(zip(_OWN, "\ue000\ue001\ue002\ue003"))


def _run_cells(r: dict) -> dict[str, str]:
    """A run's row as the table's cells (rich markup)."""
    return {"id": r["id"], "name": shown_text(r.get("name") or ""),
            "started": time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"])),
            "status": r["status"], "targets": shown_text(", ".join(r["targets"])),
            "workloads": shown_text(", ".join(r["workloads"])), "reps": str(r["reps"]),
            "failed": str(r["failed"])}


def _shape(row: dict[str, str]) -> tuple:
    """What decides how a row is laid out: its shared cells, and where its own ones have
    characters (their words' lengths)."""
    return tuple(re.sub(r"\S", "x", text) if key in _OWN else text for key, text in row.items())


class _RunsTable:
    """The runs table as rich prints it, laid out once per shape of row: rows of one shape
    take the same lines, but for their own cells (_OWN), which no_wrap keeps whole on one
    line. Rich lays out one row of each shape, its own cells stood in for (_STAND_IN), and
    every run's row is its shape's lines with its own values put back; laying out each of
    400 runs took 0.3 s. Where a stand-in does not come out whole (a console too narrow
    for an id) or a value is not plain text, rich lays out every row."""

    def __init__(self, rows: list[dict[str, str]], started: bool):
        self.rows, self.started = rows, started

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        plain = all(escape(row[key]) == row[key] == printable(row[key]) and row[key].isascii()
                    for row in self.rows for key in _OWN)
        shapes = {_shape(row): row for row in self.rows} if plain else {}
        stand_ins = [{**row, **{key: re.sub(r"\S", _STAND_IN[key], row[key]) for key in _OWN}}
                     for row in shapes.values()]
        lines = list(Segment.split_lines(console.render(
            _runs_table(stand_ins, self.started), options)))
        starts = [n for n, line in enumerate(lines)
                  if any(_STAND_IN["id"] in segment.text for segment in line)]
        groups = [lines[a:b] for a, b in zip(starts, [*starts[1:], len(lines)])]
        if not plain or len(groups) != len(stand_ins) or not all(
                _whole(group, stand_in, self.started)
                for group, stand_in in zip(groups, stand_ins)):
            yield from console.render(_runs_table(self.rows, self.started), options)
            return
        by_shape = {shape: [_merged(line) for line in group]
                    for shape, group in zip(shapes, groups)}
        for line in lines[:starts[0]] if starts else lines:
            yield from line
            yield Segment.line()
        for row in self.rows:
            own = {re.sub(r"\S", _STAND_IN[key], row[key]): row[key] for key in _OWN}
            for line in by_shape[_shape(row)]:
                for segment in line:
                    if not segment.control and any(c in segment.text
                                                   for c in _STAND_IN.values()):
                        text = segment.text
                        for stand_in, value in own.items():
                            text = text.replace(stand_in, value)
                        segment = Segment(text, segment.style)
                    yield segment
                yield Segment.line()


def _merged(line: list[Segment]) -> list[Segment]:
    """The line with each run of unstyled segments as one segment: printed alike (rich
    writes no codes for them), and rich's work per segment done for a few, not dozens."""
    merged: list[Segment] = []
    for segment in line:
        if segment.style or segment.control:
            merged.append(segment)
        elif merged and merged[-1].style is None and not merged[-1].control:
            merged[-1] = Segment(merged[-1].text + segment.text)
        else:
            merged.append(Segment(segment.text))
    return merged


def _whole(lines: list[list[Segment]], stand_in: dict[str, str], started: bool) -> bool:
    """Whether each own cell of a row's stand-in came out once, whole, in one segment."""
    texts = [segment.text for line in lines for segment in line]
    return all(sum(text.count(stand_in[key]) for text in texts) == 1
               and sum(text.count(_STAND_IN[key]) for text in texts) == len(
                   stand_in[key].replace(" ", ""))
               for key in _OWN if key != "started" or started)


def _runs_table(rows: list[dict[str, str]], started: bool) -> Table:
    named = any(row["name"] for row in rows)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), collapse_padding=True,
                  show_edge=False)
    table.add_column("id", no_wrap=True)
    if named:
        table.add_column("name", overflow="fold")
    if started:
        table.add_column("started", no_wrap=True)
    table.add_column("status", overflow="fold")
    # Names wrap between each other; only a table too wide even so folds one.
    table.add_column("targets", overflow="fold")
    table.add_column("workloads", overflow="fold")
    table.add_column("runs", justify="right", no_wrap=True)
    table.add_column("failed", justify="right", no_wrap=True)
    for row in rows:
        table.add_row(row["id"], *([row["name"]] if named else []),
                      *([row["started"]] if started else []), row["status"], row["targets"],
                      row["workloads"], row["reps"], row["failed"])
    return table


def _percent(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:+.1%}"


VERDICT_STYLE = {"better": "bold green", "worse": "bold red", "~": "dim",
                 "too few runs": "yellow", "below resolution": "dim"}


# Below this width the tables take their compact form: a lighter box, numbers never
# broken, what every cell repeats said once (the 100-column layout is kept as it is).
COMPACT_BELOW = 100


def _compact(console: Console) -> bool:
    return console.width < COMPACT_BELOW


def _light_table(**kwargs) -> Table:
    """A table with no vertical rules (a rule under the header): the columns they would
    take go to the numbers (the box's blank divider is the only space between them)."""
    return Table(box=box.SIMPLE_HEAD, padding=0, show_edge=False, **kwargs)


def _longest(texts) -> int:
    """The longest word of these texts: the narrowest a column wrapping them between their
    words can be."""
    return max((len(word) for text in texts for word in text.split()), default=1)


def _change_text(c, compact: bool) -> str:
    """A comparison's change with its interval, "+1.2% [-0.5%, +3.0%]"; compact, the
    bounds without their "%" (the caption says they are percentages): "+1.2% [-0.5, +3.0]",
    and a range unspaced, as the headline writes it: "-10.0% (-11.8–-8.2)"."""
    if c.verdict == "below resolution":   # compact: the verdict, on one line, in its place
        return c.verdict if compact else "–"
    bound = (lambda v: _percent(v).rstrip("%")) if compact else _percent
    return _percent(c.change) + bracket(c.interval, bound(c.change_ci[0]),
                                        bound(c.change_ci[1]),
                                        "–" if compact and c.interval == "range" else ", ")


def _verdict(c, compact: bool) -> str:
    """A comparison's verdict as its column shows it: compact, "below resolution" (which
    would take two lines there) is "–", the change column saying it."""
    return "–" if compact and c.verdict == "below resolution" else c.verdict


def print_comparison(console: Console, rows, alpha: float, noise_floor: float, method: str) -> None:
    compact = _compact(console)
    sides = sorted({(r.a, r.b) for r in rows}, key=[(r.a, r.b) for r in rows].index)
    for a, b in sides:
        mine = [r for r in rows if (r.a, r.b) == (a, b)]
        # Compact, a side whose every median has the same number of runs says it once.
        n_a = {r.comparison.n_a for r in mine} if compact else set()
        n_b = {r.comparison.n_b for r in mine} if compact else set()
        caption = (f"change of B relative to A{', %' if compact else ''} [{1 - alpha:.0%} CI]"
                   + (" or (range of the runs: too few for a CI)"
                      if ranged(r.comparison for r in mine) else "") + "; p after "
                   f"{'Benjamini-Hochberg' if method == 'bh' else 'Holm'} adjustment; "
                   f"significant when p < {alpha:g}, the CI excludes 0 and "
                   f"|change| ≥ {noise_floor:.0%}")
        fixed = fixed_params(mine)
        if fixed:
            caption += "; " + shown_text(fixed_note(fixed))
        title = shown_text(f"B = {b}  vs  A = {a}")
        table = (_light_table(title=title, caption=caption) if compact
                 else Table(title=title, caption=caption))
        columns: tuple[tuple[str, JustifyMethod], ...] = (
            ("workload", "left"), ("metric", "left"),
            ("A median" + (f"\n(n={next(iter(n_a))})" if len(n_a) == 1 else ""), "right"),
            ("B median" + (f"\n(n={next(iter(n_b))})" if len(n_b) == 1 else ""), "right"),
            ("change", "right"), ("p", "right"), ("verdict", "center"))
        configs: dict[str, set[str]] = {}
        for r in mine:
            configs.setdefault(r.workload, set()).add(repr(sorted(r.params.items())))
        # A workload's parameters where it ran at several sets, less what they all share
        # (the caption says that once); A's and B's where they differ.
        shown_params = []
        for r in mine:
            params = (" ".join(f"{k}={v}" for k, v in varying(r.params, r.workload,
                                                              fixed).items())
                      if len(configs[r.workload]) > 1 else "")
            if r.params_b != r.params:
                params = "A " + " ".join(f"{k}={v}" for k, v in r.params.items()
                                         if r.params_b.get(k) != v) + "\nB " + " ".join(
                    f"{k}={v}" for k, v in r.params_b.items() if r.params.get(k) != v)
            shown_params.append(params)
        words: tuple[list[str], ...] = (
            [f"{r.workload} {params}" for r, params in zip(mine, shown_params)],
            [r.metric + " ↑" for r in mine], [], [], [], [],
            [_verdict(r.comparison, compact) for r in mine])
        changes = [_change_text(r.comparison, compact) for r in mine]
        medians = [(fmt(r.comparison.median_a) + ("" if len(n_a) == 1
                                                   else f" (n={r.comparison.n_a})"),
                    fmt(r.comparison.median_b) + ("" if len(n_b) == 1
                                                   else f" (n={r.comparison.n_b})"))
                   for r in mine]
        # Compact, where the table would be wider than the console even so, the change's
        # interval goes under it (beside a sweep's parameters, which take a line anyway).
        ps = ["–" if r.comparison.verdict == "below resolution"
              else f"{r.comparison.p_adjusted:.2g}" for r in mine]
        texts = (words[0], words[1], [m[0] for m in medians], [m[1] for m in medians],
                 changes, ps, words[6])
        widths = [max(_longest([header]), _longest(column)) if number in (0, 1, 6)
                  else max(map(len, [*header.split("\n"), *column]))
                  for number, ((header, _), column) in enumerate(zip(columns, texts))]
        if compact and sum(widths) + len(widths) - 1 > console.width:
            changes = [change.replace(" ", "\n", 1) if r.comparison.verdict != "below resolution"
                       else change for r, change in zip(mine, changes)]
        for number, (col, justify) in enumerate(columns):
            if compact:   # numbers whole; names and verdicts wrap between their words
                # at most 10 wide, so that metric names keep their line ("below
                # resolution" is said in the change column)
                table.add_column(col, justify=justify, no_wrap=2 <= number <= 5,
                                 min_width=_longest(words[number]) if words[number] else None,
                                 max_width=10 if col == "verdict" else None)
            else:
                # wide enough for "resolution": a narrow terminal would cut it to "resoluti…"
                table.add_column(col, justify=justify, width=10 if col == "verdict" else None)
        previous = None
        for r, params, change, (median_a, median_b), p in zip(mine, shown_params, changes,
                                                               medians, ps):
            c = r.comparison
            group = (r.workload, params)
            if previous is not None and group != previous:
                table.add_section()
            failed = (f"\n{r.failed_a}+{r.failed_b} failed runs excluded"
                      if r.failed_a + r.failed_b else "")
            shown = shown_text(r.workload + (f"\n{params}" if params else ""))
            table.add_row(shown if group != previous else "",
                          f"{r.metric} {'↑' if c.higher_is_better else '↓'}" + failed,
                          median_a, median_b, change,
                          p, Text(_verdict(c, compact), style=VERDICT_STYLE[c.verdict]))
            previous = group
        console.print(table)
        # Why there is no verdict, once per distinct reason ("below resolution" is plain
        # enough without its note: the medians are in the row).
        for note in dict.fromkeys(r.comparison.note for r in mine
                                  if r.comparison.verdict == "too few runs"):
            console.print(Text(f"too few runs: {printable(note)}",
                               style=VERDICT_STYLE["too few runs"]))


def verdict_line(rows, alpha: float) -> Text:
    """The comparison's answer in one line, for the end of a long output: "B against A:
    3 better, 5 worse, 40 ~ (α=0.01)"; of several targets, which ones were better or worse
    ("5 worse (vm:tcg 5)"). rows: analysis.summary.CompareRow."""
    several = len({(r.a, r.b) for r in rows}) > 1
    text = Text("B against A: ", style="bold")
    for verdict, style in VERDICT_STYLE.items():
        found = [r for r in rows if r.comparison.verdict == verdict]
        if not found and verdict not in ("better", "worse", "~"):
            continue
        if len(text) > len("B against A: "):
            text.append(", ")
        text.append(f"{len(found)} {verdict}", style=style if found else "")
        if several and found and verdict in ("better", "worse"):
            by_target: dict[str, int] = {}
            for r in found:
                target = r.b.partition(":")[2]
                by_target[target] = by_target.get(target, 0) + 1
            text.append(" (" + ", ".join(f"{printable(t)} {n}" for t, n in by_target.items())
                        + ")")
    return text.append(f" (α={alpha:g})")


def print_spread(console: Console, rows, hosts: list[str], title: str) -> None:
    """A fleet run set: per headline metric and target, its ratio to the baseline on each
    host, then the spread across hosts (median, min–max). rows: vmtax.analysis.spread.SpreadRow."""
    console.print(Text(printable(title), style="bold"))
    if not rows:
        console.print("[dim]no target besides the baseline: no ratio to spread[/dim]")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    # One column of words for workload and metric: a narrow terminal wraps it between them.
    table.add_column("workload metric")
    table.add_column("target", no_wrap=True)
    for name in hosts:
        table.add_column(shown_text(name), justify="right", no_wrap=True)
    table.add_column("median", justify="right", no_wrap=True, style="bold")
    table.add_column("range", justify="right", no_wrap=True)
    for row in rows:
        params = " ".join(f"{k}={v}" for k, v in row.params.items())
        low, high = row.low, row.high
        table.add_row(shown_text(row.workload + (f" {params}" if params else "") + " "
                             + row.metric), shown_text(row.target),
                      *[sig3(v) if v is not None else "–" for v in
                        (row.ratios.get(h) for h in hosts)],
                      sig3(row.median) if row.median is not None else "–",
                      "–".join(ratio_texts(row.median, low, high)[1:])
                      if row.median is not None and low is not None and high is not None
                      else "–")
    console.print(table)
    console.print("[dim]ratio to each host's own baseline, below 1 = worse; median and "
                  "range across hosts[/dim]")
