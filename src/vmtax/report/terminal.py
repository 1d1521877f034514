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
from rich.console import Console
from rich.markup import escape
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
    # vmtax lab: never hardware's KVM (a vm's accel, a libvirt domain's type), nor a bare
    # host (the lab's own system, a TCG guest)
    if run.host.get("lab") and "kvm" in (detail, fp.get("domain_type")):
        detail = "nested KVM"
    elif run.host.get("lab") and fp.get("lab_host"):
        detail = "lab"
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
    table.add_column("workload", overflow="fold", min_width=min(14, _longest_row_word(rows)))
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
    if not fits(console, table):
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
    compact = is_compact(console)
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


def percent(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:+.1%}"


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
