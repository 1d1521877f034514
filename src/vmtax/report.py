"""Terminal tables of stored runs (rich)."""

from __future__ import annotations

import io
import math
import time

from rich import box
from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from vmtax import analysis, composite
from vmtax.analysis import TOO_SHORT, Cell, Row, RunSummary
from vmtax.store import Run

FLAG_STYLE = "bold yellow"


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


def target_label(run: Run, name: str) -> str:
    fp = run.targets.get(name, {}).get("fingerprint", {})
    # An ssh target: what the plan calls the machine, beside the hypervisor found there.
    detail = fp.get("accel") or fp.get("runtime") or ", ".join(dict.fromkeys(
        v for v in (fp.get("label"), fp.get("hypervisor")) if v and v not in name))
    return f"{name} ({detail})" if detail and detail not in name else name


def interval(s) -> str:
    """A real 95% CI in brackets; with too few runs for one, the runs' range in parentheses."""
    if s.n < 2:
        return ""
    if s.ci_level >= 0.95:
        return f" [{fmt(s.ci_low)}, {fmt(s.ci_high)}]"
    return f" ({fmt(s.ci_low)} – {fmt(s.ci_high)})"   # spaced: a narrow column wraps there


def duration(seconds: float) -> str:
    """A repetition's length: 47.2 ms, 2.01 s."""
    return f"{seconds * 1000:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def flag_text(flag: str, cell: Cell) -> str:
    """A flag as a table shows it, with the figure that raised it where one helps."""
    if flag == TOO_SHORT and cell.duration is not None:
        return f"{flag} ({duration(cell.duration)})"
    return flag


def cell_text(cell: Cell | None) -> Text:
    text = Text()
    if cell is None:
        return text
    if cell.summary is None:
        text.append(f"failed ×{cell.failed}", style="red")
        return text
    text.append(fmt(cell.summary.median))
    text.append(interval(cell.summary), style="dim")
    if cell.summary.cv is not None:
        text.append(f" cv {cell.summary.cv:.1%}", style="dim")
    if cell.ratio is not None:
        r = cell.ratio
        style = "green" if r.value >= 1 else ("red" if r.value < 0.9 else "")
        text.append(f"\n×{fmt(r.value)}", style=style)
        text.append(f" [{fmt(r.ci_low)}, {fmt(r.ci_high)}]", style="dim")
    if cell.no_ratio is not None:
        text.append(f"\n{cell.no_ratio}", style="dim")
    if cell.failed:
        text.append(f"\n{cell.failed} failed", style="red")
    for flag in cell.flags:
        text.append(f"\n⚠ {flag_text(flag, cell)}", style=FLAG_STYLE)
    return text


def _title(run: Run) -> str:
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.created))
    name = run.plan.get("name")
    return f"run {run.id}{f' ({name})' if name else ''}  ·  {started}  ·  {run.status}"


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
        text.append(sig3(r.value), style="green" if r.value >= 1 else
                    ("red" if r.value < 0.9 else ""))
        if cell.n > 1:   # the interval to two digits: its width is what it tells
            text.append(f" [{_sig2(r.ci_low)}–{_sig2(r.ci_high)}]", style="dim")
    elif cell.no_ratio is not None:
        text.append(cell.no_ratio, style="dim")
    else:
        text.append(fmt(cell.summary.median))
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


FLAG_WHY = {"noisy": f"CV > {analysis.NOISY_CV:.0%}",
            TOO_SHORT: f"repetitions under {analysis.MIN_DURATION:g} s",
            "faster than baseline": "suspicious", "clock skew": "guest clock disagreed"}


def flags_line(rows: list[Row], context: str = "") -> str:
    """All flags of these rows in one line: "3 cells noisy (CV > 5%), 1 clock skew"."""
    counts = flag_counts(rows)
    if not counts:
        return ""
    parts = [f"{n} cell{'s' * (n != 1)} {flag}" + (f" ({FLAG_WHY[flag]})" if flag in FLAG_WHY
                                                    else "")
             for flag, n in counts.items()]
    return "⚠ " + ", ".join(parts) + (f": {context}" if context else "")


def print_headline(console: Console, run: Run, summary: RunSummary, context: str = "") -> None:
    """The answer on one screen: per workload its primary metric, the baseline's median and
    each target's ratio to it with its 95% CI, then each class's composite index (E3's
    geometric mean of its workloads' ratios, with its CI) and overall; one recommendation
    line per class, each suspicious win explained, every flag in one line. `vmtax show
    --all` has every metric."""
    rows = analysis.headline(summary.rows)
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
        table.add_column(escape(target_label(run, name)).replace(" (", "\n(", 1),
                         justify="right", overflow="fold", no_wrap=True)
    for row in rows:
        tags = " ".join(f"{k}={v}" for k, v in {**row.params, **row.dimensions}.items())
        unit = "" if row.unit == row.metric else f" ({row.unit})"
        base = row.cells.get(summary.baseline)
        table.add_row(escape(row.workload + (f" {tags}" if tags else "")),
                      f"{'↑' if row.higher_is_better else '↓'} {escape(row.metric)}{unit}",
                      cell_median(base), *[_ratio_text(row.cells.get(t)) for t in others])
    classes = composite.composite(summary) if others else []
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
    console.print(f"[dim]{escape(summary.baseline)}: median of its runs; others: ratio to it "
                  "[95% CI], below 1 = worse (↑ higher is better, ↓ lower)"
                  + ("; index: geometric mean of a class's workloads" if classes else "")
                  + "[/dim]")
    _print_verdicts(console, classes, composite.explanations(summary) if classes else [])
    line = flags_line(rows, context)
    if line:
        console.print(Text(line, style=FLAG_STYLE))
    _print_failures(console, summary)
    hidden = len(summary.rows) - len(rows)
    if hidden:
        console.print(f"[dim]{hidden} more metric rows: vmtax show {run.id} --all[/dim]")


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
    text = Text(sig3(index.value), style="bold")
    if index.ci_low != index.ci_high:
        text.append(f" [{_sig2(index.ci_low)}–{_sig2(index.ci_high)}]", style="dim")
    return text


def _print_verdicts(console: Console, classes: list[composite.ClassIndex],
                    explained: list[str]) -> None:
    """One recommendation line per class (one in all when no class has enough runs),
    then each suspicious win with its likely cause."""
    lines = [ci.recommendation for ci in classes]
    few = [line for line in lines if "too few runs" in line]
    if few and len(few) == len(lines):
        lines = [f"no recommendation: too few runs for a verdict (at least "
                 f"{composite.MIN_RUNS} per target)"]
    for line in lines:
        console.print(Text("→ " + line, style="bold" if "significant" not in line else ""))
    for line in explained:
        console.print(Text(f"⚠ suspicious win: {line}", style=FLAG_STYLE))


def cell_median(cell: Cell | None) -> Text:
    if cell is None:
        return Text()
    if cell.summary is None:
        return Text(f"failed ×{cell.failed}", style="red")
    text = Text(fmt(cell.summary.median))
    return text.append("⚠", style=FLAG_STYLE) if cell.flags else text


def _print_failures(console: Console, summary: RunSummary) -> None:
    for failure in summary.failures[:10]:
        console.print("[red]failed[/red] " + escape(
            f"{failure['target']} · {failure['workload']} · {failure['phase']} "
            f"{failure['idx'] + 1}: {failure['error']}"), highlight=False)
    if len(summary.failures) > 10:
        console.print(f"[red]… and {len(summary.failures) - 10} more failed repetitions[/red]")
    for note in summary.notes:
        console.print("[yellow]not recorded[/yellow] " + escape(note), highlight=False)


def print_summary(console: Console, run: Run, summary: RunSummary) -> None:
    """Every metric of the run, with every flag spelt out (`vmtax show --all`)."""
    table = Table(title=_title(run),
                  caption=f"median [95% CI] or (range) when too few runs for a 95% CI, "
                          "cv = coefficient of variation; "
                          f"×ratio to {summary.baseline} [95% CI]: below 1 = worse, "
                          "whatever the metric's direction (↑ higher is better, ↓ lower)")
    table.add_column("workload")
    table.add_column("metric")
    for name in summary.targets:
        label = target_label(run, name)
        # fold: a narrow terminal wraps a number rather than cutting it off with "…"
        table.add_column(escape(label) + (" = 1" if name == summary.baseline else ""),
                         justify="right", overflow="fold")
    previous = None
    for row in summary.rows:
        params = " ".join(f"{k}={v}" for k, v in row.params.items())
        group = (row.workload, params)
        if previous is not None and group != previous:
            table.add_section()
        shown = escape(row.workload + (f"\n{params}" if params else ""))
        table.add_row(shown if group != previous else "",
                      f"{row.label}{'' if row.unit == row.metric else f' ({row.unit})'} "
                      f"{'↑' if row.higher_is_better else '↓'}",
                      *[cell_text(row.cells.get(t)) for t in summary.targets])
        previous = group
    console.print(table)
    _print_failures(console, summary)


def print_runs(console: Console, runs: list[dict], source: str) -> None:
    table = Table(title=f"stored runs in {escape(source)}")
    table.add_column("id", no_wrap=True)
    if any(r.get("name") for r in runs):
        table.add_column("name")
    table.add_column("started", no_wrap=True)
    for col in ("status", "targets", "workloads", "runs", "failed"):
        table.add_column(col)
    for r in runs:
        named = [escape(r.get("name") or "")] if any(x.get("name") for x in runs) else []
        table.add_row(r["id"], *named,
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"])),
                      r["status"], escape(", ".join(r["targets"])), ", ".join(r["workloads"]),
                      str(r["reps"]), str(r["failed"]))
    console.print(table)


def _percent(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:+.1%}"


VERDICT_STYLE = {"better": "bold green", "worse": "bold red", "~": "dim",
                 "too few runs": "yellow", "below resolution": "dim"}


def print_comparison(console: Console, rows, alpha: float, noise_floor: float, method: str) -> None:
    sides = sorted({(r.a, r.b) for r in rows}, key=[(r.a, r.b) for r in rows].index)
    for a, b in sides:
        table = Table(title=escape(f"B = {b}  vs  A = {a}"),
                      caption=f"change of B relative to A [{1 - alpha:.0%} CI]; p after "
                              f"{'Benjamini-Hochberg' if method == 'bh' else 'Holm'} adjustment; "
                              f"significant when p < {alpha:g}, the CI excludes 0 and "
                              f"|change| ≥ {noise_floor:.0%}")
        columns: tuple[tuple[str, JustifyMethod], ...] = (
            ("workload", "left"), ("metric", "left"), ("A median", "right"),
            ("B median", "right"), ("change", "right"), ("p", "right"), ("verdict", "center"))
        for col, justify in columns:
            # wide enough for "resolution": a narrow terminal would cut it to "resoluti…"
            table.add_column(col, justify=justify, width=10 if col == "verdict" else None)
        mine = [r for r in rows if (r.a, r.b) == (a, b)]
        configs: dict[str, set[str]] = {}
        for r in mine:
            configs.setdefault(r.workload, set()).add(repr(sorted(r.params.items())))
        previous = None
        for r in mine:
            c = r.comparison
            params = (" ".join(f"{k}={v}" for k, v in r.params.items())
                      if len(configs[r.workload]) > 1 else "")
            if r.params_b != r.params:
                params = "A " + " ".join(f"{k}={v}" for k, v in r.params.items()
                                         if r.params_b.get(k) != v) + "\nB " + " ".join(
                    f"{k}={v}" for k, v in r.params_b.items() if r.params.get(k) != v)
            group = (r.workload, params)
            if previous is not None and group != previous:
                table.add_section()
            failed = (f"\n{r.failed_a}+{r.failed_b} failed runs excluded"
                      if r.failed_a + r.failed_b else "")
            shown = escape(r.workload + (f"\n{params}" if params else ""))
            table.add_row(shown if group != previous else "",
                          f"{r.metric} {'↑' if c.higher_is_better else '↓'}" + failed,
                          f"{fmt(c.median_a)} (n={c.n_a})", f"{fmt(c.median_b)} (n={c.n_b})",
                          "–" if c.verdict == "below resolution" else
                          _percent(c.change) + f" [{_percent(c.change_ci[0])}, "
                                               f"{_percent(c.change_ci[1])}]",
                          "–" if c.verdict == "below resolution" else f"{c.p_adjusted:.2g}",
                          Text(c.verdict, style=VERDICT_STYLE[c.verdict]))
            previous = group
        console.print(table)
        # Why there is no verdict, once per distinct reason ("below resolution" is plain
        # enough without its note: the medians are in the row).
        for note in dict.fromkeys(r.comparison.note for r in mine
                                  if r.comparison.verdict == "too few runs"):
            console.print(Text(f"too few runs: {note}", style=VERDICT_STYLE["too few runs"]))


def print_spread(console: Console, rows, hosts: list[str], title: str) -> None:
    """A fleet run set: per headline metric and target, its ratio to the baseline on each
    host, then the spread across hosts (median, min–max). rows: fleet.SpreadRow."""
    console.print(Text(title, style="bold"))
    if not rows:
        console.print("[dim]no target besides the baseline: no ratio to spread[/dim]")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    # One column of words for workload and metric: a narrow terminal wraps it between them.
    table.add_column("workload metric")
    table.add_column("target", no_wrap=True)
    for name in hosts:
        table.add_column(escape(name), justify="right", no_wrap=True)
    table.add_column("median", justify="right", no_wrap=True, style="bold")
    table.add_column("range", justify="right", no_wrap=True)
    for row in rows:
        params = " ".join(f"{k}={v}" for k, v in row.params.items())
        low, high = row.low, row.high
        table.add_row(escape(row.workload + (f" {params}" if params else "") + " "
                             + row.metric), escape(row.target),
                      *[sig3(v) if v is not None else "–" for v in
                        (row.ratios.get(h) for h in hosts)],
                      sig3(row.median) if row.median is not None else "–",
                      f"{_sig2(low)}–{_sig2(high)}" if low is not None and high is not None
                      else "–")
    console.print(table)
    console.print("[dim]ratio to each host's own baseline, below 1 = worse; median and "
                  "range across hosts[/dim]")
