"""`vmtax composite`'s table: the composite index per class and target, then the
recommendations and the suspicious wins explained (vmtax.analysis.composite computes them)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from vmtax.analysis import composite
from vmtax.analysis.composite import ClassIndex
from vmtax.analysis.summary import RunSummary
from vmtax.report.parts import index_parts, interval_legend, plain


def print_composite(console: Console, summary: RunSummary, classes: list[ClassIndex],
                    explanations: list[str]) -> None:
    """The composite index per class and target (classes: composite.composite), then the
    recommendations and the suspicious wins explained (composite.explanations)."""
    if not classes:
        console.print("no workload of this run has a ratio to the baseline in a class")
        return
    kinds = {i.interval for ci in classes for t, i in ci.by_target.items()
             if t != summary.baseline}
    table = Table(title=f"composite index: ratio to {summary.baseline}, geometric mean "
                  f"{interval_legend(kinds)}; below 1 = worse")
    table.add_column("class")
    table.add_column("workloads", justify="right")
    for target in summary.targets:
        table.add_column(target, justify="right")
    for ci in classes:
        counted = max((len(i.parts) for i in ci.by_target.values()), default=0)
        cells = []
        for target in summary.targets:
            index = ci.by_target.get(target)
            cells.append("1" if index is not None and target == summary.baseline
                         else plain(index_parts(index)))
        table.add_row(ci.cls, str(counted), *cells)
    console.print(table)
    for ci in classes:
        console.print(ci.recommendation)
        for why in ci.skipped if ci.cls != composite.OVERALL else []:
            console.print(f"  not counted: {why}")
    for line in explanations:
        console.print(f"suspicious win: {line}")
