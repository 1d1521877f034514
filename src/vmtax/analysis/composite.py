"""E3's composite index, in the style of UnixBench: per class of performance and overall,
the geometric mean of each workload's ratio to the baseline, with a confidence interval
propagated from the workloads' own intervals; and the one-line recommendation per class.

A workload counts once, whatever its metric's dimensions: dd's buffered and direct copies,
or bzip2's file and tree, are first combined by their own geometric mean into the
workload's ratio. Only primary metrics count (a workload's throughput and time are one
measurement, not two votes), each in the class its manifest names (`MetricSpec.group`).

Intervals are combined in log space, where a geometric mean is an arithmetic one: for a
mean of n independent log-ratios, each side of the interval is sqrt(sum of that side's
squared half-widths) / n. The recommendation names the best target of a class only when
its interval lies wholly above every other target's (the baseline's is exactly 1);
otherwise it says there is no significant difference where the intervals are narrow
enough to rule out a 5% one (WIDE), else that they were not told apart, too noisy to tell
(±X%, the widest half-width); with fewer than 3 runs per target, that there are too few
runs for a verdict. Either way it ends with the biggest
fact: how much of the baseline each target that loses beyond noise keeps, the worst first
("CPU: no significant difference between native and container; vm keeps 0.109 of
native")

Suspicious wins are explained, not just flagged: where a target beats the bare host beyond
noise (analysis' "faster than baseline"), `explanations` names the likely cause from the
stored results themselves: the target's clock disagreeing with the host's ("clock skew"),
then the workload's own explanation (Workload.explain_win: dd's buffered copy winning
where its O_DIRECT copy does not is the host's page cache), and for other disk-bound wins
the page cache or fewer fsyncs reaching the disk.

`composite(summary)` and `explanations(summary)` are what views print; the terminal form
(`vmtax composite RUN`) is vmtax.report.composite_table.print_composite.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


from vmtax.analysis import summary as analysis
from vmtax.analysis.intervals import IntervalKind
from vmtax.analysis.stats import SUSPICIOUS_MARGIN
from vmtax.analysis.summary import Cell, Row, RunSummary
from vmtax.core import workload as workloads
from vmtax.core.notation import bracket, ratio_texts, sig3

OVERALL = "overall"
# An index's interval wider than this on either side of it (relative half-width) cannot rule
# out a 5% difference, the size vmtax's default 5 runs are set to tell from noise: a tie
# of such intervals is "too noisy to tell", never "no significant difference".
WIDE = 0.05
# No verdict from fewer runs per side than E3's method keeps: one run gives an interval of
# zero width, and at 2 against 2 a bootstrap interval clears 1 by chance 1 time in 6.
MIN_RUNS = 3


@dataclass(frozen=True)
class Index:
    """A geometric mean of ratios to the baseline with its propagated interval."""
    value: float
    ci_low: float
    ci_high: float
    parts: tuple[str, ...] = ()        # what it averages: workload labels
    # The fewest measured runs behind any ratio counted (on either side of it).
    runs: int = MIN_RUNS
    # What [ci_low, ci_high] is: a CI when every part's is one; propagated from runs'
    # ranges when any part had too few runs for a CI ("range"); none from single runs.
    interval: IntervalKind = "ci"


@dataclass
class ClassIndex:
    cls: str
    by_target: dict[str, Index]        # baseline included (exactly 1)
    recommendation: str
    skipped: list[str] = field(default_factory=list)   # "workload on target: why"


def combine(indices: list[Index], parts: tuple[str, ...] = ()) -> Index:
    """The geometric mean of ratios, its interval propagated in log space."""
    if not indices:
        raise ValueError("a composite of nothing")
    n = len(indices)
    logs = [math.log(i.value) for i in indices]
    low = math.sqrt(sum((v - math.log(i.ci_low)) ** 2 for v, i in zip(logs, indices)))
    high = math.sqrt(sum((math.log(i.ci_high) - v) ** 2 for v, i in zip(logs, indices)))
    mean = sum(logs) / n
    kinds = {i.interval for i in indices}
    kind: IntervalKind = kinds.pop() if len(kinds) == 1 else "range"
    return Index(math.exp(mean), math.exp(mean - low / n), math.exp(mean + high / n), parts,
                 min(i.runs for i in indices), kind)


def _usable(cell: Cell, base: Cell) -> bool:
    r = cell.ratio
    return (r is not None and not _bound(cell) and not _bound(base)
            and all(math.isfinite(v) and v > 0 for v in (r.value, r.ci_low, r.ci_high)))


def _bound(cell: Cell) -> bool:
    """Whether a workload flagged the cell's value as only a lower bound."""
    return any(f.partition(": ")[0] == workloads.LOWER_BOUND for f in cell.flags)


def _label(row: Row) -> str:
    params = " ".join(f"{k}={v}" for k, v in row.params.items())
    return f"{row.workload} {params}" if params else row.workload


def composite(summary: RunSummary) -> list[ClassIndex]:
    """Per class (in the report's order) and, over several classes, overall: each
    target's index."""
    # (class, workload label) -> target -> the ratios of its primary metric's dimensions
    ratios: dict[str, dict[str, dict[str, list[Index]]]] = {}
    skipped: dict[str, list[str]] = {}
    for row in analysis.headline(summary.rows):
        spec = analysis.metric_spec(row.workload, row.metric)
        base = row.cells.get(summary.baseline)
        if spec is None or spec.group is None or base is None:
            continue
        label = _label(row)
        for target, cell in row.cells.items():
            if target == summary.baseline:
                continue
            if _usable(cell, base):
                assert cell.ratio is not None
                ratios.setdefault(spec.group, {}).setdefault(label, {}).setdefault(
                    target, []).append(Index(cell.ratio.value, cell.ratio.ci_low,
                                             cell.ratio.ci_high, runs=min(cell.n, base.n),
                                             interval=cell.ratio.interval))
            else:
                why = (cell.no_ratio or "no ratio (failed or missing runs)"
                       if not (_bound(cell) or _bound(base)) else
                       "a capacity that is only a lower bound (no step failed) on "
                       f"{target if _bound(cell) else summary.baseline}: no measure of the tax")
                skipped.setdefault(spec.group, []).append(f"{row.label} of {label} on "
                                                          f"{target}: {why}")
    order = [c for c in analysis.CLASS_ORDER if c in ratios]
    order += sorted(set(ratios) - set(order))
    per_workload: dict[str, dict[str, list[Index]]] = {}   # target -> class -> workloads
    results = []
    for cls in order:
        by_target: dict[str, list[Index]] = {}
        for label, targets in ratios[cls].items():
            for target, dims in targets.items():
                one = combine(dims, (label,))
                by_target.setdefault(target, []).append(one)
                per_workload.setdefault(target, {}).setdefault(cls, []).append(one)
        indices = {t: combine(parts, tuple(p for i in parts for p in i.parts))
                   for t, parts in by_target.items()}
        results.append(_with_baseline(cls, indices, summary, skipped.get(cls, [])))
    overall = {t: combine([i for parts in classes.values() for i in parts],
                          tuple(p for parts in classes.values() for i in parts for p in i.parts))
               for t, classes in per_workload.items()}
    if len(results) > 1:    # of one class, overall is that class again
        results.append(_with_baseline(OVERALL, overall, summary,
                                      [s for c in order for s in skipped.get(c, [])]))
    return results


def _with_baseline(cls: str, indices: dict[str, Index], summary: RunSummary,
                   skipped: list[str]) -> ClassIndex:
    by_target = {summary.baseline: Index(1.0, 1.0, 1.0, interval="none")}
    by_target.update(sorted(indices.items(), key=lambda kv: -kv[1].value))
    # A target recommended for beating the bare host says so: the verdict stands on the
    # numbers, the doubt on `explanations` (a cell flagged faster, with its likely
    # cause) or, with runs too few to flag a cell, on the index itself.
    explained = {target for row_cls, target in _suspicious(summary)
                 if cls in (row_cls, OVERALL)}
    doubts = {}
    for target, index in by_target.items():
        if target in explained:
            doubts[target] = ", a suspicious win: see its likely cause"
        elif summary.baseline_bare_host and target != summary.baseline and index.ci_low > 1:
            doubts[target] = f", faster than {summary.baseline}: suspicious"
    return ClassIndex(cls, by_target, recommend(cls, by_target, summary.baseline, doubts),
                      skipped)


def _suspicious(summary: RunSummary) -> set[tuple[str | None, str]]:
    """(class, target) of every headline cell faster than the bare host beyond noise."""
    found = set()
    for row in analysis.headline(summary.rows):
        spec = analysis.metric_spec(row.workload, row.metric)
        for target, cell in row.cells.items():
            if FASTER in cell.flags:
                found.add((spec.group if spec is not None else None, target))
    return found


def recommend(cls: str, by_target: dict[str, Index], baseline: str,
              doubts: dict[str, str] | None = None) -> str:
    """The best target of the class when it wins beyond noise, else no verdict; either way
    ending with the biggest fact: how much of the baseline the targets that lose beyond
    noise keep, the worst first (a tie between two targets must not hide a third at a
    tenth of the baseline). doubts: target -> what to add to a win of it."""
    if min(i.runs for i in by_target.values()) < MIN_RUNS:
        return f"{cls}: too few runs for a verdict (at least {MIN_RUNS} per target)"
    best_name, best = max(by_target.items(), key=lambda kv: kv[1].value)
    others = [i for name, i in by_target.items() if name != best_name]
    if others and all(best.ci_low > other.ci_high for other in others):
        # Below the baseline beyond noise; the baseline's index is exactly 1.
        losses = _losses({name: i for name, i in by_target.items() if i.ci_high < 1},
                         baseline)
        if best_name == baseline:
            return f"{cls}: {best_name} (the others lose beyond noise; {losses})"
        doubt = (doubts or {}).get(best_name, "")
        value, low, high = ratio_texts(best.value, best.ci_low, best.ci_high)
        return (f"{cls}: {best_name} (index {value}{bracket(best.interval, low, high)}){doubt}"
                + (f"; {losses}" if losses else ""))
    # No winner, but those below the best beyond noise are worth a word.
    losers = {name: i for name, i in by_target.items() if i.ci_high < best.ci_low}
    tied = [name for name in by_target if name not in losers]
    # Too wide to rule out a difference worth knowing: that is no answer, only a question.
    widest = max(((i.ci_high - i.ci_low) / 2 / i.value for name, i in by_target.items()
                  if name in tied and i.interval != "none"), default=0.0)
    between = f" between {', '.join(tied[:-1])} and {tied[-1]}" if losers else ""
    said = (f"not told apart{between}: too noisy to tell (±{widest:.0%})" if widest > WIDE
            else f"no significant difference{between}")
    return f"{cls}: {said}" + (f"; {_losses(losers, baseline)}" if losers else "")


def _losses(losers: dict[str, Index], baseline: str) -> str:
    """"vm keeps 0.109 of native, container 0.950": the worst first; the baseline, being
    1 by definition, is only said to be worse."""
    ranked = sorted((i.value, name) for name, i in losers.items() if name != baseline)
    parts = [f"{name} {sig3(value)}" if n else
             f"{name} keeps {sig3(value)} of {baseline}"
             for n, (value, name) in enumerate(ranked)]
    return ", ".join(parts + [f"{baseline} worse"] * (baseline in losers))


@dataclass
class Standing:
    """How much of the baseline one target keeps in one class: its composite index, so a
    report's cards and its composite table give one figure."""
    target: str
    keeps: float                          # the class's composite index
    parts: tuple[str, ...]                # the workloads it averages
    ratios: list[tuple[Row, Cell]]        # each headline metric counted, with its cell
    index: Index | None = None            # the index with its interval

    @property
    def told_apart(self) -> str | None:
        """"better" or "worse" than the baseline where the index's 95% CI lies wholly above
        or below 1; None where it holds 1, or there were too few runs for a CI: a card's
        figure then claims neither a win nor a loss."""
        i = self.index
        if i is None or i.interval != "ci" or i.ci_low <= 1 <= i.ci_high:
            return None
        return "better" if i.ci_low > 1 else "worse"

    @property
    def flags(self) -> list[str]:
        """Sanity flags on the metrics counted: the verdict is only as good as they are."""
        return sorted({f for _, cell in self.ratios for f in cell.flags})

    @property
    def worst(self) -> tuple[Row, Cell]:
        return min(self.ratios, key=_ratio_value)

    @property
    def best(self) -> tuple[Row, Cell]:
        return max(self.ratios, key=_ratio_value)


def _ratio_value(pair: tuple[Row, Cell]) -> float:
    ratio = pair[1].ratio
    assert ratio is not None    # a standing counts only cells with a usable ratio
    return ratio.value


def standings(summary: RunSummary) -> dict[str, list[Standing]]:
    """Per class (overall aside), each target but the baseline with its composite index and
    the metrics counted in it, best first (the report's findings cards)."""
    counted: dict[tuple[str, str], list[tuple[Row, Cell]]] = {}   # (class, target) -> cells
    for row in analysis.headline(summary.rows):
        spec = analysis.metric_spec(row.workload, row.metric)
        if spec is None or spec.group is None or summary.baseline not in row.cells:
            continue
        for target, cell in row.cells.items():
            if target != summary.baseline and _usable(cell, row.cells[summary.baseline]):
                counted.setdefault((spec.group, target), []).append((row, cell))
    return {ci.cls: [Standing(target, index.value, index.parts, counted[(ci.cls, target)],
                              index)
                     for target, index in ci.by_target.items() if target != summary.baseline]
            for ci in composite(summary) if ci.cls != OVERALL}


def json_of(baseline: str, classes: list[ClassIndex], lines: list[str]) -> dict[str, Any]:
    """What `show --json` and `composite --json` carry of what composite() and
    explanations() gave: per class each target's index with its interval and the
    recommendation, then the suspicious wins explained."""
    return {"baseline": baseline, "classes": [asdict(c) for c in classes],
            "explanations": lines}


FASTER = "faster than baseline"
CLOCK = "clock skew"


def explanations(summary: RunSummary) -> list[str]:
    """One line per suspicious win (a target beating the bare host beyond noise): the
    likely cause, as far as the stored results tell."""
    return [line for _, line in explained(summary)]


def explained(summary: RunSummary) -> list[tuple[str | None, str]]:
    """explanations, each with the class of the metric that won (None: unclassed)."""
    lines: list[tuple[str | None, str]] = []
    for row in analysis.headline(summary.rows):
        spec = analysis.metric_spec(row.workload, row.metric)
        for target, cell in row.cells.items():
            if FASTER not in cell.flags:
                continue
            if CLOCK in cell.flags:
                why = ("guest clock drift: the target's clock disagreed with the host's "
                       "over these runs, so the times it measured itself are off")
            elif (own := _workload_explanation(summary, row, target)) is not None:
                why = own
            elif spec is not None and spec.group == "disk I/O":
                why = ("likely the host's page cache or fewer fsyncs reaching the disk: the "
                       "target's disk is a host file; compare dd's oflag=direct copy")
            elif spec is not None and spec.group == "network":
                # A server writes and reads files too, and each target has its own network
                # path: "no I/O" would be false here.
                why = ("no cause recorded and no clock skew seen: the baseline's network "
                       "path differs from the target's; check the host's load during the "
                       "baseline's runs")
            else:
                why = ("no I/O to explain it and no clock skew seen: check the host's load "
                       "during the baseline's runs")
            if cell.ratio is not None and cell.ratio.interval != "ci":
                why += (f" (too few runs to test the win, n={cell.n}: flagged as its ×"
                        f"{cell.ratio.value:.3g} clears 1 by over {SUSPICIOUS_MARGIN:.0%} "
                        "on every run)")
            lines.append((spec.group if spec is not None else None,
                          f"{target} · {_label(row)} {row.label}: {why}"))
    return lines


def _outcome(row: Row, cell: Cell) -> workloads.Outcome:
    return workloads.Outcome(row.metric, dict(row.dimensions),
                             cell.ratio.value if cell.ratio is not None else None,
                             FASTER in cell.flags)


def _workload_explanation(summary: RunSummary, row: Row, target: str) -> str | None:
    """The workload's own explanation of row's win on target (Workload.explain_win), given
    the target's other rows of the same workload configuration; None when it has none."""
    found = workloads.manifest(row.workload)
    if found is None or "explain_win" not in found.hooks:
        return None
    cls = workloads.get(row.workload)
    others = [_outcome(other, cell) for other in summary.rows
              if other is not row and other.workload == row.workload
              and other.params == row.params and (cell := other.cells.get(target)) is not None]
    return cls.explain_win(_outcome(row, row.cells[target]), others, summary.baseline)
