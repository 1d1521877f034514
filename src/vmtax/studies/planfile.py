"""Plan files: a whole experiment in one TOML file, checked before anything runs.

    runs = 5               # measured repetitions per target and workload configuration
    warmup = 1             # repetitions run first and discarded
    time = 2               # seconds per time-bounded workload; false: each its own limit
    baseline = "native"    # ratios are relative to this target (default: native, else the first)
    interleave = true      # A B B A order across targets, so drift cancels
    drop_caches = false    # sync and drop host's and targets' page caches before each repetition

    [targets.native]       # kind defaults to the table name when that name is a kind;
                           # a name as --targets takes ("vm:tcg") sets its variant too

    [targets.tcg]
    kind = "vm"            # a target kind (`vmtax list targets`); the other keys are its options
    accel = "tcg"
    vcpus = [1, 2]         # a list sweeps: targets tcg[vcpus=1] and tcg[vcpus=2]

    [targets.big]
    kind = "vm"            # zip varies options together: big[vcpus=2,memory=2G], big[vcpus=4,...
    zip = { vcpus = [2, 4], memory = ["2G", "4G"] }

    [[workloads]]
    name = "memory"        # a workload (`vmtax list workloads`); params are its options
    params = { threads = [1, 2, 4], memory-access-mode = ["seq", "rnd"] }   # 6 configurations
    zip = { memory-block-size = ["16K", "1M"], memory-total-size = ["1G", "8G"] }

Lists sweep as a cartesian product, in the order written; a zip table's lists (all of one
length) are a single further dimension, stepped through together. Options that take a list
themselves (`pin = [0, 1]`) sweep with a list of such values (`pin = [[0, 1], "none"]`).
Omitted settings, options and params keep their defaults.

A `[quick]` table is the plan's short form, run by `vmtax run PLAN --quick` (and shown by
`vmtax plan PLAN --quick`): its settings replace the plan's, `[quick.targets.NAME]` replaces
options of target NAME and `[quick.params]` replaces params of every workload, swept or
zipped ones included, that takes it. Both forms are checked whichever is asked for.

    [quick]
    runs = 1
    warmup = 0
    params = { threads = [1, 4] }

Every value is checked by the option model its plugin declares (vmtax.core.plugin); then each
configuration's options together (`Options.problems`: one pinned CPU per vCPU, guest huge
pages that leave the guest memory), what the host lacks for a workload
(`Workload.host_problems`), whether the host can reserve the huge pages all targets hold
at once, whether the huge pages a workload allocates fit in each target, and whether a
target refuses what a workload needs (`Workload.needs`, `Target.refuses`: gVisor and
cyclictest's real-time scheduling).

`load(path)` validates and expands a file into a plain `vmtax.studies.plan.Plan`, so the runner
never sees sweeps. Every problem is one line, `FILE:LINE: KEY.PATH: expected WHAT, got
VALUE`, all of them together in one `PlanError`.

This module reads the plan's parts (settings, targets, workloads, [quick]) in that order;
the rest is one concern each: reading the file's TOML (`plan_toml`, with `toml_lines` for
where each value was written), checking keys and values against the declared options
(`plan_checks`), expanding sweeps (`plan_sweeps`) and what bounds the plan as a whole
(`plan_bounds`).

May import: `vmtax.core`, `vmtax.studies.plan` and those parts; `vmtax.studies.density`
only to name a density plan given to `run`.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Hashable
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from vmtax.core import hints, plugin
from vmtax.core import target as targets
from vmtax.core import workload as workloads
from vmtax.core.limits import MAX_SECONDS
from vmtax.core.option_types import NonEmpty, Seconds
from vmtax.core.text import alike_form, composed, looks
from vmtax.studies.plan import DEFAULT_RUNS, DEFAULT_TIME, Plan, TargetSpec, WorkloadSpec
from vmtax.studies.plan_bounds import (
    Configurations,
    check_host_hugepages,
    check_hugetlb,
    check_refused,
    within_cap,
)
from vmtax.studies.plan_checks import Checker, Origin, unknown
from vmtax.studies.plan_sweeps import label, replace, sweep
from vmtax.studies.plan_toml import PlanError as PlanError
from vmtax.studies.plan_toml import parse, read_text
from vmtax.studies.toml_lines import KeyPath, show


# -- the plan's own settings, checked like a plugin's options ------------------------------

TimeLimit = Annotated[Annotated[int, Field(ge=1, le=MAX_SECONDS)] | None,
                      BeforeValidator(lambda v: None if v is False else v),
                      plugin.Expect(f"a whole number of seconds from 1 to {MAX_SECONDS}"
                                    ", or false for no limit")]


def _known_collector(name: str) -> str:
    if name not in plugin.plugins("collector"):
        raise ValueError("unknown collector")
    return name


class Settings(plugin.Options):
    runs: int = plugin.option(DEFAULT_RUNS, "Measured repetitions per target and workload "
                              "configuration", ge=1)
    warmup: int = plugin.option(1, "Repetitions run first and discarded", ge=0)
    time: TimeLimit = plugin.option(DEFAULT_TIME, "Seconds per time-bounded workload",
                                    unit="s")
    baseline: NonEmpty | None = plugin.option(None, "The target ratios are relative to")
    interleave: bool = plugin.option(True, "A B B A order across targets, so drift cancels")
    drop_caches: bool = plugin.option(
        False, "Before every repetition, outside its measured time: sync and drop the "
        "host's page cache and each target's (a target that may not is warned about once)")
    max_runs: int | None = plugin.option(None, "Adaptive runs: at most this many", ge=1)
    ci_target: Annotated[float, Field(gt=0, lt=1), plugin.Expect(
        "a fraction between 0 and 1, like 0.02 for 2%")] = plugin.option(
        0.02, "Adaptive runs: wanted CI half-width, a fraction of the median")
    collect: list[Annotated[str, AfterValidator(_known_collector)]] = plugin.option(
        [], "Collectors recording on the host around each cell's measured repetitions "
        "(vmtax list collectors)")
    timeout: Seconds | None = plugin.option(
        None, "A repetition running longer is stopped and stored as timed out (default: "
        "10 times its estimate plus a minute, at least the workload's own limit)", unit="s")
    name: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9._-]{0,63}$"), plugin.Expect(
        "a letter then letters, digits, '.', '_' or '-', at most 64")] | None = plugin.option(
        None, "The runs' name, usable wherever a run id is (the latest run of that name)")


SETTINGS = plugin.option_infos(Settings)
# Tables a plan keeps for the other commands that read it (`vmtax density PLAN`,
# `vmtax boot PLAN`), so one plan holds a whole study of its targets; `run` leaves them.
OTHER_COMMANDS = ("density", "boot")
TOP_LEVEL = (*SETTINGS, "targets", "workloads", "quick", *OTHER_COMMANDS)
QUICK_KEYS = (*SETTINGS, "targets", "params")
WORKLOAD_KEYS = ("name", "params", "zip")


class _Reader(Checker):
    def __init__(self, source: str, text: str):
        super().__init__(source, text)
        # Where each expanded configuration came from, for the checks of several at once.
        self.made = Configurations()

    # -- the plan's parts --------------------------------------------------------------

    def read(self, data: dict[str, Any]) -> Plan | None:
        """The plan, or None when self.errors says why not."""
        for key in data:
            if key not in TOP_LEVEL:
                # A tuning search's plan, given to `vmtax run` or `vmtax plan`.
                got = ('"tune" (a [tune] table is read by `vmtax tune PLAN`)'
                       if key == "tune" else unknown(key, TOP_LEVEL))
                self.bad((), "one of " + ", ".join(TOP_LEVEL), got, at=(key,))
        for key in OTHER_COMMANDS:
            if key in data:
                self.table((key,), data[key], f"a table of `vmtax {key}` settings")
        settings = {}
        for key, info in SETTINGS.items():
            if key in data:
                ok, value = self.check((key,), info, data[key])
                if ok:
                    settings[info.field] = value
        before = len(self.errors)
        target_specs = self.targets(data.get("targets"))
        targets_ok = len(self.errors) == before
        workload_specs = self.workloads(data.get("workloads"),
                                        settings.get("time", DEFAULT_TIME))
        runs = settings.get("runs", Plan.runs)
        if (settings.get("max_runs") or runs) < runs:   # "none" is no adaptive runs
            self.bad(("max_runs",), f"at least runs ({runs})", str(settings["max_runs"]))
        names = [t.name for t in target_specs]
        if settings.get("baseline"):   # named as the targets are kept: composed
            settings["baseline"] = composed(settings["baseline"])
        if "baseline" in settings and targets_ok and settings["baseline"] not in names:
            self.bad(("baseline",), "one of the targets (" + ", ".join(names) + ")",
                     show(settings["baseline"]))
        if self.errors:
            return None
        check_host_hugepages(self, self.made, target_specs)
        if not self.errors:
            time = settings.get("time", DEFAULT_TIME)
            check_hugetlb(self, self.made, target_specs, workload_specs, time)
            check_refused(self, self.made, target_specs, workload_specs, time)
        if self.errors:
            return None
        return Plan(targets=target_specs, workloads=workload_specs, **settings)

    def quick(self, data: dict[str, Any]) -> dict[str, Any] | None:
        """The plan's data with its [quick] table applied; its values keep their own lines
        for any problem found in them."""
        table = self.table(("quick",), data["quick"],
                           "a table of settings, targets and params for --quick")
        if table is None:
            return None
        merged = copy.deepcopy({k: v for k, v in data.items() if k != "quick"})
        for key, value in table.items():
            at: KeyPath = ("quick", key)
            if key in SETTINGS:
                merged[key] = value
                self.alias(at, (key,))
            elif key == "targets":
                self._quick_targets(merged, value)
            elif key == "params":
                self._quick_params(merged, value)
            else:
                self.bad(("quick",), "one of " + ", ".join(QUICK_KEYS),
                         unknown(key, QUICK_KEYS), at=at)
        return merged

    def _quick_targets(self, merged: dict[str, Any], value: Any) -> None:
        tables = self.table(("quick", "targets"), value, "[quick.targets.NAME] tables")
        plan_targets = merged.get("targets")
        if tables is None or not isinstance(plan_targets, dict):
            return
        for name, options in tables.items():
            at: KeyPath = ("quick", "targets", name)
            if name not in plan_targets or not isinstance(plan_targets[name], dict):
                self.bad(at, "a target table of the plan (" + ", ".join(plan_targets) + ")",
                         json.dumps(name))
            elif self.table(at, options, "a table of target options") is not None:
                for option, v in options.items():
                    replace(plan_targets[name], option, v)
                    self.alias(at + (option,), ("targets", name, option))

    def _quick_params(self, merged: dict[str, Any], value: Any) -> None:
        """Each quick param replaces that param in every workload that takes it."""
        params = self.table(("quick", "params"), value, "a table of workload parameters")
        entries = merged.get("workloads")
        if params is None or not isinstance(entries, list):
            return
        used: set[str] = set()
        for index, entry in enumerate(entries):
            name = entry.get("name") if isinstance(entry, dict) else None
            if (not isinstance(name, str) or name not in workloads.registered()
                    or not isinstance(entry.get("params", {}), dict)):
                continue   # the plan itself is wrong there, and says so
            entry.setdefault("params", {})
            for param, v in params.items():
                if param in plugin.option_infos(workloads.get(name).Options):
                    used.add(param)
                    replace(entry["params"], param, v, entry)
                    self.alias(("quick", "params", param),
                               ("workloads", index, "params", param))
        names = sorted({e["name"] for e in entries if isinstance(e, dict)
                        and isinstance(e.get("name"), str)
                        and e["name"] in workloads.registered()})
        for param in params:
            if param not in used:
                self.bad(("quick", "params"), "a param of a workload of the plan ("
                         + ", ".join(names) + ")", json.dumps(param), at=("quick", "params", param))

    def targets(self, tables: Any) -> list[TargetSpec]:
        if tables is None or tables == {}:
            self.bad(("targets",), "at least one [targets.NAME] table", "none")
            return []
        if self.table(("targets",), tables, "[targets.NAME] tables") is None:
            return []
        specs: list[TargetSpec] = []
        written: dict[str, str] = {}   # a name as it looks (NFKC) -> as the plan wrote it
        for raw, table in tables.items():
            path: KeyPath = ("targets", raw)
            if not raw.isprintable():
                self.bad(path, "a target name without control characters", show(raw))
                continue
            if raw != raw.strip():
                self.bad(path, "a target name without spaces at its ends", show(raw))
                continue
            name = composed(raw)
            other = written.setdefault(looks(raw), raw)
            if other != raw:
                self.bad(path, f"target names that differ in Unicode's "
                               f"{alike_form(other, raw)}",
                         f"{show(raw)}, the same name as {show(other)}")
                continue
            if self.table(path, table, "a table of target options") is None:
                continue
            kinds = targets.kinds()
            # A table named as --targets names a target (vm:kvm) means what that name does.
            named = targets.parse_name(name) if name in targets.known_names() else None
            kind = table.get("kind", named[0] if named else None)
            if not isinstance(kind, str) or kind not in kinds:
                got = ("nothing (the table name is not a kind)" if kind is None
                       else show(kind))
                self.bad(path + ("kind",), "a target kind (" + ", ".join(kinds) + ")",
                         got)
                continue
            options = {k: v for k, v in table.items() if k not in ("kind", "zip")}
            by_name = named[1] if named and named[0] == kind else {}
            clash = [k for k, v in by_name.items() if options.setdefault(k, v) != v]
            for key in clash:
                self.bad(path + (key,), f"{show(by_name[key])}, as the target's name says",
                         show(options[key]))
            if clash:
                continue
            model = targets.get(kind).Options
            points = sweep(self, path, options, path + ("zip",), table.get("zip"),
                           self.check_of(kind, model))
            if points is None or not within_cap(self, self.made, "target", path, points):
                continue
            for options_, swept in points.expand():
                variant = ",".join(f"{k}={label(v)}" for k, v in swept.items())
                origin = Origin(path, path, options, table.get("zip"))
                set_at = {key: self.where_written(path, origin.of(key), f"{key} = {show(value)}")
                          if key not in by_name else self.where_written(
                              path, path, f"(its name sets {key} = {show(value)})")
                          for key, value in options_.items()}
                spec = TargetSpec(f"{name}[{variant}]" if swept else name, kind, options_,
                                  set_at)
                if spec.name in self.made.target_origin:
                    self.bad(path, "target names that are unique", show(spec.name))
                built = self.together(origin, model, options_,
                                      "" if spec.name == name else f" (in {spec.name})")
                if built is not None:
                    specs.append(spec)
                    self.made.target_origin[spec.name] = origin
                    self.made.target_options[spec.name] = built
        return specs

    def workloads(self, entries: Any, time: int | None) -> list[WorkloadSpec]:
        if entries is None or entries == []:
            self.bad(("workloads",), "at least one [[workloads]] table", "none")
            return []
        if not (isinstance(entries, list) and all(isinstance(e, dict) for e in entries)):
            self.bad(("workloads",), "[[workloads]] tables", show(entries))
            return []
        specs: list[WorkloadSpec] = []
        seen: set[tuple[str, Hashable]] = set()   # `spec in specs`: 18 s for 10,000
        known = workloads.registered()
        for index, entry in enumerate(entries):
            path: KeyPath = ("workloads", index)
            for key in entry:
                if key not in WORKLOAD_KEYS:
                    self.bad(path, "one of " + ", ".join(WORKLOAD_KEYS),
                             unknown(key, WORKLOAD_KEYS), at=path + (key,))
            name = entry.get("name")
            if not isinstance(name, str) or name not in known:
                self.bad(path + ("name",), "a workload (" + ", ".join(known) + ")",
                         "nothing" if name is None else show(name))
                continue
            params = self.table(path + ("params",), entry.get("params", {}),
                                'a table of parameters, like { threads = 4 }')
            if params is None:
                continue
            cls = known[name]
            origin = Origin(path, path + ("params",), params, entry.get("zip"))

            def host_problems(options: plugin.Options,
                              cls: type[workloads.Workload] = cls) -> list[tuple[str, str]]:
                return cls(options).host_problems()

            points = sweep(self, path + ("params",), params, path + ("zip",),
                           entry.get("zip"), self.check_of(name, cls.Options))
            if points is None or not within_cap(self, self.made, "workload", path, points):
                continue
            for params_, _ in points.expand():
                with_time = dict(params_)
                if time is not None and cls.time_option and cls.time_option not in with_time:
                    # The plan's time must suit each workload it fills (iperf3: at most 1 h).
                    try:
                        with_time[cls.time_option] = plugin.option_infos(
                            cls.Options)[cls.time_option].check(time)
                    except plugin.Invalid as exc:
                        self.bad(("time",), f"{exc} (the time option of {name})", show(time))
                        break
                built = self.together(origin, cls.Options, with_time, "", host_problems)
                if built is None:
                    continue
                spec = WorkloadSpec(name, params_)
                if (name, _hashable(params_)) in seen:
                    self.bad(path, "workload configurations that are not already in the plan",
                             f"{name} {show(params_)} again")
                seen.add((name, _hashable(params_)))
                specs.append(spec)
                self.made.workload_origin.append(origin)
        return specs


def _hashable(value: Any) -> Hashable:
    """value (TOML's data: tables, arrays, scalars) as a hashable value, equal to another
    one so made exactly when the values are equal."""
    if isinstance(value, dict):
        return frozenset((k, _hashable(v)) for k, v in value.items())
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    assert isinstance(value, Hashable)   # TOML's scalars: strings, numbers, booleans, dates
    return value


def loads(text: str, source: str = "<plan>", quick: bool = False) -> Plan:
    """Validate and expand a plan file's text, or with quick its [quick] form; raises
    PlanError naming every problem of either form."""
    data = parse(text, source)
    other = _other_command(data, source)
    if other is not None:
        raise PlanError(source, [other])
    full = _Reader(source, text)
    plan = full.read(data)
    errors = full.errors
    if "quick" in data:
        short = _Reader(source, text)
        merged = short.quick(data)
        quick_plan = short.read(merged) if merged is not None else None
        errors += short.errors
        plan = quick_plan if quick else plan
    elif quick:
        errors.append((1, f"{source}: --quick: the plan has no [quick] table"))
    if errors:
        # A problem of the plan itself shows in both forms: once is enough.
        raise PlanError(source, list(dict.fromkeys(m for _, m in sorted(errors,
                                                                       key=lambda e: e[0]))))
    assert plan is not None   # read() gives None only with errors
    return plan


def _other_command(data: dict[str, Any], source: str) -> str | None:
    """The one-line answer for a plan of another command given to `vmtax run`: a density
    plan has no [[workloads]] and top-level keys that are density's settings."""
    if "workloads" in data:
        return None
    from vmtax.studies import density  # only for this error: `run` does not need it otherwise
    theirs = [k for k in data if k in density.Settings.model_fields]
    if not theirs:
        return None
    return (f"{source}: a density plan ({', '.join(theirs[:3])} are `vmtax density` "
            f"settings and it has no [[workloads]]): run it with "
            f"`{hints.command('density', source)}`")


def load(path: str | os.PathLike[str], quick: bool = False) -> Plan:
    return loads(read_text(path), str(path), quick)

