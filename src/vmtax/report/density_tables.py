"""The tables of the studies that fill or start a host: `vmtax density`'s memory per
instance, and `vmtax boot`'s cold starts (vmtax.studies.density_results and .boot compute
them)."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from rich import box
from rich.console import Console
from rich.table import Table

from vmtax.core.text import markup as escape  # control characters too


def print_summaries(out: Console, summaries: Sequence[Any],
                    ratio: dict[tuple[str, bool], float], ratio_lines: list[str],
                    notes: Iterable[str] = (), runs: list[str] | None = None,
                    http_lines: Sequence[str | None] = ()) -> None:
    """The table of memory per instance (summaries: vmtax.studies.density_results.Summary;
    ratio and ratio_lines: its ratios, density_results.ratios and .ratio_lines); runs: the
    run of each summary (across runs); http_lines: each summary's HTTP check in words
    (density_results.http_line)."""
    title = "Memory per instance (MiB)" + (", across runs" if runs else "")
    # Spaces between columns, not rules: the room goes to the numbers and names.
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  padding=(0, 1), collapse_padding=True, show_edge=False)
    for column in ("run",) * bool(runs) + ("target", "KSM", "n", "ended by", "raw",
                                           "adjusted", "PSS", "marginal", "ratio", "HTTP"):
        words = column in ("run", "target", "ended by")
        # Names fold; a number is never broken across lines (-253./7).
        table.add_column(column, justify="left" if words else "right", overflow="fold",
                         no_wrap=not words)

    def num(value: float | None) -> str:
        return "–" if value is None else f"{value:.1f}"
    for i, s in enumerate(summaries):
        r = ratio.get((s.target, s.ksm))
        table.add_row(*([runs[i]] if runs else []), escape(s.target), "on" if s.ksm else "off",
                      str(s.instances), escape(s.stopped), num(s.raw), num(s.adjusted),
                      num(s.pss), num(s.marginal), "–" if r is None else f"{r:.2f}",
                      "all" if s.all_answered else "NOT ALL")
    out.print(table)
    for ratio_line in ratio_lines:
        out.print(f"density ratio, {escape(ratio_line)}")
    out.print("raw = host used memory delta / instances; adjusted = the same minus the "
              "growth of Slab, PageTables and KernelStack (kernel memory the instances "
              "made); PSS = the instances' processes, shared pages divided; marginal = the "
              "last batch's delta per instance; ratio = adjusted cost / the cheapest "
              "target's with the same KSM setting; HTTP = instances answering at every "
              "step.")
    checks: list[str | None] = [*http_lines, *[None] * len(summaries)]
    for s, line in zip(summaries, checks):
        setting = f"{escape(s.target)} (KSM {'on' if s.ksm else 'off'})"
        if s.not_results:
            out.print(f"[yellow]not a result:[/yellow] {setting}: {escape(s.not_results)}")
        if s.warning:
            out.print(f"[yellow]warning:[/yellow] {setting}: {escape(s.warning)}")
        if s.detail:
            out.print(f"ended by {escape(s.stopped)}, {setting}: {escape(s.detail)}")
        if line is not None:
            out.print(f"HTTP, {escape(line)}")
    if not all(s.settled for s in summaries if s.instances):
        out.print("[yellow]warning:[/yellow] host memory did not settle after the last step "
                  "(something else on the host allocates or frees memory): raw, adjusted "
                  "and marginal include that; PSS does not.")
    for note in notes:
        out.print(f"note: {escape(note)}")


def _cell(values: dict[str, float], key: str) -> str:
    return f"{values[key]:.3f}" if key in values else "–"


def print_starts(out: Console, found: dict[str, dict[str, dict[str, float]]], count: int,
                 lab: str | None) -> None:
    """Per target and milestone, the cold starts' percentiles (lab: a nested lab's label)."""
    table = Table(title=f"Cold starts (s), {count} per target" + (f" · {lab}" if lab else ""),
                  title_justify="left")
    for column in ("target", "time to", "p50", "p90", "p99", "max", "n"):
        table.add_column(column, justify="left" if column in ("target", "time to") else "right")
    for name, kinds in found.items():
        for what, values in kinds.items():
            table.add_row(escape(name), what, *(_cell(values, k) for k in
                                                ("p50", "p90", "p99", "max")),
                          str(int(values.get("n", 0))))
    out.print(table)
