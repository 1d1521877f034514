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
"""

from __future__ import annotations

import copy
import difflib
import itertools
import json
import os
import re
import tomllib
from dataclasses import dataclass
from typing import Annotated, Any, Callable

from pydantic import AfterValidator, BeforeValidator, Field

from vmtax.core import hints, plugin
from vmtax.core import target as targets
from vmtax.core import workload as workloads
from vmtax.core.limits import MAX_SECONDS
from vmtax.core.errors import VmtaxError
from vmtax.core.option_types import NonEmpty, Seconds
from vmtax.core.text import composed, read_user_file
from vmtax.host import hugepages
from vmtax.studies.plan import (
    DEFAULT_RUNS,
    DEFAULT_TIME,
    Plan,
    TargetSpec,
    WorkloadSpec,
    refusals,
)
from vmtax.studies.toml_lines import KeyPath, Locator, dotted, show

# A plan larger than this is not a plan (and a device file would never end).
MAX_PLAN_BYTES = 1 << 20
CheckOf = Callable[[KeyPath, str], "plugin.OptionInfo | None"]



def _unknown(key: str, known) -> str:
    """An unknown key as an error shows it, with the nearest known one: a misspelling."""
    near = difflib.get_close_matches(key, list(known), n=1)
    return json.dumps(key) + (f' (did you mean "{near[0]}"?)' if near else "")

class PlanError(VmtaxError):
    """A plan file that cannot run; `lines` holds one line per problem."""

    def __init__(self, source: str, lines: list[str]):
        self.lines = lines
        head = [] if len(lines) == 1 else [f"{source}: {len(lines)} problems"]
        super().__init__("\n".join(head + lines))


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
TOP_LEVEL = (*SETTINGS, "targets", "workloads", "quick")
QUICK_KEYS = (*SETTINGS, "targets", "params")
WORKLOAD_KEYS = ("name", "params", "zip")


def params_text(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={_label(v)}" for k, v in params.items())


def _label(value: Any) -> str:
    """A swept value in a target name: vm[pin=0+1], vm[hugepages=none]."""
    if value is None:
        return "none"
    if isinstance(value, list):
        return "+".join(map(str, value))
    return str(value)


@dataclass
class _Axis:
    """One sweep dimension: the keys it sets and, per step, their values."""
    keys: tuple[str, ...]
    steps: list[tuple[Any, ...]]


def _expand(fixed: dict[str, Any], axes: list[_Axis]) -> list[tuple[dict, dict]]:
    """(all values, swept values) of every point of the cartesian product of axes."""
    points = []
    for combo in itertools.product(*(axis.steps for axis in axes)):
        swept = {k: v for axis, step in zip(axes, combo) for k, v in zip(axis.keys, step)}
        points.append(({**fixed, **swept}, swept))
    return points


def _replace(values: dict[str, Any], key: str, value: Any,
             owner: dict[str, Any] | None = None) -> None:
    """Set values[key], taking key out of the zip table of owner (values' table by default)
    when it is swept there: the quick value replaces the whole dimension."""
    owner = values if owner is None else owner
    zipped = owner.get("zip")
    if isinstance(zipped, dict) and key in zipped:
        del zipped[key]
        if not zipped:
            del owner["zip"]
    values[key] = value


@dataclass
class _Origin:
    """The table a target or workload configuration was expanded from."""
    path: KeyPath       # [targets.NAME] or [[workloads]] entry
    values: KeyPath     # where its options or params are: path, or path + ("params",)
    given: dict[str, Any]
    zipped: Any

    def of(self, key: str) -> KeyPath:
        """Where key was written: among the values, in the zip, else the table itself."""
        if isinstance(self.zipped, dict) and key in self.zipped:
            return self.path + ("zip", key)
        return self.values + (key,) if key in self.given else self.path


class _Reader:
    def __init__(self, source: str, text: str):
        self.source = source
        self.where = Locator(text)
        self.errors: list[tuple[int, str]] = []     # (line, message)
        # Where each expanded target and workload configuration came from, for the checks
        # that look at several of them.
        self.target_origin: dict[str, _Origin] = {}
        self.target_options: dict[str, plugin.Options] = {}
        self.workload_origin: list[_Origin] = []
        self.aliases: dict[KeyPath, KeyPath] = {}   # where a [quick] value went -> its key

    def bad(self, path: KeyPath, expected: str, got: str, at: KeyPath | None = None) -> None:
        shown = self.written_at(path)
        if at is not None and at[:len(path)] == path:
            # A key in a table, named by the table: a [quick] key by its own table's name.
            source = self.written_at(at)
            shown = source[:len(source) - (len(at) - len(path))]
        self.fail(path if at is None else at, f"{dotted(shown)}: expected {expected}, got {got}")

    def alias(self, source: KeyPath, dest: KeyPath) -> None:
        """A [quick] value moved from source to dest: name and place problems at source."""
        self.where.alias(source, dest)
        self.aliases[dest] = source

    def written_at(self, path: KeyPath) -> KeyPath:
        """Where the value at path was written: a [quick] value under its own key."""
        for dest, source in self.aliases.items():
            if path[:len(dest)] == dest:
                return source + path[len(dest):]
        return path

    def dotted(self, path: KeyPath) -> str:
        return dotted(self.written_at(path))

    def fail(self, at: KeyPath, message: str) -> None:
        line = self.where.line(at)
        self.errors.append((line, f"{self.source}:{line}: {message}"))

    def check(self, path: KeyPath, info: plugin.OptionInfo, value: Any) -> tuple[bool, Any]:
        try:
            return True, info.check(value)
        except plugin.Invalid as exc:
            self.bad(path, str(exc), show(value))
            return False, None

    def table(self, path: KeyPath, value: Any, what: str) -> dict | None:
        if isinstance(value, dict):
            return value
        self.bad(path, what, show(value))
        return None

    def values(self, path: KeyPath, check: plugin.OptionInfo,
               value: Any) -> tuple[list[Any] | None, bool]:
        """(checked values, is a sweep); None when a value was wrong."""
        takes_list = check.takes_list
        sweep = isinstance(value, list) and (
            not takes_list or all(isinstance(v, list) or v == "none" for v in value))
        if not sweep:
            ok, checked = self.check(path, check, value)
            return ([checked] if ok else None), False
        if not value:
            self.bad(path, "a value or a non-empty list of values to sweep", "[]")
            return None, True
        results = [self.check(path + (i,), check, v) for i, v in enumerate(value)]
        return ([v for _, v in results] if all(ok for ok, _ in results) else None), True

    def sweep(self, path: KeyPath, given: dict[str, Any], zip_path: KeyPath, zipped: Any,
              check_of: CheckOf) -> list[tuple[dict, dict]]:
        """Expand one target's options or one workload's params; [] after an error."""
        fixed: dict[str, Any] = {}
        axes: list[_Axis] = []
        failed = False
        for key, value in given.items():
            check = check_of(path + (key,), key)
            if check is None:
                failed = True
                continue
            checked, is_sweep = self.values(path + (key,), check, value)
            if checked is None:
                failed = True
            elif is_sweep:
                axes.append(_Axis((key,), [(v,) for v in checked]))
            else:
                fixed[key] = checked[0]
        if zipped is not None:
            axis = self.zip_axis(zip_path, zipped, given, check_of)
            if axis is None:
                failed = True
            else:
                axes.append(axis)
        return [] if failed else _expand(fixed, axes)

    def zip_axis(self, path: KeyPath, zipped: Any, given: dict[str, Any],
                 check_of: CheckOf) -> _Axis | None:
        table = self.table(path, zipped, "a table of equally long lists, like "
                                         '{ a = [1, 2], b = ["x", "y"] }')
        if table is None:
            return None
        if not table:
            self.bad(path, "at least one list of values", "{ }")
            return None
        columns: dict[str, list[Any]] = {}
        failed = False
        for key, value in table.items():
            check = check_of(path + (key,), key)
            if check is None:
                failed = True
            elif key in given:
                self.bad(path + (key,), "each key either swept in zip or set outside it",
                         "both")
                failed = True
            elif not isinstance(value, list) or not value:
                self.bad(path + (key,), "a non-empty list of values", show(value))
                failed = True
            else:
                results = [self.check(path + (key, i), check, v) for i, v in enumerate(value)]
                columns[key] = [v for _, v in results]
                failed = failed or not all(ok for ok, _ in results)
        lengths = {key: len(v) for key, v in table.items() if isinstance(v, list)}
        if len(set(lengths.values())) > 1:
            first = next(iter(lengths))
            for key, n in lengths.items():
                if n != lengths[first]:
                    self.bad(path + (key,), f"{lengths[first]} values, as many as {first} has",
                             str(n))
            failed = True
        if failed:
            return None
        return _Axis(tuple(columns), list(zip(*columns.values())))

    # -- the plan's parts --------------------------------------------------------------

    def read(self, data: dict[str, Any]) -> Plan | None:
        """The plan, or None when self.errors says why not."""
        for key in data:
            if key not in TOP_LEVEL:
                # A tuning search's plan, given to `vmtax run` or `vmtax plan`.
                got = ('"tune" (a [tune] table is read by `vmtax tune PLAN`)'
                       if key == "tune" else _unknown(key, TOP_LEVEL))
                self.bad((), "one of " + ", ".join(TOP_LEVEL), got, at=(key,))
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
        self.check_host_hugepages(target_specs)
        if not self.errors:
            self.check_hugetlb(target_specs, workload_specs, settings.get("time", DEFAULT_TIME))
            self.check_refused(target_specs, workload_specs, settings.get("time", DEFAULT_TIME))
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
                         _unknown(key, QUICK_KEYS), at=at)
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
                    _replace(plan_targets[name], option, v)
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
                    _replace(entry["params"], param, v, entry)
                    self.alias(("quick", "params", param),
                               ("workloads", index, "params", param))
        names = sorted({e["name"] for e in entries if isinstance(e, dict)
                        and isinstance(e.get("name"), str)
                        and e["name"] in workloads.registered()})
        for param in params:
            if param not in used:
                self.bad(("quick", "params"), "a param of a workload of the plan ("
                         + ", ".join(names) + ")", json.dumps(param), at=("quick", "params", param))

    # -- what only the host or several values together can tell --------------------------

    def check_host_hugepages(self, specs: list[TargetSpec]) -> None:
        """The host huge pages all targets hold at once (every target is up for the whole
        plan), against what the host can reserve."""
        wanted: dict[str, int] = {}
        users: list[TargetSpec] = []
        for spec in specs:
            cls = targets.get(spec.kind)
            need = cls.host_hugepages(self.target_options[spec.name])
            for size, pages in need.items():
                wanted[size] = wanted.get(size, 0) + pages
            users += [spec] if need else []
        problem = hugepages.capacity_problem(wanted) if wanted else None
        if problem:
            origin = self.target_origin[users[0].name]
            self.fail(origin.of("hugepages"), f"{self.dotted(origin.values + ('hugepages',))}: "
                      f"{problem} (for {', '.join(s.name for s in users)}, up together)")

    def check_hugetlb(self, specs: list[TargetSpec], configs: list[WorkloadSpec],
                      time: int | None) -> None:
        """The huge pages a workload allocates must fit in each target: the ones it
        reserves for its workloads (a guest's), else the host's free ones."""
        host_free = hugepages.host_free()
        for config, origin in zip(configs, self.workload_origin):
            need, what = config.make(time).hugepages_needed()
            if not need:
                continue
            for spec in specs:
                have = targets.get(spec.kind).workload_hugepages(
                    self.target_options[spec.name])
                where = (f"{spec.name} reserves {have} for its workloads" if have is not None
                         else f"{spec.name} runs on the host, which has {host_free} free")
                if need > (host_free if have is None else have):
                    self.fail(origin.path, f"{self.dotted(origin.path)}: {what}, but {where}")

    def check_refused(self, specs: list[TargetSpec], configs: list[WorkloadSpec],
                      time: int | None) -> None:
        """What a workload configuration needs that a target refuses (gVisor: real-time
        scheduling), at the workload's table."""
        refused = {spec.name: targets.get(spec.kind).refuses(self.target_options[spec.name])
                   for spec in specs}
        for config, origin in zip(configs, self.workload_origin):
            workload = config.make(time)
            for name, features in refused.items():
                for problem in refusals(workload, name, features):
                    self.fail(origin.path, f"{self.dotted(origin.path)}: {problem}")

    def targets(self, tables: Any) -> list[TargetSpec]:
        if tables is None or tables == {}:
            self.bad(("targets",), "at least one [targets.NAME] table", "none")
            return []
        if self.table(("targets",), tables, "[targets.NAME] tables") is None:
            return []
        specs: list[TargetSpec] = []
        written: dict[str, str] = {}   # a name composed (NFC) -> as the plan wrote it
        for raw, table in tables.items():
            path: KeyPath = ("targets", raw)
            if not raw.isprintable():
                self.bad(path, "a target name without control characters", show(raw))
                continue
            name = composed(raw)
            if written.setdefault(name, raw) != raw:
                self.bad(path, "target names that differ in Unicode's composed form (NFC)",
                         f"{show(raw)}, the same name as {show(written[name])}")
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
            for options_, swept in self.sweep(path, options, path + ("zip",), table.get("zip"),
                                              self._check_of(kind, model)):
                label = ",".join(f"{k}={_label(v)}" for k, v in swept.items())
                origin = _Origin(path, path, options, table.get("zip"))
                set_at = {key: self.where_written(path, origin.of(key), f"{key} = {show(value)}")
                          if key not in by_name else self.where_written(
                              path, path, f"(its name sets {key} = {show(value)})")
                          for key, value in options_.items()}
                spec = TargetSpec(f"{name}[{label}]" if swept else name, kind, options_,
                                  set_at)
                if any(s.name == spec.name for s in specs):
                    self.bad(path, "target names that are unique", show(spec.name))
                built = self.together(origin, model, options_,
                                      "" if spec.name == name else f" (in {spec.name})")
                if built is not None:
                    specs.append(spec)
                    self.target_origin[spec.name] = origin
                    self.target_options[spec.name] = built
        return specs

    def where_written(self, table: KeyPath, at: KeyPath, value: str) -> str:
        """Where a value of table was written (at: the table or a key in it), as an error at
        run time names it: `FILE:LINE: [targets.vm] accel = "kvm"`; a [quick] value by
        its own table."""
        source = self.written_at(at)
        table = source[:len(source) - (len(at) - len(table))]
        return f"{self.source}:{self.where.line(at)}: [{dotted(table)}] {value}"

    def together(self, origin: _Origin, model: type[plugin.Options], values: dict[str, Any],
                 which: str, host: Callable[[plugin.Options], list[tuple[str, str]]] | None
                 = None) -> plugin.Options | None:
        """The options of one expanded configuration, checked against each other (and the
        host); each problem is reported at its option's line."""
        options = model.model_validate(values)
        problems = options.problems() + (host(options) if host else [])
        infos = plugin.option_infos(model)
        for key, expected in problems:
            self.fail(origin.of(key), f"{self.dotted(origin.values + (key,))}: expected "
                      f"{expected}, got {show(getattr(options, infos[key].field))}{which}")
        return None if problems else options

    def _check_of(self, owner: str, model: type[plugin.Options]) -> CheckOf:
        infos = plugin.option_infos(model)

        def check_of(path: KeyPath, key: str) -> plugin.OptionInfo | None:
            if key not in infos:
                expected, hint = plugin.unknown_option(owner, model, key)
                self.bad(path[:-1], expected, json.dumps(key) + hint, at=path)
            return infos.get(key)
        return check_of

    def workloads(self, entries: Any, time: int | None) -> list[WorkloadSpec]:
        if entries is None or entries == []:
            self.bad(("workloads",), "at least one [[workloads]] table", "none")
            return []
        if not (isinstance(entries, list) and all(isinstance(e, dict) for e in entries)):
            self.bad(("workloads",), "[[workloads]] tables", show(entries))
            return []
        specs: list[WorkloadSpec] = []
        known = workloads.registered()
        for index, entry in enumerate(entries):
            path: KeyPath = ("workloads", index)
            for key in entry:
                if key not in WORKLOAD_KEYS:
                    self.bad(path, "one of " + ", ".join(WORKLOAD_KEYS),
                             _unknown(key, WORKLOAD_KEYS), at=path + (key,))
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
            origin = _Origin(path, path + ("params",), params, entry.get("zip"))

            def host_problems(options: plugin.Options,
                              cls: type[workloads.Workload] = cls) -> list[tuple[str, str]]:
                return cls(options).host_problems()

            for params_, _ in self.sweep(path + ("params",), params, path + ("zip",),
                                         entry.get("zip"), self._check_of(name, cls.Options)):
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
                if spec in specs:
                    self.bad(path, "workload configurations that are not already in the plan",
                             f"{name} {show(params_)} again")
                specs.append(spec)
                self.workload_origin.append(origin)
        return specs


def _syntax_error(source: str, text: str, exc: tomllib.TOMLDecodeError) -> str:
    message = str(exc)
    m = re.search(r" \(at line (\d+), column (\d+)\)$", message)
    if m:
        return f"{source}:{m[1]}: invalid TOML: {message[:m.start()]} (column {m[2]})"
    message = message.removesuffix(" (at end of document)")
    return f"{source}:{max(1, len(text.splitlines()))}: invalid TOML: {message} (at the end)"


# Tables and arrays nested deeper than this in a plan mean nothing to vmtax (a sweep of a
# list option is five levels down); much deeper ones would recurse past Python's limit in
# the parser or in what reads the values.
MAX_DEPTH = 32


def parse(text: str, source: str = "<plan>") -> dict[str, Any]:
    """A plan file's TOML as data; a one-line PlanError for invalid TOML and for nesting
    deeper than MAX_DEPTH (which, deep enough, the parser itself cannot follow)."""
    too_deep = PlanError(source, [f"{source}: tables or arrays nested more than {MAX_DEPTH} "
                                  "levels deep; expected a plan"])
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(source, [_syntax_error(source, text, exc)]) from None
    except RecursionError:
        raise too_deep from None
    todo: list[tuple[Any, int]] = [(data, 1)]
    while todo:   # no recursion: the check must not fail as the parser did
        value, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise too_deep
        children = value.values() if isinstance(value, dict) else (
            value if isinstance(value, list) else ())
        todo += [(child, depth + 1) for child in children]
    return data


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


def read_text(path: str | os.PathLike[str]) -> str:
    """A plan file's text; one-line errors for what cannot be a plan file."""
    return read_user_file(path, "the plan file", MAX_PLAN_BYTES)


def load(path: str | os.PathLike[str], quick: bool = False) -> Plan:
    return loads(read_text(path), str(path), quick)

