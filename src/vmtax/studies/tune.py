"""`vmtax tune`: of every knob a target declares, which wins the tax back, and by how much.

Knobs are options a target plugin marks tunable (`plugin.option(..., tune=(...),
safety=...)`); nothing here names one. The search runs in two stored runs:

1. **singles** (run `tune-KEY-singles`): the baseline target, an A-vs-A control (a second
   target with the baseline's very options) and one target per knob value, each differing
   from the baseline in that one option. Every target gets the plan's fixed repetitions,
   interleaved A B B A by the runner as in any run; then the racing rule
   (vmtax.analysis.tune) gives more repetitions, round by round, only to the values whose
   answer is still open, until each is decided or the cell's share of the budget is spent.
2. **combined** (run `tune-KEY-combined`): the winners together, measured against the
   baseline and against the best single value (and native, when the plan has it, for the
   tax recovered), raced the same way.

The verdicts are analysis.tune's, over every repetition stored, adjusted for the number of
comparisons. `--budget` bounds the whole search: each stage and cell gets a deadline, the
search is refused up front when the budget cannot pay for the fixed repetitions, and the
confirmation is left out (and said) when the singles left no time for it. Interrupted,
`--resume` continues the stored runs where they stopped, open races included; the budget
then counts from the resume.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal

from vmtax.analysis import tune as tuning
from vmtax.core import plugin
from vmtax.core import target as targets
from vmtax.core.limits import MAX_SECONDS
from vmtax.core.errors import VmtaxError
from vmtax.core.text import composed
from vmtax.host import hugepages
from vmtax.studies import estimate, plan_toml, planfile
from vmtax.studies.plan import Plan, TargetSpec
from vmtax.studies.toml_lines import Locator, show

MIN_RUNS = 3              # fixed repetitions a side before the racing rule may decide
MAX_RUNS = 30             # no value gets more, however open its answer
# Kept back from the budget for what follows the last repetition: stopping the targets.
STOP_MARGIN = 15.0
TUNE_KEYS = ("baseline", "knobs", "budget", "alpha", "method")

Method = Literal["holm", "bh"]


# The longest search: thirty days (a longer one overflows nothing, but is no search).
MAX_BUDGET = 30 * MAX_SECONDS


def parse_budget(text: str) -> float:
    """"30m", "90s", "1h", "1.5h" -> seconds; ValueError for anything else."""
    m = re.fullmatch(r"\s*(\d{1,12}(?:\.\d{1,12})?)\s*([smh])\s*", str(text))
    seconds = float(m[1]) * {"s": 1, "m": 60, "h": 3600}[m[2]] if m else 0
    if not 0 < seconds <= MAX_BUDGET:
        raise ValueError(f'a duration like "30m", "90s" or "1h", at most '
                         f'{MAX_BUDGET // 3600}h, got {show(text)}')
    return seconds


@dataclass(frozen=True)
class Knob:
    option: str
    value: Any
    safety: str | None = None

    @property
    def label(self) -> str:
        return tuning.knob_label(self.option, self.value)


@dataclass
class Search:
    """A checked search: what runs, against what, within what time."""
    plan: Plan                      # the workloads and settings; its targets: baseline [+ native]
    baseline: TargetSpec
    native: TargetSpec | None
    knobs: list[Knob]
    budget: float                   # seconds
    alpha: float = 0.01
    method: Method = "holm"
    notes: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """Names the search's runs: the same search asked again (--resume) finds them."""
        text = json.dumps([self.baseline.kind, self.baseline.options,
                           [(w.name, w.params) for w in self.plan.workloads],
                           [(k.option, k.value) for k in self.knobs], self.budget,
                           self.plan.time, self.plan.runs], sort_keys=True, default=str)
        return hashlib.sha1(text.encode()).hexdigest()[:10]

    def run_name(self, stage: str) -> str:
        return f"tune-{self.key}-{stage}"

    def spec_with(self, name: str, changes: dict[str, Any]) -> TargetSpec:
        return TargetSpec(name, self.baseline.kind, {**self.baseline.options, **changes},
                          {k: v for k, v in self.baseline.written.items() if k not in changes})

    def singles_plan(self) -> Plan:
        base = self.baseline.name
        specs = [self.baseline, self.spec_with(tuning.control_name(base), {}),
                 *(self.spec_with(tuning.knob_name(base, k.option, k.value),
                                  {k.option: k.value}) for k in self.knobs)]
        return replace(self.plan, targets=specs, baseline=base, max_runs=MAX_RUNS,
                       name=self.run_name("singles"))

    def combined_plan(self, tuned: dict[str, Any], best: Knob | None) -> Plan:
        base = self.baseline.name
        specs = [self.baseline, self.spec_with(tuning.tuned_name(base), tuned)]
        if best is not None:
            specs.append(self.spec_with(tuning.knob_name(base, best.option, best.value),
                                        {best.option: best.value}))
        if self.native is not None:
            specs.append(self.native)
        return replace(self.plan, targets=specs, baseline=base, max_runs=MAX_RUNS,
                       name=self.run_name("combined"))

    def outline(self) -> tuning.SearchOutline:
        singles, combined = self.minimum_seconds()
        return tuning.SearchOutline(
            self.baseline.name, self.baseline.kind, [w.name for w in self.plan.workloads],
            self.native.name if self.native else None,
            [(k.label, k.safety) for k in self.knobs], estimate.duration(self.budget),
            estimate.duration(singles + combined), list(self.notes))

    def minimum_seconds(self) -> tuple[float, float]:
        """(singles, combined) with only the fixed repetitions: what any search costs."""
        singles = estimate.estimate(self.singles_plan()).seconds
        knob = self.knobs[0] if self.knobs else None
        combined = estimate.estimate(self.combined_plan(
            {knob.option: knob.value} if knob else {}, knob)).seconds
        return singles, combined


# --- choosing and checking the knobs --------------------------------------------------------

def declared(kind: str) -> dict[str, plugin.OptionInfo]:
    """The target kind's knobs: its options marked tunable, by key."""
    return {key: info for key, info in plugin.option_infos(targets.get(kind).Options).items()
            if info.tune}


def _built(spec: TargetSpec, changes: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(the baseline's options with changes, as a plan stores them; None and why not when
    they cannot run here: a value's own check, Options.problems)."""
    try:
        options = plugin.build(targets.get(spec.kind).Options, {**spec.options, **changes},
                               spec.name, strict=False, kind=spec.kind)
    except VmtaxError as exc:
        return None, str(exc).removeprefix(f"{spec.name}: ")
    return options.model_dump(by_alias=True, mode="json"), None


def host_problem(spec: TargetSpec, changes: dict[str, Any]) -> str | None:
    return _built(spec, changes)[1]


def choose_knobs(baseline: TargetSpec, asked: list[str] | None,
                 where: Callable[[int], str]) -> tuple[list[Knob], list[str], list[str]]:
    """(knob values, notes, errors) for the asked knobs ("machine", "vcpus=4"; None: every
    knob the kind declares). where(i) prefixes the i-th asked knob's errors (FILE:LINE: or
    --knobs:). A value equal to the baseline's is no candidate (the control is that)."""
    known = declared(baseline.kind)
    infos = plugin.option_infos(targets.get(baseline.kind).Options)
    base_options, _ = _built(baseline, {})
    base_options = base_options or {}
    knobs: list[Knob] = []
    notes: list[str] = []
    errors: list[str] = []
    for i, text in enumerate(asked if asked is not None else list(known)):
        key, sep, value_text = str(text).partition("=")
        key = key.strip()
        if key not in known:
            why = (f" (an option of {baseline.kind}, but not one it declares tunable)"
                   if key in infos else "")
            errors.append(f"{where(i)}expected a knob of {baseline.kind} "
                          f"({', '.join(known) or 'it declares none'}), got {show(text)}{why}")
            continue
        info = known[key]
        if sep:
            try:
                values: tuple[Any, ...] = (info.check(value_text.strip(), strict=False),)
            except plugin.Invalid as exc:
                errors.append(f"{where(i)}{key}: expected {exc}, got {show(value_text)}")
                continue
        else:
            values = info.tune
        for value in values:
            built, problem = _built(baseline, {key: value})
            if built is None:
                if asked is not None:
                    errors.append(f"{where(i)}{key}={tuning.show_value(value)}: this host "
                                  f"cannot run it: {problem}")
                else:
                    notes.append(f"{key}={tuning.show_value(value)} left out: {problem}")
                continue
            dumped = built[key]
            if dumped == base_options.get(key):
                if sep:
                    notes.append(f"{key}={tuning.show_value(value)} is the baseline's own "
                                 "value: the control measures it")
                continue
            knobs.append(Knob(key, dumped, info.safety(dumped)))
    return list({k.label: k for k in knobs}.values()), notes, errors


def check(search: Search, where_budget: str, where_knobs: str) -> list[str]:
    """What the search as a whole cannot do here: the huge pages all its targets hold at
    once, a budget that cannot pay for one comparison of each knob value."""
    errors = []
    if not search.knobs:
        errors.append(f"{where_knobs}no knob value to try: every one asked is the "
                      "baseline's own")
        return errors
    wanted: dict[str, int] = {}
    cls = targets.get(search.baseline.kind)
    for spec in search.singles_plan().targets:
        options = plugin.build(cls.Options, spec.options, spec.name, strict=False)
        for size, pages in cls.host_hugepages(options).items():
            wanted[size] = wanted.get(size, 0) + pages
    problem = hugepages.capacity_problem(wanted) if wanted else None
    if problem:
        errors.append(f"{where_knobs}hugepages: {problem} (every value is up at once, "
                      "with the baseline and the control)")
    singles, combined = search.minimum_seconds()
    if singles + combined + STOP_MARGIN > search.budget:
        need = singles + combined + STOP_MARGIN
        errors.append(
            f"{where_budget}expected a budget of at least {estimate.duration(need)} for one "
            f"comparison of each of the {len(search.knobs)} knob values and the control "
            f"({search.plan.warmup} warm-up + {search.plan.runs} runs each, "
            f"~{estimate.duration(singles)}) and the confirmation of the winners "
            f"(~{estimate.duration(combined)}), got {estimate.duration(search.budget)}; "
            "or fewer knobs or workloads")
    return errors


def _split_targets(base: Plan, named: str | None, where: str) -> tuple[TargetSpec,
                                                                      TargetSpec | None]:
    natives = [t for t in base.targets if targets.get(t.kind).bare_host]
    others = [t for t in base.targets if not targets.get(t.kind).bare_host]
    if named is not None:
        chosen = [t for t in base.targets if t.name == named]
        if not chosen:
            raise VmtaxError(f"{where}expected one of the targets "
                             f"({', '.join(t.name for t in base.targets)}), got {show(named)}")
        baseline = chosen[0]
    elif len(others) == 1:
        baseline = others[0]
    else:
        raise VmtaxError(f"{where}expected the one target to tune beside native (baseline = "
                         f"NAME), got {', '.join(t.name for t in others) or 'none'}")
    if not declared(baseline.kind):
        raise VmtaxError(f"{where}{baseline.name} ({baseline.kind}) declares no knobs; "
                         "kinds with knobs: " + ", ".join(
                             k for k in targets.kinds() if declared(k)))
    native = next((t for t in natives if t is not baseline), None)
    return baseline, native


def from_names(target_names: list[str], workload_names: list[str], knobs: list[str] | None,
               budget: str, *, alpha: float = 0.01, method: Method = "holm",
               **settings: Any) -> Search:
    """The flags form: --targets vm:tcg[,native] --workloads cpu --knobs machine,vcpus."""
    from vmtax.studies import plan as plan_mod
    base = plan_mod.from_names(target_names, workload_names, runs=MIN_RUNS, **settings)
    baseline, native = _split_targets(base, None, "--targets: ")
    try:
        seconds = parse_budget(budget)
    except ValueError as exc:
        raise VmtaxError(f"--budget: expected {exc}") from None
    chosen, notes, errors = choose_knobs(baseline, knobs, lambda i: "--knobs: ")
    if errors:
        raise VmtaxError("\n".join(errors))
    search = Search(base, baseline, native, chosen, seconds, alpha, method, notes)
    errors = check(search, "--budget: ", "--knobs: ")
    if errors:
        raise VmtaxError("\n".join(errors))
    return search


def _without_tune_table(text: str) -> str:
    """The plan's text with its [tune] table blanked (lines kept, so planfile's FILE:LINE
    still points at the right lines)."""
    lines = text.split("\n")
    inside = False
    for i, line in enumerate(lines):
        header = re.match(r"\s*\[\s*([^\]]*?)\s*\]", line)
        if header and not line.lstrip().startswith("[["):
            inside = header[1] == "tune"
        elif line.lstrip().startswith("[["):
            inside = False
        if inside:
            lines[i] = ""
    return "\n".join(lines)


def load(path: str, knobs: list[str] | None = None, budget: str | None = None) -> Search:
    """A plan file with a [tune] table: baseline (a target name), knobs (a list like
    ["machine", "vcpus=4"]; default: every knob its kind declares), budget ("30m"),
    alpha, method ("holm" or "bh"). Flags given on the command line win."""
    text = plan_toml.read_text(path)
    try:
        data = plan_toml.parse(text, path)
    except plan_toml.PlanError:
        data = {}   # planfile.loads says where
    table = data.get("tune", {})
    where = Locator(text) if "tune" in data else None

    def at(*key: str | int) -> str:
        line = where.line(("tune", *key)) if where else 1
        dotted = "".join(f".{k}" if isinstance(k, str) else f"[{k}]" for k in key)
        return f"{path}:{line}: tune{dotted}: "

    if not isinstance(table, dict):
        raise VmtaxError(f"{at()}expected a table ([tune]), got {show(table)}")
    errors = [f"{at(k)}expected one of {', '.join(TUNE_KEYS)}, got {show(k)}"
              for k in table if k not in TUNE_KEYS]
    base = planfile.loads(_without_tune_table(text), path)
    if base.max_runs is None:
        base.runs = max(base.runs, MIN_RUNS) if "runs" in data else MIN_RUNS
    named = table.get("baseline")   # as the plan's target names are kept: composed (NFC)
    baseline, native = _split_targets(base, composed(named) if isinstance(named, str) else named,
                                      at("baseline"))
    asked = knobs if knobs is not None else table.get("knobs")
    if asked is not None and knobs is None and (
            not isinstance(asked, list) or not all(isinstance(k, str) for k in asked)):
        errors.append(f"{at('knobs')}expected a list of knobs like [\"machine\", "
                      f"\"vcpus=4\"], got {show(asked)}")
        asked = None
    chosen, notes, knob_errors = choose_knobs(
        baseline, asked, (lambda i: "--knobs: ") if knobs is not None else
        (lambda i: at("knobs", i)))
    errors += knob_errors
    budget_text = budget if budget is not None else table.get("budget", "30m")
    budget_at = "--budget: " if budget is not None else at("budget")
    seconds = 0.0
    try:
        seconds = parse_budget(budget_text)
    except ValueError as exc:
        errors.append(f"{budget_at}expected {exc}")
    alpha = table.get("alpha", 0.01)
    if not isinstance(alpha, float) or not 0 < alpha < 1:
        errors.append(f"{at('alpha')}expected a number between 0 and 1, got {show(alpha)}")
    method = table.get("method", "holm")
    if method not in ("holm", "bh"):
        errors.append(f'{at("method")}expected one of "holm", "bh", got {show(method)}')
    if errors:
        raise VmtaxError("\n".join(errors))
    search = Search(base, baseline, native, chosen, seconds, alpha, method, notes)
    errors = check(search, budget_at, at("knobs") if knobs is None else "--knobs: ")
    if errors:
        raise VmtaxError("\n".join(errors))
    return search
