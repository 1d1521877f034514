"""`vmtax compare` and a fleet's spread as terminal tables (rich): a verdict per metric,
and the line that sums them up."""

from __future__ import annotations

from rich import box
from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from vmtax.core.text import printable
from vmtax.report.parts import (bracket, fixed_note, fixed_params, fmt, percent, ranged,
                                ratio_texts, sig3, varying)
from vmtax.report.terminal import is_compact, light_table, longest_word, shown_text


VERDICT_STYLE = {"better": "bold green", "worse": "bold red", "~": "dim",
                 "too few runs": "yellow", "below resolution": "dim"}


def _change_text(c, compact: bool) -> str:
    """A comparison's change with its interval, "+1.2% [-0.5%, +3.0%]"; compact, the
    bounds without their "%" (the caption says they are percentages): "+1.2% [-0.5, +3.0]"."""
    if c.verdict == "below resolution":   # compact: the verdict, on one line, in its place
        return c.verdict if compact else "–"
    bound = (lambda v: percent(v).rstrip("%")) if compact else percent
    return percent(c.change) + bracket(c.interval, bound(c.change_ci[0]), bound(c.change_ci[1]))


def _verdict(c, compact: bool) -> str:
    """A comparison's verdict as its column shows it: compact, "below resolution" (which
    would take two lines there) is "–", the change column saying it."""
    return "–" if compact and c.verdict == "below resolution" else c.verdict


def print_comparison(console: Console, rows, alpha: float, noise_floor: float, method: str) -> None:
    compact = is_compact(console)
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
        table = (light_table(title=title, caption=caption) if compact
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
        widths = [max(longest_word([header]), longest_word(column)) if number in (0, 1, 6)
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
                                 min_width=longest_word(words[number]) if words[number] else None,
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
        # A "~" whose interval excludes 0: why no change was called.
        for note in dict.fromkeys(r.comparison.note for r in mine
                                  if r.comparison.verdict == "~" and r.comparison.note):
            console.print(Text(f"~ {printable(note)}", style=VERDICT_STYLE["~"]))


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
