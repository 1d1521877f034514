"""The statistics of `vmtax tune`: the racing rule that decides which knob values still need
repetitions, the final verdicts adjusted over every comparison of the search, what the
singles predict for their combination, and the tax a configuration recovers.

Every comparison is analysis.stats' (compare, compare_many): a candidate is target B, the
configuration it is measured against is A. An effect is a *gain*: the change in the
metric's better direction (+10% is 10% faster whether the metric is a rate or a time).

The racing rule, for a pair (reference, candidate) with at least `min_runs` a side:
  * decided "better" or "worse": stats.compare calls it so at alpha / tests (Bonferroni
    over the whole search, so the adjusted verdict at the end rarely overturns it);
  * decided "no gain": the (1 - alpha) CI of the gain lies below +noise_floor, so the
    candidate cannot turn out a win worth having (worse, or equal within the floor);
  * else "open": it gets another repetition, as its reference does, while time is left.
Stopping early can only cost power, never add false calls: the verdicts reported are
compare_many's over all the repetitions stored, adjusted (Holm or BH) across the search.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

from vmtax.analysis import stats
from vmtax.core import blas, plugin
from vmtax.core import target as targets
from vmtax.core import workload as workloads
from vmtax.results.store import Run

with blas.one_thread():   # numpy without OpenBLAS's spinning threads
    import numpy as np

State = Literal["open", "better", "worse", "no gain"]
Method = Literal["holm", "bh"]


@dataclass(frozen=True)
class Gain:
    """A change oriented so that positive is better, with its CI."""
    value: float
    low: float
    high: float

    @classmethod
    def of(cls, comparison: stats.Comparison) -> "Gain":
        low, high = comparison.change_ci
        if comparison.higher_is_better:
            return cls(comparison.change, low, high)
        # A time 10% lower is a 10% gain (in the change's own terms).
        return cls(-comparison.change, -high, -low)


@dataclass(frozen=True)
class RaceRule:
    alpha: float = 0.01
    noise_floor: float = 0.02
    tests: int = 1        # comparisons the whole search makes
    min_runs: int = 3

    def state(self, reference: Sequence[float], candidate: Sequence[float],
              higher_is_better: bool) -> State:
        if min(len(reference), len(candidate)) < self.min_runs:
            return "open"
        strict = stats.compare(reference, candidate, higher_is_better,
                               alpha=self.alpha / self.tests, noise_floor=self.noise_floor,
                               n_boot=2000)
        if strict.verdict in ("better", "worse"):
            return strict.verdict
        loose = stats.compare(reference, candidate, higher_is_better, alpha=self.alpha,
                              noise_floor=self.noise_floor, n_boot=2000)
        if Gain.of(loose).high < self.noise_floor:
            return "no gain"
        return "open"


def race(values: dict[str, list[float]], pairs: Sequence[tuple[str, str]],
         higher_is_better: bool, rule: RaceRule, measure: Callable[[str], float | None],
         max_runs: int, time_left: Callable[[], bool]) -> dict[tuple[str, str], State]:
    """Repetitions, one round at a time, for the targets of the pairs still open, until none
    is, each has had max_runs attempts, or time_left() says stop. measure(name) runs one
    repetition and gives its primary value (None: it failed). values (name -> values so
    far, e.g. the fixed first runs) grows in place; the rounds alternate their order (A B,
    B A) so drift cancels. Returns each pair's last state."""
    attempts = {name: len(values.setdefault(name, [])) for pair in pairs for name in pair}
    rounds = 0
    while True:
        states = {pair: rule.state(values[pair[0]], values[pair[1]], higher_is_better)
                  for pair in pairs}
        wanted = list(dict.fromkeys(name for pair, state in states.items() if state == "open"
                                    for name in pair if attempts[name] < max_runs))
        if not wanted or not time_left():
            return states
        for name in wanted if rounds % 2 else reversed(wanted):
            value = measure(name)
            attempts[name] += 1
            if value is not None:
                values[name].append(value)
        rounds += 1


def judge(pairs: Sequence[tuple[str, Sequence[float], Sequence[float], bool]],
          alpha: float = 0.01, noise_floor: float = 0.02,
          method: Method = "holm") -> list[stats.Comparison]:
    """The verdict of every (label, reference, candidate, higher_is_better), adjusted across
    all of them; pairs with fewer than 2 values a side get no test (verdict 'too few runs')."""
    testable = [i for i, p in enumerate(pairs) if min(len(p[1]), len(p[2])) >= 2]
    judged = stats.compare_many([pairs[i] for i in testable], alpha=alpha,
                                noise_floor=noise_floor, method=method) if testable else []
    out: list[stats.Comparison] = []
    by_index = dict(zip(testable, judged))
    for i, (label, a, b, hib) in enumerate(pairs):
        if i in by_index:
            out.append(by_index[i])
        else:
            out.append(stats.Comparison(
                name=label, median_a=math.nan, median_b=math.nan, change=math.nan,
                change_ci=(math.nan, math.nan), p_value=1.0, p_adjusted=1.0,
                verdict="too few runs", higher_is_better=hib, n_a=len(a), n_b=len(b),
                min_p=1.0, note="fewer than 2 successful repetitions a side"))
    return out


def predicted(gains: Sequence[float]) -> float:
    """What independent knobs' gains give together: speed-ups multiply."""
    return math.prod(1 + g for g in gains) - 1


def interaction(observed: Gain, singles: Sequence[float]) -> str | None:
    """A sentence when the combination's CI excludes what its singles predict."""
    expected = predicted(singles)
    if observed.low <= expected <= observed.high or math.isnan(observed.value):
        return None
    how = "more" if observed.value > expected else "less"
    return (f"the combination gains {observed.value:+.1%} (CI {observed.low:+.1%} to "
            f"{observed.high:+.1%}), {how} than its singles predict ({expected:+.1%}): "
            "the knobs interact")


def tax_recovered(baseline: float, tuned: float, native: float) -> float | None:
    """(tuned - baseline) / (native - baseline): 1 is all of the tax won back, 0 none,
    negative a loss; None when the baseline pays no tax to recover."""
    tax = native - baseline
    if tax == 0 or any(math.isnan(v) for v in (baseline, tuned, native)):
        return None
    return (tuned - baseline) / tax


# --- a stored search, summarized -----------------------------------------------------------

CONTROL = "control"
TUNED = "tuned"


def show(value: Any) -> str:
    """A value as TOML writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(map(show, value)) + "]"
    return json.dumps(value) if isinstance(value, str) else str(value)


def show_value(value: Any) -> str:
    """A knob's value as the user writes it after `=`: q35, 4, 0-1, mitigations=off."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(map(show_value, value))
    return str(value)


def knob_label(option: str, value: Any) -> str:
    return f"{option}={show_value(value)}"


def knob_name(baseline: str, option: str, value: Any) -> str:
    return f"{baseline}[{knob_label(option, value)}]"


def control_name(baseline: str) -> str:
    return f"{baseline}[{CONTROL}]"


def tuned_name(baseline: str) -> str:
    return f"{baseline}[{TUNED}]"


def is_tune_run(run: Run) -> bool:
    return str(run.plan.get("name") or "").startswith("tune-")


@dataclass
class SearchOutline:
    """What a checked search would try, against what, within what time (`tune --dry-run`);
    vmtax.studies.tune.Search.outline() makes it."""
    baseline: str
    kind: str
    workloads: list[str]
    native: str | None              # the bare host measured for the tax recovered
    knobs: list[tuple[str, str | None]]   # (knob=value, its safety note)
    budget: str                     # "6 min 0 s"
    needs: str                      # what one comparison of each costs, said alike
    notes: list[str]


@dataclass
class Effect:
    """One knob value (or the combination) against its reference on one workload."""
    workload: str
    params: dict[str, Any]
    metric: str
    group: str                  # class of work: CPU, memory, disk I/O, network (else other)
    comparison: stats.Comparison

    @property
    def gain(self) -> Gain:
        return Gain.of(self.comparison)

    def to_json(self) -> dict[str, Any]:
        c, g = self.comparison, self.gain
        return {"workload": self.workload, "params": self.params, "metric": self.metric,
                "class": self.group, "gain": _num(g.value), "ci": [_num(g.low), _num(g.high)],
                "verdict": c.verdict, "p": _num(c.p_value), "p_adjusted": _num(c.p_adjusted),
                "runs": [c.n_a, c.n_b], "test": c.test, "note": c.note or None}


@dataclass
class KnobResult:
    label: str                  # "machine=q35", "control"
    option: str | None
    value: Any
    safety: str | None
    effects: list[Effect]

    @property
    def control(self) -> bool:
        return self.option is None

    @property
    def won(self) -> bool:
        verdicts = [e.comparison.verdict for e in self.effects]
        return "better" in verdicts and "worse" not in verdicts

    @property
    def score(self) -> float:
        gains = [e.gain.value for e in self.effects if math.isfinite(e.gain.value)]
        return sum(gains) / len(gains) if gains else -math.inf

    def to_json(self) -> dict[str, Any]:
        return {"knob": self.option, "value": self.value, "label": self.label,
                "control": self.control, "safety": self.safety, "won": self.won,
                "effects": [e.to_json() for e in self.effects]}


@dataclass
class TuneSummary:
    run: str
    baseline: str
    kind: str
    baseline_options: dict[str, Any]
    method: str
    alpha: float
    knobs: list[KnobResult]           # ranked: winners first, by mean gain; control last
    combined_run: str | None = None
    tuned: dict[str, Any] = field(default_factory=dict)
    vs_baseline: list[Effect] = field(default_factory=list)
    vs_best: list[Effect] = field(default_factory=list)
    best: str | None = None
    tax_recovered: dict[str, float | None] = field(default_factory=dict)
    interactions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def control(self) -> KnobResult | None:
        return next((k for k in self.knobs if k.control), None)

    def winners(self) -> list[KnobResult]:
        return [k for k in self.knobs if k.won and not k.control]

    @property
    def control_alarm(self) -> bool:
        control = self.control
        return control is not None and any(e.comparison.significant for e in control.effects)

    def resolution(self) -> dict[str, float]:
        """Per workload column (its class, or class: workload), the half-width of the A-vs-A
        control's interval: the smallest gain this search could tell from noise there."""
        control = self.control
        several = control is not None and len({e.group for e in control.effects}) != len(
            control.effects)
        return {(f"{e.group}: {e.workload}" if several else e.group):
                max(abs(e.gain.low), abs(e.gain.high))
                for e in (control.effects if control else [])
                if math.isfinite(e.gain.low) and math.isfinite(e.gain.high)}

    @property
    def control_text(self) -> str:
        """What the A-vs-A control says of the verdicts (control_note), as views print it."""
        return control_note(self)

    @property
    def tuned_text(self) -> str:
        """The tuned configuration as views print it: "vcpus=2, hugepages=on"."""
        return ", ".join(knob_label(k, v) for k, v in self.tuned.items())

    def resolution_text(self) -> str:
        """resolution() said: "CPU ±7.1%, memory ±3.0%" ("" without a control interval)."""
        return ", ".join(f"{group} ±{half:.1%}" for group, half in self.resolution().items())

    def baseline_text(self) -> str:
        """The baseline as configured: "vm:tcg (vm): accel=tcg, machine=pc"."""
        options = ", ".join(knob_label(k, v) for k, v in self.baseline_options.items()
                            if k != "kind" and v is not None)
        return f"{self.baseline} ({self.kind})" + (f": {options}" if options else
                                                   ": its kind's defaults")

    @property
    def confirmed(self) -> bool:
        verdicts = [e.comparison.verdict for e in self.vs_baseline]
        return "better" in verdicts and "worse" not in verdicts

    def recommended(self) -> str:
        """A plan to paste and run: the baseline's options with the tuned values, each with
        its safety note, and the workloads the search measured."""
        options = {**self.baseline_options, **(self.tuned if self.confirmed else {})}
        notes = {k.option: k.safety for k in self.knobs if k.option in self.tuned
                 and k.value == self.tuned[k.option] and k.safety}
        name = self.baseline if re.fullmatch(r"[A-Za-z0-9_-]+", self.baseline) else show(
            self.baseline)
        lines = [f"[targets.{name}]", f"kind = {show(self.kind)}"]
        for key, value in options.items():
            if key == "kind" or value is None:
                continue
            note = f"   # safety: {notes[key]}" if key in notes else ""
            mark = "   # tuned" if key in self.tuned and self.confirmed and not note else ""
            lines.append(f"{key} = {show(value)}{note}{mark}")
        for workload, params in self.workloads():
            lines += ["", "[[workloads]]", f"name = {show(workload)}"]
            if params:
                # A list in params sweeps: a list-valued option is a sweep of one.
                lines.append("params = { " + ", ".join(
                    f"{k} = {show([v] if isinstance(v, list) else v)}"
                    for k, v in params.items()) + " }")
        return "\n".join(lines)

    def workloads(self) -> list[tuple[str, dict[str, Any]]]:
        """Each workload configuration the search measured, (name, params), in order."""
        effects = [e for k in self.knobs for e in k.effects] + self.vs_baseline
        seen = dict.fromkeys((e.workload, json.dumps(e.params, sort_keys=True))
                             for e in effects)
        return [(workload, json.loads(params)) for workload, params in seen]

    def to_json(self) -> dict[str, Any]:
        control = self.control
        return {
            "runs": {"singles": self.run, "combined": self.combined_run},
            "baseline": self.baseline, "kind": self.kind,
            "baseline_options": self.baseline_options, "method": self.method,
            "alpha": self.alpha,
            "knobs": [k.to_json() for k in self.knobs if not k.control],
            "control": {"label": CONTROL, "significant": self.control_alarm,
                        "verdicts": [e.to_json() for e in control.effects] if control else [],
                        "resolution": {g: _num(h) for g, h in self.resolution().items()},
                        "note": control_note(self)},
            "combined": None if self.combined_run is None else {
                "options": self.tuned, "confirmed": self.confirmed,
                "vs_baseline": [e.to_json() for e in self.vs_baseline],
                "best_single": self.best,
                "vs_best_single": [e.to_json() for e in self.vs_best],
                "interactions": self.interactions},
            "tax_recovered": self.tax_recovered or None,
            "recommended": self.recommended(),
            "notes": self.notes}


def control_note(summary: TuneSummary) -> str:
    if summary.control is None:
        return "no control was measured"
    if summary.control_alarm:
        return ("the A-vs-A control came out significant: the host drifted or is too noisy "
                "for these verdicts; measure again on a quieter host")
    said = "the A-vs-A control (the baseline against itself) stayed ~, as it must"
    if summary.resolution_text():
        said += (f"; its interval ({summary.resolution_text()}) is the smallest gain this "
                 "search could tell from noise: a knob gaining less reads ~ even when real")
    return said


def _num(x: float) -> float | None:
    return round(x, 6) if isinstance(x, float) and math.isfinite(x) else None


Indexed = list[tuple[int, float]]   # (repetition index, primary value)


def _values(run: Run) -> dict[tuple[str, str, str], Indexed]:
    """(target, workload, params as JSON) -> the primary metric of its measured runs."""
    out: dict[tuple[str, str, str], Indexed] = {}
    for r in run.reps:
        cls = workloads.registered().get(r.workload)
        if r.phase != "measure" or r.status != "ok" or cls is None:
            continue
        primary = cls.primary_metric()
        key = (r.target, r.workload, json.dumps(r.params, sort_keys=True))
        out.setdefault(key, []).extend(
            [(r.idx, m.value) for m in r.metrics if m.name == primary][:1])
    return out


def matched(reference: Indexed, candidate: Indexed) -> tuple[list[float], list[float]]:
    """The pair's values measured in the same rounds: the reference's repetitions up to the
    candidate's last (round i of every target has index i, and a candidate the race
    stopped never runs again), so a reference that raced on against others is not
    judged against a candidate it was never interleaved with."""
    if not candidate:
        return [v for _, v in reference], []
    last = max(i for i, _ in candidate)
    return [v for i, v in reference if i <= last], [v for _, v in candidate]


def _effects(run: Run, pairs: list[tuple[str, str]], alpha: float,
             method: Method) -> dict[tuple[str, str], list[Effect]]:
    """(reference, candidate) -> its effect on each workload configuration, judged with
    every other pair of the run."""
    values = _values(run)
    cells = list(dict.fromkeys((w, p) for _, w, p in values))
    asked: list[tuple[tuple[str, str], str, str, tuple[str, Sequence[float],
                                                         Sequence[float], bool]]] = []
    for a, b in pairs:
        for workload, params in cells:
            cls = workloads.registered()[workload]
            spec = cls.metric_spec(cls.primary_metric())
            assert spec is not None
            reference, candidate = matched(values.get((a, workload, params), []),
                                           values.get((b, workload, params), []))
            asked.append(((a, b), workload, params, (f"{b} vs {a}: {workload}", reference,
                                                     candidate, spec.higher_is_better)))
    judged = judge([q[3] for q in asked], alpha=alpha, method=method)
    out: dict[tuple[str, str], list[Effect]] = {pair: [] for pair in pairs}
    for (pair, workload, params, _), comparison in zip(asked, judged):
        cls = workloads.registered()[workload]
        spec = cls.metric_spec(cls.primary_metric())
        assert spec is not None
        out[pair].append(Effect(workload, json.loads(params), spec.name,
                                spec.group or "other", comparison))
    return out


def _specs(run: Run) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in run.plan.get("targets", [])}


def _differences(options: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if baseline.get(k) != v}


def summarize(singles: Run, combined: Run | None = None, alpha: float = 0.01,
              method: Method = "holm") -> TuneSummary:
    """The verdicts of a stored search (its singles run, and its combined run if any)."""
    specs = _specs(singles)
    base = str(singles.plan.get("baseline"))
    kind = specs[base]["kind"]
    base_options = specs[base].get("options", {})
    infos = plugin.option_infos(targets.get(kind).Options)
    pairs = [(base, name) for name in specs if name != base]
    effects = _effects(singles, pairs, alpha, method)
    knobs = []
    for (_, name), found in effects.items():
        diff = _differences(specs[name].get("options", {}), base_options)
        if not diff:
            knobs.append(KnobResult(CONTROL, None, None, None, found))
            continue
        option, value = next(iter(diff.items()))
        safety = infos[option].safety(value) if option in infos else None
        knobs.append(KnobResult(knob_label(option, value), option, value, safety, found))
    knobs.sort(key=lambda k: (k.control, not k.won, -k.score))
    summary = TuneSummary(singles.id, base, kind, base_options, method, alpha, knobs)
    if combined is not None:
        _add_combined(summary, combined, alpha, method)
    return summary


def _add_combined(summary: TuneSummary, run: Run, alpha: float, method: Method) -> None:
    specs = _specs(run)
    base, tuned = summary.baseline, tuned_name(summary.baseline)
    summary.combined_run = run.id
    summary.tuned = _differences(specs[tuned].get("options", {}), summary.baseline_options)
    natives = [n for n, s in specs.items() if targets.get(s["kind"]).bare_host]
    bests = [n for n in specs if n not in (base, tuned, *natives)]
    pairs = [(base, tuned)] + [(b, tuned) for b in bests]
    effects = _effects(run, pairs, alpha, method)
    summary.vs_baseline = effects[(base, tuned)]
    if bests:
        summary.best = bests[0].removeprefix(f"{base}[").removesuffix("]")
        summary.vs_best = effects[(bests[0], tuned)]
    singles = {k.label: k for k in summary.knobs}
    for effect in summary.vs_baseline:
        parts = [e.gain.value for label in (knob_label(o, v) for o, v in summary.tuned.items())
                 if label in singles for e in singles[label].effects
                 if e.workload == effect.workload and e.params == effect.params]
        if len(parts) > 1:
            said = interaction(effect.gain, parts)
            if said:
                summary.interactions.append(f"{effect.workload}: {said}")
    if natives:
        values = _values(run)
        per_class: dict[str, list[float]] = {}
        for effect in summary.vs_baseline:
            params = json.dumps(effect.params, sort_keys=True)
            medians = [float(np.median([v for _, v in values[(t, effect.workload, params)]]))
                       if values.get((t, effect.workload, params)) else math.nan
                       for t in (base, tuned, natives[0])]
            recovered = tax_recovered(*medians)
            if recovered is not None:
                per_class.setdefault(effect.group, []).append(recovered)
        summary.tax_recovered = {group: sum(v) / len(v) for group, v in per_class.items()}


def summarize_stage(run: Run, alpha: float = 0.01, method: Method = "holm") -> TuneSummary:
    """One stored stage on its own (what a report of that run shows): the singles' verdicts,
    or the combination's against the baseline, the best single and native."""
    if not str(run.plan.get("name") or "").endswith("-combined"):
        return summarize(run, alpha=alpha, method=method)
    specs = _specs(run)
    base = str(run.plan.get("baseline"))
    summary = TuneSummary(run.id, base, specs[base]["kind"], specs[base].get("options", {}),
                          method, alpha, [])
    _add_combined(summary, run, alpha, method)
    summary.run, summary.combined_run = "", run.id
    return summary
