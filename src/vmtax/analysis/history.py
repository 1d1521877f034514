"""Runs that repeat: the runs of one name (`vmtax run --name`), per host, as series.

A series is one metric of one target × workload on one host; each run that measured it is a
point, holding that run's successful measured repetitions. Per series: its change points
(analysis.changepoint, p-values adjusted across every series judged together), what changed
between the runs on either side of each (their plans, the host's and the target's
fingerprints, vmtax's version), and whether the newest point is a regression not yet
recovered nor accepted. Runs copied in from another store join their series by name: the
series is the name, not the store it was recorded in.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from vmtax.analysis import changepoint, significance, stats
from vmtax.analysis import summary as analysis
from vmtax.analysis.drift import host_of
from vmtax.analysis.differences import plan_changes, what_changed
from vmtax.core import workload as workloads
from vmtax.core.errors import VmtaxError
from vmtax.core.types import Metric
from vmtax.results.store import Store

NOTHING_CHANGED = "nothing recorded changed"
# The newest run is judged against at most this many runs before it.
NEWEST_AGAINST = 10
# Runs before the newest needed to estimate how much a point moves from run to run.
SPREAD_FROM = 3


@dataclass(frozen=True)
class SeriesRun:
    id: str
    number: int                       # 1-based position among all the host's runs of the name
    created: float
    host: str
    version: str
    plan: dict[str, Any]
    host_facts: dict[str, Any]
    targets: dict[str, dict[str, Any]]   # name -> {"kind", "fingerprint"}
    status: str = "done"                 # "interrupted": its points hold what it finished


@dataclass
class Point:
    run: SeriesRun
    values: list[float]               # the run's successful measured repetitions
    params: dict[str, Any]            # the workload's parameters in that run

    @functools.cached_property
    def median(self) -> float:
        return statistics.median(self.values)


@dataclass
class FoundChange:
    change: changepoint.Change
    before: SeriesRun                 # the last run of the segment before
    after: SeriesRun                  # the first run of the new one
    verdict: Literal["better", "worse"]
    what_changed: list[str]
    accepted: dict[str, Any] | None = None   # who accepted it and when, if anyone did


@dataclass(frozen=True)
class Recent:
    """The newest runs of a series against the runs before them in its segment, as
    `compare` judges two runs: a change too recent for detection to call. The runs judged
    are the newest alone, or, where the runs before it lay beyond the earlier runs' spread
    on the same side as it does, all of them since the first: a suspected change, held
    (and failing, if worse) until detection calls it, it recovers, or it is accepted. The
    spread comes from the runs before the first judged, never from those after it."""
    judged: list[Point]
    against: list[Point]
    comparison: stats.Comparison
    # Where the runs `against` let a run's median fall by chance, as changes (-0.1 = 10%
    # lower); None with fewer than SPREAD_FROM of them.
    spread: tuple[float, float] | None
    # The points of its segment before the judged ones, and how detection was asked to
    # call a change (for more_runs).
    before: int = 0
    alpha: float = 0.05
    permutations: int = changepoint.PERMUTATIONS

    @functools.cached_property
    def more_runs(self) -> int | None:
        """More runs like the judged ones before detection could call a clean step there
        (0: it could now, but the adjustment across series has not let it); None: not
        within HELD_AT_MOST more. Worked out when asked (a long series' test costs ~1 s):
        the text says it of a verdict, not of every series."""
        return next((more for more in range(HELD_AT_MOST + 1) if changepoint.calls(
            self.before, len(self.judged) + more, self.alpha,
            permutations=self.permutations)), None)

    @property
    def within_spread(self) -> bool:
        """Whether the judged runs lie where the runs before them let a run fall by chance:
        `compare` pools repetitions, so a host busier on one night than on another looks
        like a change to it; the spread of earlier runs' medians says how much that moves.
        A held change lies beyond it by what made it one."""
        if self.spread is None or len(self.judged) > 1:
            return False
        low, high = self.spread
        return low <= self.judged[0].median / _centre(self.against) - 1 <= high

    @property
    def verdict(self) -> str:
        """What text, JSON and the gate all say: compare's verdict, or "no verdict" where
        the run lies within the earlier runs' own spread."""
        if self.comparison.significant and self.within_spread:
            return "no verdict"
        return self.comparison.verdict

    @property
    def held(self) -> bool:
        return len(self.judged) > 1


@dataclass
class Series:
    host: str
    target: str
    workload: str
    config: dict[str, Any] | None     # the parameters, where a run had several configurations
    metric: str
    dimensions: dict[str, str]
    unit: str
    higher_is_better: bool
    points: list[Point]
    detection: changepoint.Detection | None = None
    changes: list[FoundChange] = field(default_factory=list)
    recent: Recent | None = None
    # The latest acceptance of the series' host after its last change point: the newest
    # runs are judged from the run it accepted on.
    accepted: dict[str, Any] | None = None
    accepted_from: int = 0            # the index of that run among the points
    note: str = ""                    # why no change was sought
    # Where the runs' plans asked differently for this series: (first run, what differs).
    plan_changes: list[tuple[SeriesRun, list[str]]] = field(default_factory=list)

    @property
    def label(self) -> str:
        dims = " ".join(f"{k}={v}" for k, v in self.dimensions.items())
        config = " ".join(f"{k}={v}" for k, v in (self.config or {}).items())
        return " · ".join(p for p in (self.target, " ".join(filter(None, (self.workload, config))),
                                      " ".join(filter(None, (self.metric, dims)))) if p)

    def regression(self) -> str | None:
        """Why the newest point lies in a worse segment than the one before it, or is
        itself worse than the runs before it (alone or with the runs a suspected change
        holds), not yet recovered nor accepted; None when it does not."""
        found = self._regressed()
        return found[0] if found else None

    @property
    def regressed_from(self) -> SeriesRun | None:
        """The run from which the series regressed: the one `--accept` takes."""
        found = self._regressed()
        return found[1] if found else None

    def _regressed(self) -> tuple[str, SeriesRun] | None:
        if self.changes:
            last = self.changes[-1]
            if last.verdict == "worse" and last.accepted is None:
                return (f"{_percent(last.change.change)} from run {last.after.number} "
                        f"({last.after.id}) on", last.after)
        recent = self.recent
        if recent is not None and recent.verdict == "worse":
            first = recent.judged[0].run
            return (f"{_percent(recent.comparison.change)} "
                    + (f"from run {first.number} ({first.id}) on" if recent.held else
                       f"at run {first.number} ({first.id})")
                    + f" against runs {recent.against[0].run.number}–"
                    f"{recent.against[-1].run.number} (not yet a change point)", first)
        return None

    def sides(self, found: FoundChange) -> tuple[list[Point], list[Point]]:
        """The segments on either side of one of the series' changes: what it compares."""
        bounds = [0, *(c.change.index for c in self.changes), len(self.points)]
        at = bounds.index(found.change.index)
        return (self.points[bounds[at - 1]:found.change.index],
                self.points[found.change.index:bounds[at + 1]])

    @property
    def segment_start(self) -> int:
        """The first point of the newest segment."""
        return self.changes[-1].change.index if self.changes else 0

    @property
    def judged_from(self) -> int:
        """The first point the newest runs are judged among: the newest segment's, or the
        run accepted after it."""
        return max(self.segment_start, self.accepted_from)


@dataclass
class Trend:
    name: str
    runs: dict[str, list[SeriesRun]]   # host -> its runs of the name, oldest first
    series: list[Series]
    alpha: float
    method: str
    notes: list[str] = field(default_factory=list)
    tests: int = 0                     # change-point tests the adjustment counted

    def regressions(self) -> list[tuple[Series, str]]:
        return [(s, why) for s in self.series if (why := s.regression()) is not None]


@dataclass(frozen=True)
class SeriesLevels:
    """What a trend's figure draws of a series: each run's median with its interval, and
    the median of each segment between change points."""
    points: list[stats.Summary]
    segments: list[float]


def levels(trend: Trend) -> list[SeriesLevels]:
    """Each series' levels, in the trend's order (computed for figures only: `vmtax trend`
    in the terminal needs none)."""
    found = []
    for s in trend.series:
        bounds = [0, *(c.change.index for c in s.changes), len(s.points)]
        found.append(SeriesLevels(
            [stats.summarize(p.values) for p in s.points],
            [stats.summarize([p.median for p in s.points[start:end]]).median
             for start, end in zip(bounds[:-1], bounds[1:])]))
    return found


def _centre(points: Sequence[Point]) -> float:
    """The geometric mean of points' medians."""
    return math.exp(statistics.fmean(math.log(p.median) for p in points))


def run_to_run_spread(points: Sequence[Point], alpha: float) -> tuple[float, float] | None:
    """The 1 - alpha prediction interval of one more run's median, from the medians of
    points (log-normal, Student's t), as changes from their geometric mean; None with too
    few points."""
    if len(points) < SPREAD_FROM:
        return None
    logs = [math.log(p.median) for p in points]
    k = len(logs)
    half = significance.t_isf(alpha / 2, k - 1) * statistics.stdev(logs) * math.sqrt(1 + 1 / k)
    return math.exp(-half) - 1, math.exp(half) - 1


def _percent(change: float) -> str:
    return f"{change:+.1%}"


def _runs(store: Store, name: str, since: float | None,
          until: float | None) -> dict[str, list[SeriesRun]]:
    found = store.named_runs(name)
    if not found:
        names = sorted(set(store.run_names().values()))
        raise VmtaxError(f"no runs named {name!r} in {store.path}; "
                         + (f"the names there: {', '.join(names)}" if names else
                            "no run there has a name (vmtax run --name NAME)"))
    per_host: dict[str, list[SeriesRun]] = defaultdict(list)
    numbers: dict[str, int] = defaultdict(int)   # a run keeps its number whatever is shown
    for r in found:
        host = host_of(r["host"])
        numbers[host] += 1
        if (since is not None and r["created"] < since) or (until is not None
                                                            and r["created"] > until):
            continue
        per_host[host].append(SeriesRun(r["id"], numbers[host], r["created"], host,
                                        r["version"], r["plan"], r["host"], r["targets"],
                                        r["status"]))
    if not per_host:
        raise VmtaxError(f"no run of {name!r} between the times given; its runs are "
                         f"{found[0]['id']} … {found[-1]['id']}")
    return dict(per_host)


def load(store: Store, name: str, *, since: float | None = None, until: float | None = None,
         targets: list[str] | None = None, metrics: list[str] | None = None) -> Trend:
    """The series of the runs named `name` (from `since` to `until`, seconds since the
    epoch), without judging them: each
    target × workload configuration × metric (headline metrics unless `metrics` names
    them) per host."""
    per_host = _runs(store, name, since, until)
    for n in {len(runs) for runs in per_host.values()}:
        changepoint.prepare(n)   # most series have a point in every run
    by_id = {r.id: r for runs in per_host.values() for r in runs}
    # (run, target, workload, params, metric, unit, higher is better, dimensions) -> values.
    read = (store.named_values(name, metrics) if metrics else
            store.named_values(name, pairs=_headlines(store.named_workloads(name))))
    values = {key: vals for key, vals in read.items()
              if key[0] in by_id and not (targets and key[1] not in targets)}
    configs: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    firsts: dict[tuple[str, str, str, str], str] = {}
    for run_id, target, workload, params, metric_name, *_ in values:
        configs[(run_id, target, workload)].add(params)
        firsts.setdefault((run_id, target, workload, params), metric_name)
    found: dict[tuple[str, str, str, str, str], Series] = {}
    headline = functools.cache(analysis.is_headline)
    # The same few parameter strings and metrics recur in every run: decoded once each
    # (each point still gets a dict of its own).
    decoded = functools.cache(json.loads)
    canonical = functools.cache(lambda params: json.dumps(json.loads(params), sort_keys=True))
    described = functools.cache(lambda name, unit, higher_is_better, dims: Metric(
        name, 0.0, unit, bool(higher_is_better), json.loads(dims)))
    for key, vals in values.items():
        run_id, target, workload, params = key[:4]
        metric = described(*key[4:])
        metric_key = metric.key
        wanted = (metric.name in metrics or metric_key in metrics if metrics else
                  headline(workload, metric.name, firsts[key[:4]]))
        if not wanted:
            continue
        run = by_id[run_id]
        # One configuration of the workload in the run: its parameters are what the run
        # measured, and may change from run to run (what changed says so); several: each
        # configuration is a series of its own.
        several = len(configs[key[:3]]) > 1
        series_key = (run.host, target, workload, canonical(params) if several else "null",
                      metric_key)
        if series_key not in found:
            found[series_key] = Series(run.host, target, workload,
                                       json.loads(params) if several else None, metric.name,
                                       dict(metric.dimensions), metric.unit,
                                       metric.higher_is_better, [])
        found[series_key].points.append(Point(run, vals, dict(decoded(params))))
    if (targets or metrics) and not found:
        asked = ([f"target {', '.join(targets)}"] if targets else []) + (
            [f"metric {', '.join(metrics)}"] if metrics else [])
        raise VmtaxError(f"no series of {name!r} has " + " and ".join(asked))
    series = sorted(found.values(), key=lambda s: (s.host, s.target, s.workload))
    for s in series:
        s.points.sort(key=lambda p: p.run.created)
    for s in series:
        s.plan_changes = [(after.run, lines) for before, after in zip(s.points, s.points[1:])
                          if (lines := plan_changes(before, after, s.target, s.workload))]
    trend = Trend(name, per_host, series, alpha=0.05, method="bh")
    trend.notes = (_overlap_notes(name, per_host, configs) + _plan_notes(name, series)
                   + _interrupted_notes(name, per_host))
    return trend


def _plan_notes(name: str, series: list[Series]) -> list[str]:
    """Per host whose runs' plans asked differently part-way: from which run, what (and how
    many series it bears on), so no view mixes them silently."""
    found: dict[str, dict[tuple[int, str, str], int]] = defaultdict(dict)
    for s in series:
        for run, lines in s.plan_changes:
            for line in lines:
                key = (run.number, run.id, line)
                found[s.host][key] = found[s.host].get(key, 0) + 1
    notes = []
    for host, changes in found.items():
        shown = [f"from run {number} ({run_id}) on, {line}"
                 + (f" ({count} series)" if count > 1 else "")
                 for (number, run_id, line), count in sorted(changes.items())]
        notes.append(f"the runs of {name} on {host} differ in their plans: "
                     + "; ".join(shown[:6]) + (f"; and {len(shown) - 6} more" if len(shown) > 6
                                               else "")
                     + ": a series mixes what they measured from there on")
    return notes


def _headlines(workload_names: list[str]) -> set[tuple[str, str]] | None:
    """(workload, metric) of these workloads' headline metrics, to read no other; None
    (read all) when one has no declared headline (a plugin not installed here: its first
    metric)."""
    pairs = set()
    for workload in workload_names:
        found = workloads.manifest(workload)   # from the plugin index: no plugin imported
        primary = {spec.name for spec in found.metrics if spec.primary} if found else set()
        if not primary and not workload.endswith((" (host)", " prepare")):
            return None
        pairs |= {(workload, metric) for metric in primary}
    return pairs


def _interrupted_notes(name: str, per_host: dict[str, list[SeriesRun]]) -> list[str]:
    """The runs that were interrupted: their points hold only what they finished."""
    cut = [f"run {r.number} ({r.id})" for runs in per_host.values() for r in runs
           if r.status == "interrupted"]
    return [f"interrupted, so of what they finished only (`vmtax run --resume ID` finishes "
            f"one): {', '.join(cut[:5])}{' …' if len(cut) > 5 else ''} of {name}"] if cut else []


def _overlap_notes(name: str, per_host: dict[str, list[SeriesRun]],
                   configs: dict[tuple[str, str, str], set[str]]) -> list[str]:
    """Per host whose runs' plans differ: which target × workload ran in only some runs."""
    notes = []
    for host, runs in per_host.items():
        present: dict[str, int] = defaultdict(int)
        ids = {r.id for r in runs}
        for run_id, target, workload in configs:
            if run_id in ids:
                present[f"{target} · {workload}"] += 1
        partial = [f"{cell} in {count} of {len(runs)}" for cell, count in present.items()
                   if count < len(runs)]
        if partial:
            shown = ", ".join(partial[:4]) + (f" and {len(partial) - 4} more"
                                               if len(partial) > 4 else "")
            notes.append(f"the runs of {name} on {host} differ in what they ran ({shown}); "
                         "each series is judged over the runs that have it")
    return notes


def judge(trend: Trend, *, alpha: float = 0.05, noise_floor: float = 0.02,
          method: Literal["bh", "holm"] = "bh",
          accepted: Sequence[dict[str, Any]] = ()) -> Trend:
    """Change points of every series (adjusted across all of them), what changed at each,
    and the newest point of each against the rest of its segment."""
    trend.alpha, trend.method = alpha, method
    analysed = []
    for s in trend.series:
        if any(p.median <= 0 for p in s.points):
            s.note = "a point's median is 0 or less: no change is sought in it"
            continue
        analysed.append(s)
    detections = changepoint.detect_many([[p.median for p in s.points] for s in analysed],
                                         alpha=alpha, noise_floor=noise_floor)
    for s, detection in zip(analysed, detections):
        s.detection = detection
    adjusted = changepoint.adjust([s.detection for s in analysed if s.detection], alpha, method)
    trend.tests = sum(len(d.p_values) for d in adjusted)
    for s, detection in zip(analysed, adjusted):
        s.detection = detection
        s.changes = [_found(s, c, accepted) for c in detection.changes]
    _judge_newest(analysed, alpha, noise_floor, method, accepted)
    return trend


def _acceptance(accepted: Sequence[dict[str, Any]], run: SeriesRun) -> dict[str, Any] | None:
    """The latest acceptance that covers run: one of its host's, made at run or later."""
    covering = [a for a in accepted if a["host"] == run.host and a["created"] >= run.created]
    return covering[-1] if covering else None


def _found(s: Series, change: changepoint.Change,
           accepted: Sequence[dict[str, Any]]) -> FoundChange:
    before, after = s.points[change.index - 1], s.points[change.index]
    worse = (change.ratio < 1) == s.higher_is_better
    return FoundChange(change, before.run, after.run, "worse" if worse else "better",
                       what_changed(before, after, s.target, s.workload),
                       _acceptance(accepted, after.run) if worse else None)


def _judge_newest(analysed: list[Series], alpha: float, noise_floor: float,
                  method: Literal["bh", "holm"], accepted: Sequence[dict[str, Any]]) -> None:
    """The newest runs of each series against the runs before them (Recent), all judged
    together as `compare` judges metrics."""
    found = []
    for s in analysed:
        start, newest = s.points[s.segment_start].run.created, s.points[-1].run.created
        mine = [a for a in accepted
                if a["host"] == s.host and start <= a["created"] <= newest]
        if mine:
            s.accepted = max(mine, key=lambda a: (a["created"], a["at"]))
            s.accepted_from = next(i for i, p in enumerate(s.points)
                                   if p.run.created >= s.accepted["created"])
        if len(s.points) - s.judged_from >= 2:
            found.append((s, *_recent_split(s.points[s.judged_from:], alpha, noise_floor)))
    if not found:
        return
    pairs = [(s.label, [v for p in against for v in p.values],
              [v for p in judged for v in p.values], s.higher_is_better)
             for s, judged, against, _ in found]
    specs = [analysis.metric_spec(s.workload, s.metric) for s, *_ in found]
    comparisons = stats.compare_many(pairs, alpha=alpha, noise_floor=noise_floor,
                                     method=method,
                                     resolutions=[sp.resolution if sp else None for sp in specs])
    for (s, judged, against, spread), c in zip(found, comparisons):
        assert s.detection is not None
        s.recent = Recent(judged, against, c, spread,
                          len(s.points) - len(judged) - s.segment_start, alpha,
                          s.detection.permutations)


# Runs after a suspected change the newest-run rule holds together, at most: a step older
# than that, with SPREAD_FROM runs before it, detection has the runs to call (a lone step
# among the 15 series of the classic plan, 3 runs against 20: p <= 0.002 each, 0.03
# adjusted).
HELD_AT_MOST = 2 * NEWEST_AGAINST


def _recent_split(segment: list[Point], alpha: float, noise_floor: float
                  ) -> tuple[list[Point], list[Point], tuple[float, float] | None]:
    """Of a segment's points (two or more): the newest runs to judge, the runs to judge
    them against (at most NEWEST_AGAINST, just before them), and those runs' spread. The
    longest tail whose every run lies beyond the spread of the runs before it, all on one
    side and past the noise floor, is a suspected change held together; else the newest
    alone."""
    logs = [math.log(p.median) for p in segment]
    for held in range(min(HELD_AT_MOST, len(segment) - SPREAD_FROM), 0, -1):
        start = len(segment) - held
        against = segment[max(0, start - NEWEST_AGAINST):start]
        spread = run_to_run_spread(against, alpha)
        assert spread is not None
        centre = math.log(_centre(against))
        low = centre + math.log1p(min(spread[0], -noise_floor))
        high = centre + math.log1p(max(spread[1], noise_floor))
        tail = logs[start:]
        if max(tail) < low or min(tail) > high:
            return segment[start:], against, spread
    against = segment[max(0, len(segment) - 1 - NEWEST_AGAINST):-1]
    return segment[-1:], against, run_to_run_spread(against, alpha)


def to_json(trend: Trend) -> dict[str, Any]:
    def run(r: SeriesRun) -> dict[str, Any]:
        return {"id": r.id, "number": r.number, "created": r.created}

    def change(c: FoundChange) -> dict[str, Any]:
        ch = c.change
        return {"index": ch.index, "before_run": run(c.before), "after_run": run(c.after),
                "median_before": ch.before, "median_after": ch.after, "change": ch.change,
                "ci": [ch.ci[0] - 1, ch.ci[1] - 1], "p_value": ch.p_value,
                "p_adjusted": ch.p_adjusted, "verdict": c.verdict,
                "what_changed": c.what_changed, "accepted": c.accepted}

    return {
        "name": trend.name, "alpha": trend.alpha, "method": trend.method,
        "tests": trend.tests, "notes": trend.notes,
        "hosts": {h: [run(r) for r in runs] for h, runs in trend.runs.items()},
        "series": [{
            "host": s.host, "target": s.target, "workload": s.workload, "config": s.config,
            "metric": s.metric, "dimensions": s.dimensions, "unit": s.unit,
            "higher_is_better": s.higher_is_better,
            "points": [{**run(p.run), "median": p.median, "values": p.values}
                       for p in s.points],
            "points_needed": s.detection.points_needed if s.detection else None,
            "changes": [change(c) for c in s.changes],
            "plan_changes": [{"run": run(r), "what": lines} for r, lines in s.plan_changes],
            "newest": None if s.recent is None else {
                "verdict": s.recent.verdict, "runs": [run(p.run) for p in s.recent.judged],
                "against_runs": [run(p.run) for p in s.recent.against],
                "held": s.recent.held, "change": s.recent.comparison.change,
                "ci": list(s.recent.comparison.change_ci),
                "interval": s.recent.comparison.interval,
                "p_adjusted": s.recent.comparison.p_adjusted,
                "run_to_run_spread": None if s.recent.spread is None else list(s.recent.spread),
                "within_run_to_run_spread": s.recent.within_spread},
            "accepted": s.accepted,
            "regression": s.regression(),
            "regressed_from": None if (r := s.regressed_from) is None else run(r),
            "note": s.note} for s in trend.series],
    }
