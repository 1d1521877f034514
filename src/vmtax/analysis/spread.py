"""Results across the hosts of a fleet run set: each target's ratio to its host's baseline,
for every headline metric, on each host, and their spread (median, min-max)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any

from vmtax.analysis import summary as analysis
from vmtax.analysis.summary import RunSummary
from vmtax.results.store import Run


@dataclass
class SpreadRow:
    """A target's ratio to its host's baseline on each host, for one headline metric."""
    workload: str
    params: dict[str, Any]
    metric: str
    target: str
    ratios: dict[str, float | None]     # host -> ratio (None: no usable ratio there)

    @property
    def values(self) -> list[float]:
        return [v for v in self.ratios.values() if v is not None]

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    @property
    def low(self) -> float | None:
        return min(self.values, default=None)

    @property
    def high(self) -> float | None:
        return max(self.values, default=None)

    def to_json(self) -> dict[str, Any]:
        return {"workload": self.workload, "params": self.params, "metric": self.metric,
                "target": self.target, "ratios": self.ratios, "median": self.median,
                "min": self.low, "max": self.high}


def spread(per_host: dict[str, Run],
           summaries: dict[str, RunSummary] | None = None) -> list[SpreadRow]:
    """Per headline metric and non-baseline target, its ratio on every host and their
    spread: each host's run summarized as `vmtax show` does (analysis.summarize_run), or
    as summaries has it already (per host)."""
    rows: dict[tuple[str, str, str, str], SpreadRow] = {}
    for name, run in per_host.items():
        summary = summaries[name] if summaries else analysis.summarize_run(run)
        for row in analysis.headline(summary.rows):
            for target, cell in row.cells.items():
                if target == summary.baseline:
                    continue
                key = (row.workload, json.dumps(row.params, sort_keys=True), row.label, target)
                found = rows.setdefault(key, SpreadRow(row.workload, row.params, row.label,
                                                       target, {}))
                found.ratios[name] = cell.ratio.value if cell.ratio else None
    for found in rows.values():
        found.ratios = {name: found.ratios.get(name) for name in per_host}
    return list(rows.values())
