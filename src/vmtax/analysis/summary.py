"""From stored repetitions to the numbers people read: per workload metric and target,
the median with its confidence interval, the ratio to the baseline, and sanity flags.

Every view (terminal table, --json, HTML report) is built from `summarize_run`, so they
always agree.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from vmtax.analysis import stats
from vmtax.core import collector as collectors
from vmtax.core import workload as workloads
from vmtax.core.errors import VmtaxError
from vmtax.core.types import Metric, MetricSpec
from vmtax.results.store import Rep, Run

NOISY_CV = 0.05
# The status of a collector's record that could not be made (not a failed repetition).
UNAVAILABLE = "unavailable"
CLOCK_TOLERANCE = 0.02
# Seconds of disagreement that are channel jitter, not drift: a job's host<->guest round
# trip varied by 20-60 ms on a loaded 2-core host under TCG. Drift grows with a job's
# length, jitter does not, so only differences beyond both this and 2% are flagged.
CLOCK_SLACK = 0.05
# Repetitions shorter than this (median host time, s) are flagged "too short", as hyperfine
# warns of very short commands: start-up, a VM's job round trip (~0.4 s), timer
# resolution and scheduling then weigh as much as the work (E1's 1 GiB memory run: 47 ms
# natively, and two identical runs differed by 25%).
MIN_DURATION = 1.0
TOO_SHORT = "too short"
BELOW_RESOLUTION = "below resolution"


@dataclass
class Cell:
    n: int                                  # successful measured repetitions
    failed: int                             # failed or timed-out repetitions (excluded)
    summary: stats.Summary | None = None
    ratio: stats.RatioSummary | None = None
    flags: list[str] = field(default_factory=list)
    duration: float | None = None           # median host time of its repetitions, s
    values: list[float] = field(default_factory=list)   # each repetition's, as measured
    # Why the cell has no ratio although both medians exist: "below resolution" when its
    # median or the baseline's is at or below the resolution the tool prints it in.
    no_ratio: str | None = None
    # Why a collector recorded nothing on this target ("host-cpu: unavailable — ..."):
    # no repetition failed, there was nothing it could observe.
    not_recorded: str | None = None


@dataclass
class Row:
    workload: str
    params: dict[str, Any]                  # the parameters that vary within the run
    metric: str                             # the name, without its dimensions, which
    dimensions: dict[str, str]              # tell rows of one metric apart: {"percentile": "99"}
    unit: str
    higher_is_better: bool
    cells: dict[str, Cell]                  # target -> cell
    # Set by summarize_run from the workload's manifest, so a view reads them off the row:
    # shown only on request (a fixed time's total, a fairness spread; is_secondary), and
    # its workload configuration's headline (headline()).
    secondary: bool = False
    headline: bool = False

    @property
    def key(self) -> str:
        """The metric with its dimensions, as stored flags name it: `IOPS[job=randread]`."""
        return Metric(self.metric, 0.0, self.unit, self.higher_is_better, self.dimensions).key

    @property
    def label(self) -> str:
        """How tables name it: `IOPS job=randread`."""
        dims = " ".join(f"{k}={v}" for k, v in self.dimensions.items())
        return f"{self.metric} {dims}" if dims else self.metric


@dataclass
class RunSummary:
    run_id: str
    baseline: str
    targets: list[str]
    rows: list[Row]
    failures: list[dict[str, Any]]          # one per failed repetition: where and why
    # What could not be recorded and why ("host-cpu: unavailable — ..."), once each.
    notes: list[str] = field(default_factory=list)
    # The baseline ran on the bare host: beating it is suspicious (vmtax.analysis.composite).
    baseline_bare_host: bool = False

    def to_json(self) -> dict[str, Any]:
        # A row's secondary and headline marks are the manifest's, which a reader of the
        # JSON has: the document is the rows' measurements.
        doc = asdict(self)
        for row in doc["rows"]:
            del row["secondary"], row["headline"]
        return doc


def _varying(reps: list[Rep]) -> set[str]:
    """Parameter names whose value differs between configurations of the same workload."""
    values: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in reps:
        for k, v in r.params.items():
            values[(r.workload, k)].add(json.dumps(v))
    return {k for (_, k), vs in values.items() if len(vs) > 1}


def _why_unavailable(error: str | None) -> str:
    """"host-cpu: unavailable — WHY" as stored: the why."""
    return (error or "").partition(" — ")[2] or error or "unavailable"


def _not_recorded(reps: list[Rep], metric: str) -> str | None:
    """Why the collector that records metric recorded nothing on these repetitions (a
    cell's collectors each store their own): the why of that collector's unavailable
    repetition, not another collector's."""
    unavailable = [r for r in reps if r.status == UNAVAILABLE]
    if not unavailable:   # the usual case, without loading every collector
        return None
    owners = {name for name, found in collectors.manifests().items() if found.metric_spec(metric)}
    if owners:   # else a collector no longer installed: any reason is better than none
        unavailable = [r for r in unavailable if (r.error or "").partition(":")[0] in owners]
    return next((_why_unavailable(r.error) for r in unavailable), None)


def _clock_skewed(reps: list[Rep], overhead: float) -> bool:
    """Did the guest's clock disagree with the host's on any repetition? `overhead` is the
    target's measured fixed cost of a job round trip (fingerprint job_overhead_s)."""
    return any(stats.clock_skew(r.host_elapsed, r.guest_elapsed, CLOCK_TOLERANCE,
                                overhead, CLOCK_SLACK)
               for r in reps if r.guest_elapsed is not None and r.host_elapsed)


def metric_spec(workload: str, metric: str) -> MetricSpec | None:
    """What the workload's manifest says of a metric; None for one it does not declare (a
    run stored by an older vmtax, a plugin not installed here)."""
    found = workloads.manifest(workload.removesuffix(" prepare"))
    return found.metric_spec(metric) if found is not None else None


def _not_results() -> set[str]:
    """Collectors' metrics that are breakdowns (a profile's stacks) or bookkeeping (its
    unresolved share, its own overhead): not results of a target, so not summarized."""
    return {spec.name for found in collectors.manifests().values() for spec in found.metrics
            if spec.breakdown or spec.bookkeeping}


def is_secondary(workload: str, metric: str) -> bool:
    """A metric shown only on request: a total a fixed time sets, a fairness spread."""
    spec = metric_spec(workload, metric)
    return spec is not None and spec.secondary


def headline(rows: list[Row]) -> list[Row]:
    """The rows a summary shows: per workload configuration its primary metric (every
    dimension of it); a workload whose manifest is unknown here (a plugin not installed)
    its first metric. Collectors' rows and prepare steps are context, not a headline."""
    firsts: dict[tuple[str, str], str] = {}
    for row in rows:
        firsts.setdefault((row.workload, json.dumps(row.params, sort_keys=True)), row.metric)
    return [row for row in rows if is_headline(
        row.workload, row.metric, firsts[(row.workload, json.dumps(row.params, sort_keys=True))])]


def is_headline(workload: str, metric: str, first: str) -> bool:
    """Whether a metric is its workload's headline (see headline); `first` is the first
    metric the workload's configuration recorded."""
    if workload.endswith((" (host)", " prepare")):
        return False
    found = workloads.manifest(workload)
    if found is None or not any(s.primary for s in found.metrics):
        return metric == first
    spec = found.metric_spec(metric)
    return spec is not None and spec.primary


# The classes of performance that verdicts are given for, in the order they are shown; a
# metric joins the class its workload's manifest names (`MetricSpec.group`).
CLASS_ORDER = ["CPU", "memory", "disk I/O", "network", "threads/scheduling", "latency"]


def _is_spread(workload: str, metric: str) -> bool:
    spec = metric_spec(workload, metric)
    return spec is not None and spec.spread


def _resolution(workload: str, metric: str) -> float | None:
    spec = metric_spec(workload, metric)
    return spec.resolution if spec is not None else None


def _workload_flags(workload: str, metric_key: str, reps: list[Rep]) -> list[str]:
    """Flags a workload raises on a cell itself (Workload.cell_flags), from the metrics of
    its successful repetitions; none on a collector's or a prepare step's row, or for a
    workload not installed here."""
    found = workloads.manifest(workload)
    if found is None or "cell_flags" not in found.hooks:
        return []
    return workloads.get(workload).cell_flags(metric_key,
                                              [r.metrics for r in reps if r.status == "ok"])


def _duration(reps: list[Rep]) -> float | None:
    """Median host time of the successful repetitions; None when none was timed."""
    times = [r.host_elapsed for r in reps if r.status == "ok" and r.host_elapsed is not None]
    return statistics.median(times) if times else None


def summarize_run(run: Run, baseline: str | None = None,
                  min_duration: float = MIN_DURATION) -> RunSummary:
    target_names = list(run.plan.get("targets") and [t["name"] for t in run.plan["targets"]]
                        or run.targets)
    baseline = baseline or run.plan.get("baseline") or target_names[0]
    # A collector's metrics (phase "collect") are a row of their own under the workload.
    measured = [r for r in run.reps if r.phase in ("measure", "prepare", "collect")]
    # The bare host, or a lab's own system (a TCG guest: beating it is as suspicious).
    base_fingerprint = run.targets.get(baseline, {}).get("fingerprint", {})
    baseline_bare_host = bool(base_fingerprint.get("bare_host")
                              or base_fingerprint.get("lab_host"))
    # Adaptive runs promised a precision: say where it was missed.
    ci_target = run.plan.get("ci_target") if run.plan.get("max_runs") else None
    varying = _varying(measured)

    # (workload, params key) -> target -> reps, in the order configurations were first seen
    groups: dict[tuple[str, str], dict[str, list[Rep]]] = {}
    for r in measured:
        shown = {k: v for k, v in r.params.items() if k in varying}
        key = (r.workload + {"prepare": " prepare", "collect": " (host)"}.get(r.phase, ""),
               json.dumps(shown, sort_keys=True))
        groups.setdefault(key, defaultdict(list))[r.target].append(r)

    # Only collectors' rows have breakdowns or bookkeeping: a run without any need not load
    # them.
    not_results = _not_results() if any(r.phase == "collect" for r in measured) else set()
    rows: list[Row] = []
    for (workload, shown_key), by_target in groups.items():
        # metric key -> its first value seen, for the name, dimensions, unit and direction
        metrics: dict[str, Metric] = {}
        for reps in by_target.values():
            for r in reps:
                for m in r.metrics:
                    if not (r.phase == "collect" and m.name in not_results):
                        metrics.setdefault(m.key, m)
        # The clock check is about a target's repetitions, whatever the metric.
        skewed = {t: _clock_skewed(reps, run.targets.get(t, {}).get("fingerprint", {})
                                   .get("job_overhead_s") or 0.0)
                  for t, reps in by_target.items()}
        durations = {t: _duration(reps) for t, reps in by_target.items()}
        manifest = workloads.manifest(workload)
        shortest = (manifest.min_duration if manifest and manifest.min_duration is not None
                    else min_duration)
        for metric_key, metric in metrics.items():
            hib = metric.higher_is_better
            spread = _is_spread(workload, metric.name)
            resolution = _resolution(workload, metric.name)
            secondary = is_secondary(workload, metric.name)
            samples = {t: [m.value for r in reps if r.status == "ok"
                           for m in r.metrics if m.key == metric_key]
                       for t, reps in by_target.items()}
            base = samples.get(baseline)
            base_median = statistics.median(base) if base else 0.0
            base_below = bool(base) and resolution is not None and base_median <= resolution
            cells = {}
            for t in target_names:
                reps = by_target.get(t, [])
                if not reps:
                    continue
                cell = Cell(n=len(samples[t]),
                            failed=sum(r.status not in ("ok", UNAVAILABLE) for r in reps),
                            duration=durations[t], values=samples[t],
                            not_recorded=_not_recorded(reps, metric.name))
                below = False
                if samples[t]:
                    cell.summary = stats.summarize(samples[t])
                    # Values in the tool's last printed digit: their spread and their
                    # ratios are rounding, so no flag or ratio is derived from them.
                    below = resolution is not None and cell.summary.median <= resolution
                    if below or (t != baseline and base_below):
                        cell.no_ratio = BELOW_RESOLUTION
                    # Noise in a secondary metric (a fixed time's total) misleads nobody.
                    if (not below and not secondary
                            and stats.noisy(cell.summary, NOISY_CV)):
                        cell.flags.append("noisy")
                    if (ci_target and cell.summary.median and not below
                            and not stats.precise_enough(samples[t], ci_target)):
                        cell.flags.append(f"CI wider than ±{ci_target:.0%}")
                if (t != baseline and cell.summary is not None and base
                        and base_median and cell.summary.median and cell.no_ratio is None):
                    # A ratio to or of a zero median (a stddev of 0) says nothing.
                    cell.ratio = stats.ratio(samples[t], base, hib)
                    # Beating the bare host is suspicious (clock drift, page cache);
                    # beating another target (E5's huge pages) is the finding itself.
                    if (baseline_bare_host and not spread and stats.faster_than_baseline(
                            cell.ratio, len(samples[t]), len(base))):
                        cell.flags.append("faster than baseline")
                if t != baseline and cell.summary is not None and cell.ratio is None \
                        and cell.no_ratio is None:
                    # Never the raw median where a ratio belongs: say why there is none.
                    # (base == []: the baseline has repetitions, none with this metric)
                    unrecorded = base == [] and all(r.status == UNAVAILABLE
                                                    for r in by_target[baseline])
                    cell.no_ratio = (f"no ratio: not recorded on {baseline}" if unrecorded else
                                     f"no ratio: {baseline} failed" if base == [] else
                                     f"no ratio: not run on {baseline}" if base is None else
                                     "no ratio: a median of 0")
                if cell.duration is not None and cell.duration < shortest:
                    cell.flags.append(TOO_SHORT)
                if skewed[t]:
                    cell.flags.append("clock skew")
                cell.flags += _workload_flags(workload, metric_key, reps)
                cells[t] = cell
            rows.append(Row(workload, json.loads(shown_key), metric.name,
                            dict(metric.dimensions), metric.unit, hib, cells,
                            secondary=secondary))
    for row in headline(rows):
        row.headline = True

    failures = [{"target": r.target, "workload": r.workload, "params": r.params,
                 "phase": r.phase, "idx": r.idx, "status": r.status, "error": r.error}
                for r in run.reps if r.status not in ("ok", UNAVAILABLE)]
    notes = [f"{r.target} · {r.workload}: {r.error}" for r in run.reps
             if r.status == UNAVAILABLE]
    return RunSummary(run.id, baseline, target_names, rows, failures,
                      list(dict.fromkeys(notes)), baseline_bare_host)


@dataclass
class CompareRow:
    a: str                                  # "RUN:TARGET" of side A
    b: str
    workload: str
    params: dict[str, Any]                  # A's parameters
    params_b: dict[str, Any]                # B's (differ when one configuration each was run)
    metric: str
    dimensions: dict[str, str]
    unit: str
    failed_a: int                           # failed repetitions excluded on each side
    failed_b: int
    comparison: stats.Comparison


# (workload, params as JSON, metric key) -> (values, the first of them as a Metric).
_Samples = dict[tuple[str, str, str], tuple[list[float], Metric]]


def _samples(run: Run, target: str) -> tuple[_Samples, dict[tuple[str, str], int]]:
    """(workload, params, metric key) -> (values, the first of them as a Metric: name,
    dimensions, unit, direction) of a target's successful measured repetitions, and failed
    repetitions per (workload, params)."""
    values: _Samples = {}
    failed: dict[tuple[str, str], int] = defaultdict(int)
    for r in run.reps:
        if r.target != target or r.phase != "measure":
            continue
        key = (r.workload, json.dumps(r.params, sort_keys=True))
        if r.status != "ok":
            failed[key] += 1
            continue
        for m in r.metrics:
            values.setdefault((*key, m.key), ([], m))[0].append(m.value)
    return values, failed


def _match_configs(a_values: _Samples, b_values: _Samples) -> dict[tuple[str, str, str],
                                                                   tuple[str, str, str]]:
    """A's (workload, params, metric key) keys -> B's. Same parameters match; a workload run
    with exactly one configuration on each side matches even if its parameters differ
    (e.g. cpu-max-prime 2000 vs 2100: the change is what is being measured)."""
    def configs(values: _Samples) -> dict[str, set[str]]:
        out: dict[str, set[str]] = defaultdict(set)
        for workload, params, _ in values:
            out[workload].add(params)
        return out
    a_configs, b_configs = configs(a_values), configs(b_values)
    matched = {}
    for key in a_values:
        workload, params, metric = key
        if key in b_values:
            matched[key] = key
        elif len(a_configs[workload]) == 1 and len(b_configs.get(workload, ())) == 1:
            other = (workload, next(iter(b_configs[workload])), metric)
            if other in b_values:
                matched[key] = other
    return matched


def compare_targets(pairs: list[tuple[Run, str, Run, str]], alpha: float = 0.01,
                    noise_floor: float = 0.02,
                    method: Literal["holm", "bh"] = "bh") -> list[CompareRow]:
    """B against A for every metric the two sides of each pair share, judged together
    (p-values adjusted across all of them)."""
    rows: list[tuple[str, str, tuple[str, str, str], Metric, list[float], list[float], int,
                     int, str]] = []
    for run_a, target_a, run_b, target_b in pairs:
        a_values, a_failed = _samples(run_a, target_a)
        b_values, b_failed = _samples(run_b, target_b)
        b_keys = _match_configs(a_values, b_values)
        for key in a_values:   # in the order they were measured
            if key not in b_keys:
                continue
            (va, metric), (vb, _) = a_values[key], b_values[b_keys[key]]
            rows.append((f"{run_a.id}:{target_a}", f"{run_b.id}:{target_b}", key, metric,
                         va, vb, a_failed.get(key[:2], 0), b_failed.get(b_keys[key][:2], 0),
                         b_keys[key][1]))
    if not rows:
        raise VmtaxError("nothing to compare: the two sides have no metric in common "
                         "(same workload with the same parameters, at least one successful "
                         "run each)")
    comparisons = stats.compare_many(
        [(key[2], va, vb, metric.higher_is_better) for _, _, key, metric, va, vb, *_ in rows],
        alpha=alpha, noise_floor=noise_floor, method=method,
        resolutions=[_resolution(key[0], metric.name) for _, _, key, metric, *_ in rows])
    return [CompareRow(a, b, workload, json.loads(params), json.loads(params_b), metric.name,
                       dict(metric.dimensions), metric.unit, fa, fb, c)
            for (a, b, (workload, params, _), metric, _, _, fa, fb, params_b), c
            in zip(rows, comparisons)]
