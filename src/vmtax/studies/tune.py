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
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ContextManager, Literal, NoReturn

from vmtax.analysis import tune as tuning
from vmtax.core import plugin
from vmtax.core import target as targets
from vmtax.core.limits import MAX_SECONDS
from vmtax.core.errors import VmtaxError
from vmtax.core.text import composed
from vmtax.core.workload import Workload
from vmtax.host import hugepages
from vmtax.host.journal import Journal
from vmtax.results.store import Store
from vmtax.studies import estimate, planfile
from vmtax.studies.plan import Plan, TargetSpec
from vmtax.studies.repetitions import Cell, Unit
from vmtax.studies.runner import Reporter, Runner
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
        return TargetSpec(name, self.baseline.kind, {**self.baseline.options, **changes})

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


def _host_problem(spec: TargetSpec, changes: dict[str, Any]) -> str | None:
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
    text = planfile.read_text(path)
    try:
        data = planfile.parse(text, path)
    except planfile.PlanError:
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


# --- running it ----------------------------------------------------------------------------

def _cell(workload: Workload) -> tuple[str, str]:
    return workload.name, json.dumps(workload.params, sort_keys=True)


class Race:
    """The repetition policy of a tune stage: a cell's repetitions beyond the fixed ones
    follow the racing rule over `pairs` and stop at the stage's deadline; each cell races
    for an equal share of what is left once the fixed repetitions of the cells after it
    are paid for."""

    def __init__(self, plan: Plan, pairs: list[tuple[str, str]], rule: tuning.RaceRule,
                 stage_end: float):
        self.plan = plan
        self.pairs = pairs
        self.rule = rule
        self.stage_end = stage_end
        startup = sum(targets.get(t.kind).startup_seconds for t in plan.targets)
        # Each cell's fixed repetitions, by (workload, parameters), in the order they run.
        self.fixed = {_cell(spec.make(plan.time)):
                      estimate.estimate(replace(plan, workloads=[spec])).seconds - startup
                      for spec in plan.workloads}
        self.raced: set[tuple[str, str]] = set()

    def _open(self, cell: Cell) -> bool:
        spec = cell.workload.metric_spec(cell.workload.primary_metric())
        return spec is not None and any(
            self.rule.state(cell.values[a], cell.values[b], spec.higher_is_better) == "open"
            for a, b in self.pairs if a in cell.values and b in cell.values)

    def resumed(self, cell: Cell) -> list[Unit]:
        """A resumed cell whose race is still open gets one more baseline repetition, so it
        races on."""
        if not self.pairs or not self._open(cell):
            return []
        base = self.pairs[0][0]
        return [Unit(base, "measure", self.plan.warmup + cell.attempts[base])]

    def more(self, cell: Cell) -> None:
        workload = cell.workload
        self.raced.add(_cell(workload))
        later = [c for c in self.fixed if c not in self.raced]
        left = self.stage_end - time.monotonic() - sum(self.fixed[c] for c in later)
        deadline = time.monotonic() + left / (len(later) + 1)
        spec = workload.metric_spec(workload.primary_metric())
        assert spec is not None   # a workload's primary metric is in its manifest
        assert self.plan.max_runs is not None   # a stage's plan has one (singles_plan)
        # All the cell's targets: a resumed cell may have left only some to run. A copy:
        # race() adds each value itself, as cell.measure does to the cell's.
        values = {t: list(v) for t, v in cell.values.items()}
        pairs = [p for p in self.pairs if p[0] in values and p[1] in values]
        tuning.race(values, pairs, spec.higher_is_better, self.rule,
                    lambda name: cell.measure(name, "racing"), self.plan.max_runs,
                    lambda: time.monotonic() < deadline)


@dataclass
class Outcome:
    singles: str                    # run ids
    combined: str | None
    summary: tuning.TuneSummary


def _stored(store: Store, name: str) -> tuple[str, str] | None:
    """(id, status) of the latest run of that name, or None."""
    try:
        run_id = store.resolve(name)
    except VmtaxError:
        return None
    status = next((r["status"] for r in store.list_runs() if r["id"] == run_id), "failed")
    return run_id, status


def _finished(store: Store, plan: Plan) -> bool:
    """Whether the stage of plan is stored, done (a resumed search reuses it)."""
    stored = _stored(store, plan.name or "")
    return stored is not None and stored[1] == "done"


def _stage(search: Search, store: Store, plan: Plan, pairs: list[tuple[str, str]],
           stage_end: float, reporter: Reporter | None, journal: Journal | None,
           resume: bool) -> str:
    stored = _stored(store, plan.name or "") if resume else None
    if stored is not None and stored[1] == "done":
        return stored[0]
    rule = tuning.RaceRule(alpha=search.alpha, tests=max(1, len(pairs)) * len(plan.workloads),
                           min_runs=min(plan.runs, MIN_RUNS))
    runner = Runner(plan, store, reporter, resume=stored[0] if stored else None,
                    journal=journal, repetitions=Race(plan, pairs, rule, stage_end))
    return runner.execute()


def tuned_options(search: Search, winners: list[Knob]) -> tuple[dict[str, Any], list[str]]:
    """The winners' values together, best first; a value the others make impossible on
    this host (Options.problems) is left out, and said."""
    tuned: dict[str, Any] = {}
    notes = []
    for knob in winners:
        if knob.option in tuned:
            continue
        problem = _host_problem(search.baseline, {**tuned, knob.option: knob.value})
        if problem is None:
            tuned[knob.option] = knob.value
        else:
            notes.append(f"{knob.label} left out of the combination: {problem}")
    return tuned, notes


def run(search: Search, store: Store, reporter: Reporter | None = None,
        journal: Journal | None = None, resume: bool = False,
        on_stage: Callable[[str, str], None] | None = None) -> Outcome:
    """The whole search; returns the runs and their verdicts. on_stage(stage, text) hears
    what each stage is about to do."""
    if resume and _stored(store, search.run_name("singles")) is None:
        raise VmtaxError(f"--resume: no stored search to continue (no run named "
                         f"{search.run_name('singles')}); run it without --resume")
    started = time.monotonic()
    end = started + search.budget - STOP_MARGIN
    _, combined_minimum = search.minimum_seconds()
    singles_plan = search.singles_plan()
    base = search.baseline.name
    pairs = [(base, t.name) for t in singles_plan.targets if t.name != base]
    if on_stage and resume and _finished(store, singles_plan):
        on_stage("singles", "already done, its stored runs reused")
    elif on_stage:
        until = time.time() + (end - started - combined_minimum)
        done_by = time.time() + search.budget
        values = f"{len(search.knobs)} knob value{'s' if len(search.knobs) > 1 else ''}"
        on_stage("singles", f"{values} and the control against "
                 f"{base}: racing until {time.strftime('%H:%M:%S', time.localtime(until))}, "
                 f"the whole search done by {time.strftime('%H:%M:%S', time.localtime(done_by))}")
    singles = _stage(search, store, singles_plan, pairs, end - combined_minimum, reporter,
                     journal, resume)
    first = tuning.summarize(store.load_run(singles), alpha=search.alpha,
                             method=search.method)
    winners = [Knob(k.option, k.value, k.safety) for k in first.winners() if k.option]
    tuned, notes = tuned_options(search, winners)
    first.notes += search.notes + notes
    if not tuned:
        smallest = first.resolution_text()
        first.notes.append("no knob value won on any workload: nothing to combine, the "
                           "baseline stays as it is" + (
                               f"; a knob gaining less than the control's interval "
                               f"({smallest}) could not have won here" if smallest else ""))
        return Outcome(singles, None, first)
    if time.monotonic() + combined_minimum > end and not (
            resume and _stored(store, search.run_name("combined"))):
        first.notes.append(
            "the budget ran out before the winners could be confirmed together (~"
            f"{estimate.duration(combined_minimum)} more): their verdicts above stand alone; "
            "a larger --budget confirms them")
        return Outcome(singles, None, first)
    best = winners[0]
    alone = tuned == {best.option: best.value}   # the combination is the best single
    combined_plan = search.combined_plan(tuned, None if alone else best)
    tuned_name = tuning.tuned_name(base)
    pairs = [(base, tuned_name)]
    if not alone:
        pairs.append((tuning.knob_name(base, best.option, best.value), tuned_name))
    if on_stage and resume and _finished(store, combined_plan):
        on_stage("combined", "already done, its stored runs reused")
    elif on_stage:
        on_stage("combined", f"{', '.join(tuning.knob_label(k, v) for k, v in tuned.items())} "
                 f"together against {base}" + (f" and {best.label}" if len(pairs) > 1 else ""))
    combined = _stage(search, store, combined_plan, pairs, end, reporter, journal, resume)
    summary = tuning.summarize(store.load_run(singles), store.load_run(combined),
                               alpha=search.alpha, method=search.method)
    summary.notes += search.notes + notes
    return Outcome(singles, combined, summary)


def guarded(search: Search, store: Store, progress: ContextManager[Reporter],
            recovered: Callable[[str], None], stopped: Callable[[], NoReturn],
            resume: bool = False, on_stage: Callable[[str, str], None] | None = None
            ) -> Outcome:
    """run() as a command runs it: under a guarded journal (what crashed runs left undone
    first, each said to recovered), with progress; a Ctrl-C or SIGTERM ends in stopped()
    (every repetition so far is stored)."""
    from vmtax.studies.session import guarded_journal

    try:
        with guarded_journal(recovered) as own, progress as reporter:
            return run(search, store, reporter, own, resume, on_stage)
    except KeyboardInterrupt:
        stopped()
