"""How far a host's medians move from one run to the next with nothing changed (its drift
between runs), from the earlier runs of a series, and the verdicts of `compare` that such
drift alone explains.

Repetitions within one run do not sample the drift between runs: two runs of one plan
seconds apart differed by up to 8% on this project's hosts, which a test over their
repetitions calls significant though A equals A (`make bench-stats`, part 1). A run of a
name (`vmtax run --name`) has earlier runs of that name on its host: the ratios of their
consecutive medians show how far one run lands from the one before, and a change within
that spread gets no verdict.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import defaultdict
from typing import Any, Sequence

from vmtax.analysis import significance, stats
from vmtax.analysis.summary import CompareRow
from vmtax.results.store import Run, Store

# Consecutive pairs of earlier runs needed for a spread, and how many latest runs are used.
DRIFT_FROM = 3
DRIFT_RUNS = 20


def consecutive_spread(medians: Sequence[float], alpha: float) -> tuple[float, float] | None:
    """The 1 - alpha prediction interval of one run's median over the median of the run
    before it, as changes (-0.1 = 10% lower), from medians in run order; None with fewer
    than DRIFT_FROM consecutive pairs, or with a median not above 0 (no ratio to take).
    Their log ratios are taken as zero-mean normal: their mean square estimates the
    variance, and one step between two levels only widens it."""
    if any(m <= 0 for m in medians):
        return None
    logs = [math.log(m) for m in medians]
    ratios = [b - a for a, b in zip(logs, logs[1:])]
    if len(ratios) < DRIFT_FROM:
        return None
    half = significance.t_isf(alpha / 2, len(ratios)) * math.sqrt(
        math.fsum(r * r for r in ratios) / len(ratios))
    return math.exp(-half) - 1, math.exp(half) - 1


def host_of(facts: dict[str, Any]) -> str:
    """The host a run's series is kept for: a fleet host's name, else the hostname."""
    return (facts.get("fleet") or {}).get("host") or facts.get("hostname") or "unknown host"


def within_drift(store: Store, rows: list[CompareRow], run_a: Run, run_b: Run,
                 alpha: float) -> tuple[list[CompareRow], str]:
    """rows (B against A, `compare_targets`) with each better or worse verdict whose change
    lies within the drift between the earlier runs of B's name on B's host (A's name when
    B has none) made "~", saying so; and, where A and B are two runs and no such drift
    was known, a caveat saying so ("" otherwise)."""
    name = str(run_b.plan.get("name") or run_a.plan.get("name") or "")
    judged = [r for r in rows if r.comparison.significant]
    if run_a.id == run_b.id or not judged:
        return rows, ""
    host = host_of(run_b.host)
    earlier = [r["id"] for r in store.named_runs(name)
               if host_of(r["host"]) == host and r["created"] < run_b.created
               and r["id"] != run_b.id][-DRIFT_RUNS:] if name else []
    if len(earlier) <= DRIFT_FROM:
        shown = (f"{'no' if not earlier else f'only {len(earlier)}'} earlier "
                 f"run{'s' * (len(earlier) != 1)} of {name!r} on this host "
                 f"({DRIFT_FROM + 1} show it)" if name else
                 f"{DRIFT_FROM + 1} earlier runs of one name (vmtax run --name) show it")
        return rows, ("A and B are two runs: how far this host's results move from one run "
                      f"to the next is not in these p-values; {shown}")
    order = {run_id: i for i, run_id in enumerate(earlier)}
    medians: dict[tuple[str, str, str, str, str], dict[int, float]] = defaultdict(dict)
    for (run_id, target, workload, params, metric, _, _, dims), values in store.named_values(
            name, pairs={(r.workload, r.metric) for r in judged}, runs=earlier).items():
        key = (target, workload, _canonical(params), metric, _canonical(dims))
        medians[key][order[run_id]] = stats.summarize(values).median
    kept = []
    for row in rows:
        key = (row.b.partition(":")[2], row.workload, json.dumps(row.params_b, sort_keys=True),
               row.metric, json.dumps(row.dimensions, sort_keys=True))
        found = medians.get(key, {})
        spread = consecutive_spread([found[i] for i in sorted(found)], alpha)
        c = row.comparison
        if c.significant and spread is not None and c.median_a > 0 and (
                spread[0] <= c.median_b / c.median_a - 1 <= spread[1]):
            row = dataclasses.replace(row, comparison=dataclasses.replace(
                c, verdict="~",
                note=(f"within the drift between consecutive runs of {name!r} on {host} "
                      f"before B ({spread[0]:+.1%} … {spread[1]:+.1%}, {len(found)} runs)")))
        kept.append(row)
    return kept, ""


def _canonical(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True)
