"""`vmtax tune`'s answer on the terminal: each knob's gain over the baseline with its
interval and adjusted verdict, the combined configuration, the tax recovered and the
recommended configuration (vmtax.analysis.tune computes them)."""

from __future__ import annotations

import math

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vmtax.analysis import tune as tuning

VERDICT_STYLE = {"better": "green", "worse": "red"}


# Beside a `~` whose interval excludes 0: the interval is one comparison's, the verdict is
# adjusted across the search (and racing may have stopped it early, as no win): not a
# contradiction, said under the table.
UNADJUSTED = "*"


def _unadjusted_only(effect: tuning.Effect) -> bool:
    g = effect.gain
    return effect.comparison.verdict == "~" and (g.low > 0 or g.high < 0)


def _effect(effect: tuning.Effect) -> str:
    g, verdict = effect.gain, effect.comparison.verdict
    runs = f" n={effect.comparison.n_a}/{effect.comparison.n_b}"
    if not math.isfinite(g.value):
        return verdict + runs
    text = (f"{g.value:+.1%} [{g.low:+.1%}, {g.high:+.1%}] {verdict}"
            + (UNADJUSTED if _unadjusted_only(effect) else "") + runs)
    style = VERDICT_STYLE.get(verdict)
    return f"[{style}]{escape(text)}[/{style}]" if style else escape(text)


def _column(effect: tuning.Effect, several: bool) -> str:
    return f"{effect.group}: {effect.workload}" if several else effect.group


def print_summary(out: Console, summary: tuning.TuneSummary) -> None:
    """The knobs' table, the combined configuration against the baseline and the best
    single knob, the tax recovered, and the recommended configuration."""
    first = summary.knobs[0].effects if summary.knobs else []
    groups = [e.group for e in first]
    several = len(set(groups)) != len(groups)
    out.print(f"baseline {escape(summary.baseline_text())}")
    table = Table(title=f"knobs of {summary.baseline} ({summary.kind}): gain over the "
                        f"baseline, {100 * (1 - summary.alpha):g}% CI, verdict after "
                        f"{summary.method.upper() if summary.method == 'bh' else 'Holm'}, "
                        "n=runs (baseline/knob)",
                  title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("knob=value")
    for e in first:
        table.add_column(escape(_column(e, several)))
    table.add_column("safety")
    rank = 0
    for knob in summary.knobs:
        rank += 0 if knob.control else 1
        table.add_row("–" if knob.control else str(rank),
                      "control (A vs A)" if knob.control else escape(knob.label),
                      *(_effect(e) for e in knob.effects), escape(knob.safety or ""))
    out.print(table)
    effects = [e for knob in summary.knobs for e in knob.effects]
    if any(_unadjusted_only(e) for e in effects):
        out.print(f"[dim]{UNADJUSTED} its interval excludes 0, but the change is not "
                  f"significant once adjusted for the {len(effects)} comparisons above, or "
                  "racing stopped it early as no win[/dim]")
    out.print(escape(summary.control_text))
    if summary.combined_run is not None:
        tuned = summary.tuned_text
        out.print(f"\ncombined ({escape(tuned)}) against {escape(summary.baseline)}: "
                  + "; ".join(f"{escape(_column(e, several))} {_effect(e)}"
                              for e in summary.vs_baseline))
        if summary.vs_best:
            out.print(f"against the best single ({escape(summary.best or '')}): "
                      + "; ".join(f"{escape(_column(e, several))} {_effect(e)}"
                                  for e in summary.vs_best))
        for line in summary.interactions:
            out.print(escape(line))
        if summary.tax_recovered:
            out.print("tax recovered (tuned − baseline) / (native − baseline): " + ", ".join(
                f"{group} {value:.0%}" for group, value in summary.tax_recovered.items()
                if value is not None))
    for note in summary.notes:
        out.print(f"[dim]note: {escape(note)}[/dim]")
    out.print("\nrecommended configuration, a plan to run as it is" + (
        " (the baseline: nothing was confirmed)" if not summary.confirmed else "") + ":")
    out.print(escape(summary.recommended()), soft_wrap=True)


def print_search(out: Console, search: tuning.SearchOutline) -> None:
    """What a checked search would try, against what, within what time (--dry-run)."""
    out.print(f"tune {escape(search.baseline)} ({escape(search.kind)}) on "
              + escape(", ".join(search.workloads))
              + (f", with {escape(search.native)} for the tax recovered"
                 if search.native else "")
              + f": {len(search.knobs)} knob values and an A-vs-A control, "
              f"budget {search.budget} (one comparison of each needs {search.needs})")
    for label, safety in search.knobs:
        out.print(f"  {escape(label)}"
                  + (f"  [yellow]{escape(safety)}[/yellow]" if safety else ""))
    for note in search.notes:
        out.print(f"[dim]note: {escape(note)}[/dim]")
    out.print("nothing runs (--dry-run)")
