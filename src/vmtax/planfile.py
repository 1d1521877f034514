"""Plan files: a whole experiment in one TOML file, checked before anything runs.

    runs = 5               # measured repetitions per target and workload configuration
    warmup = 1             # repetitions run first and discarded
    time = 2               # seconds per time-bounded workload (sysbench --time); false: no limit
    baseline = "native"    # ratios are relative to this target (default: native, else the first)
    interleave = true      # A B B A order across targets, so drift cancels

    [targets.native]       # kind defaults to the table name when that name is a kind

    [targets.tcg]
    kind = "vm"            # native, container or vm; the other keys are the kind's options
    accel = "tcg"
    vcpus = [1, 2]         # a list sweeps: targets tcg[vcpus=1] and tcg[vcpus=2]

    [targets.big]
    kind = "vm"            # zip varies options together: big[vcpus=2,memory=2G], big[vcpus=4,...
    zip = { vcpus = [2, 4], memory = ["2G", "4G"] }

    [[workloads]]
    name = "memory"        # workload type: cpu, threads, memory, fileio, mutex
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

Besides each value on its own, what only the host or the other values can tell is checked
too: a VM's options against each other (one pinned CPU per vCPU, guest huge pages that leave
the guest memory), whether the host can reserve the huge pages its VMs ask for, and whether a
`memory-hugetlb = "on"` block fits in each target's huge pages.

`load(path)` validates and expands a file into a plain `vmtax.plan.Plan`, so the runner
never sees sweeps. Every problem is one line, `FILE:LINE: KEY.PATH: expected WHAT, got
VALUE`, all of them together in one `PlanError`. Target options are checked by the
`TARGET_OPTIONS` table; workload params by what the host's sysbench says it accepts
(targets run the host's own binaries), which is why a typo such as `memory-blocksize` is
caught wherever sysbench is installed.
"""

from __future__ import annotations

import bisect
import copy
import functools
import itertools
import json
import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import click

from vmtax import hugepages, targets, workloads
from vmtax.errors import VmtaxError
from vmtax.plan import DEFAULT_TIME, Plan, TargetSpec, WorkloadSpec
from vmtax.targets import vm as vm_target

KeyPath = tuple[str | int, ...]   # table keys and array indices, outermost first


class PlanError(VmtaxError):
    """A plan file that cannot run; `lines` holds one line per problem."""

    def __init__(self, source: str, lines: list[str]):
        self.lines = lines
        head = [] if len(lines) == 1 else [f"{source}: {len(lines)} problems"]
        super().__init__("\n".join(head + lines))


# -- value checks ------------------------------------------------------------------------
# A check returns the value as the target wants it, or raises Invalid saying what it takes.

class Invalid(Exception):
    pass


def _list_valued(check):
    # The option's own value is a list, so only a list of lists sweeps it.
    check.takes_list = True
    return check


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def count(minimum: int) -> Callable[[Any], int]:
    def check(value):
        if _is_int(value) and value >= minimum:
            return value
        raise Invalid(f"a whole number of at least {minimum}")
    return check


def choice(*names: str, none: bool = False) -> Callable[[Any], str | None]:
    """One of names (matched case-insensitively); with none=True "none" gives None."""
    allowed = (*names, "none") if none else names
    by_lower = {n.lower(): n for n in allowed}

    def check(value):
        if isinstance(value, str) and value.lower() in by_lower:
            name = by_lower[value.lower()]
            return None if none and name == "none" else name
        raise Invalid("one of " + ", ".join(f'"{n}"' for n in allowed))
    return check


_QEMU_SIZE = re.compile(r"[1-9][0-9]*[KMGT]", re.IGNORECASE)


def size(value: Any) -> str:
    # A bare number is ambiguous (QEMU reads -m 512 as MiB), so a unit is required.
    if isinstance(value, str) and _QEMU_SIZE.fullmatch(value):
        return value
    raise Invalid('a size like "2G"')


def seconds(value: Any) -> float:
    if _is_number(value) and value > 0:
        return value
    raise Invalid("a positive number of seconds")


def text(value: Any) -> str:
    if isinstance(value, str) and value.strip():
        return value
    raise Invalid("a non-empty string")


def flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise Invalid("true or false")


def program(value: Any) -> str:
    if isinstance(value, str) and shutil.which(value):
        return value
    raise Invalid("an executable program (a path, or a name found on PATH)")


@_list_valued
def programs(value: Any) -> list[str]:
    if isinstance(value, list) and value and all(isinstance(v, str) and shutil.which(v)
                                                 for v in value):
        return value
    raise Invalid('a list of programs found on PATH, like ["sysbench"]')


def existing_file(value: Any) -> str:
    if isinstance(value, str) and Path(value).is_file():
        return value
    raise Invalid("the path of an existing file")


def _cpulist(cpus: set[int]) -> str:
    """{0, 1, 2, 5} -> "0-2,5", as in /sys/devices/system/cpu/online."""
    ranges = []
    for _, group in itertools.groupby(enumerate(sorted(cpus)), lambda p: p[1] - p[0]):
        ids = [cpu for _, cpu in group]
        ranges.append(str(ids[0]) if len(ids) == 1 else f"{ids[0]}-{ids[-1]}")
    return ",".join(ranges)


@_list_valued
def host_cpus(value: Any) -> list[int] | None:
    """Host CPU ids vmtax may use here (its affinity); "none" for no pinning."""
    if value == "none":
        return None
    usable = os.sched_getaffinity(0)
    if (isinstance(value, list) and value and all(_is_int(v) and v in usable for v in value)
            and len(set(value)) == len(value)):
        return value
    raise Invalid(f'a list of distinct host CPU ids (usable here: {_cpulist(usable)}) or "none"')


def time_limit(value: Any) -> int | None:
    # sysbench takes whole seconds only; false leaves each workload to its own limit.
    if value is False:
        return None
    if _is_int(value) and value >= 1:
        return value
    raise Invalid("a whole number of seconds, at least 1, or false for no limit")


def fraction(value: Any) -> float:
    if _is_number(value) and 0 < value < 1:
        return value
    raise Invalid("a fraction between 0 and 1, like 0.02 for 2%")


# Plan settings, by Plan's field names. max_runs must also be at least runs (checked below).
SETTINGS: dict[str, Callable[[Any], Any]] = {
    "runs": count(1), "warmup": count(0), "time": time_limit, "baseline": text,
    "interleave": flag, "max_runs": count(1), "ci_target": fraction,
}
TOP_LEVEL = (*SETTINGS, "targets", "workloads", "quick")
QUICK_KEYS = (*SETTINGS, "targets", "params")
WORKLOAD_KEYS = ("name", "params", "zip")

# Every option a target kind accepts: (kind, option) -> check. An option not here is an error,
# so a new target option is one entry.
TARGET_OPTIONS: dict[tuple[str, str], Callable[[Any], Any]] = {
    ("container", "runtime"): choice("auto", *targets.KINDS["container"][3]),
    ("container", "binaries"): programs,
    # Host CPUs the container's processes may run on (a cpuset; None: all).
    ("container", "cpus"): host_cpus,
    ("vm", "qemu"): program,
    ("vm", "accel"): choice(*targets.KINDS["vm"][3]),
    ("vm", "machine"): choice("microvm", "q35"),
    ("vm", "vcpus"): count(1),
    ("vm", "memory"): size,
    ("vm", "cpu"): text,
    ("vm", "kernel"): existing_file,
    ("vm", "disk_size"): size,
    ("vm", "boot_timeout"): seconds,
    ("vm", "binaries"): programs,
    ("vm", "icount"): text,
    ("vm", "kernel_args"): text,
    # E5: guest RAM on host huge pages of this size (None: normal pages) ...
    ("vm", "hugepages"): choice("2M", "1G", none=True),
    # ... and the count of huge pages the guest kernel reserves at boot.
    ("vm", "guest_hugepages"): count(0),
    # E2: vCPU i runs on host CPU pin[i] (None: the host scheduler decides).
    ("vm", "pin"): host_cpus,
}


def kind_options(kind: str) -> list[str]:
    return sorted(option for k, option in TARGET_OPTIONS if k == kind)


# -- workload params: what the host's sysbench accepts -----------------------------------

SYSBENCH = "sysbench"
_HELP_OPTION = re.compile(r"\s+--([a-z][a-z0-9-]*)(\[=on\|off\]|=(\S+))\s*(.*)")
_SYSBENCH_SIZE = re.compile(r"([0-9]+)([bkmgt]?)", re.IGNORECASE)


def _on_off(value: Any) -> Any:
    if isinstance(value, bool) or value in ("on", "off"):
        return value
    raise Invalid('"on", "off", true or false')


def _sysbench_size(value: Any) -> Any:
    if (_is_int(value) and value >= 0) or (isinstance(value, str)
                                           and _SYSBENCH_SIZE.fullmatch(value)):
        return value
    raise Invalid('a size like "8K" or "1G"')


def _sysbench_number(fractional: bool) -> Callable[[Any], Any]:
    def check(value):
        if _is_number(value) and value >= 0 and (fractional or float(value).is_integer()):
            return value
        raise Invalid("a number, at least 0" if fractional else "a whole number, at least 0")
    return check


def _help_check(kind: str, description: str) -> Callable[[Any], Any]:
    """The check for one option line of `sysbench [TEST] help`."""
    default = re.search(r"\[([^\]]*)\]$", description)
    if kind == "[=on|off]":
        return _on_off
    if kind == "=N":
        return _sysbench_number(bool(default) and "." in default[1])
    if kind == "=SIZE":
        return _sysbench_size
    choices = re.search(r"\{([^}]*)\}", description)
    if kind == "=STRING" and choices:
        return choice(*(c.strip() for c in choices[1].split(",")))
    return text


@functools.cache
def _sysbench_help(*args: str) -> dict[str, Callable[[Any], Any]]:
    """Option -> check, from the option lines `sysbench ARGS` prints."""
    done = subprocess.run([SYSBENCH, *args], capture_output=True, text=True, timeout=30)
    found = map(_HELP_OPTION.fullmatch, done.stdout.splitlines())
    return {m[1]: _help_check(m[2], m[4]) for m in found if m}


def sysbench_options(test: str) -> tuple[dict, dict] | None:
    """(options of `sysbench TEST`, general options) as option -> check; None without sysbench."""
    if shutil.which(SYSBENCH) is None:
        return None
    return _sysbench_help(test, "help"), _sysbench_help("--help")


# -- where a key is: tomllib gives values, not lines ------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR = re.compile(r"[^,\]}\n#]*")    # a number, boolean or date: up to what ends it


class Locator:
    """Line of each table, key and array element of a TOML text, by key path.

    A skeleton parse that follows tables, arrays of tables, dotted keys, inline tables and
    (multi-line) arrays but skips values; the text is already known to be valid TOML.
    """

    def __init__(self, text: str):
        self.text = text
        self.i = 0
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.lines: dict[KeyPath, int] = {}
        self.arrays: dict[KeyPath, int] = {}      # array-of-tables path -> tables seen so far
        self._document()

    def line(self, path: KeyPath) -> int:
        """Line of path, else of its nearest enclosing key that was written down."""
        for end in range(len(path), 0, -1):
            if path[:end] in self.lines:
                return self.lines[path[:end]]
        return 1

    def alias(self, source: KeyPath, dest: KeyPath) -> None:
        """dest (and what is below it) now holds the value written at source: report it
        at source's lines."""
        for path in [p for p in self.lines if p[:len(dest)] == dest]:
            del self.lines[path]
        for path, line in list(self.lines.items()):
            if path[:len(source)] == source:
                self.lines[dest + path[len(source):]] = line

    def _here(self) -> int:
        return bisect.bisect_right(self.starts, self.i)

    def _record(self, base: KeyPath, keys: KeyPath, line: int) -> KeyPath:
        for end in range(1, len(keys) + 1):
            self.lines.setdefault(base + keys[:end], line)
        return base + keys

    def _peek(self, s: str) -> bool:
        return self.text.startswith(s, self.i)

    def _skip(self, newlines: bool) -> None:
        blank = " \t\r\n" if newlines else " \t"
        while self.i < len(self.text):
            c = self.text[self.i]
            if c in blank:
                self.i += 1
            elif c == "#" and newlines:
                end = self.text.find("\n", self.i)
                self.i = len(self.text) if end < 0 else end
            else:
                return

    def _string(self) -> str:
        quote = self.text[self.i]
        if self._peek(quote * 3):
            end = self.i + 3
            while not self.text.startswith(quote * 3, end):
                end += 2 if quote == '"' and self.text[end] == "\\" else 1
            end += 3
            while end < len(self.text) and self.text[end] == quote:   # """a"""" ends in a quote
                end += 1
            raw = self.text[self.i:end]
        else:
            end = self.i + 1
            while self.text[end] != quote:
                end += 2 if quote == '"' and self.text[end] == "\\" else 1
            raw = self.text[self.i:end + 1]
            end += 1
        self.i = end
        return tomllib.loads(f"s = {raw}")["s"]

    def _key(self) -> KeyPath:
        keys: list[str] = []
        while True:
            self._skip(newlines=False)
            if self.text[self.i] in "\"'":
                keys.append(self._string())
            else:
                m = _BARE_KEY.match(self.text, self.i)
                keys.append(m[0])
                self.i = m.end()
            self._skip(newlines=False)
            if not self._peek("."):
                return tuple(keys)
            self.i += 1

    def _resolve(self, keys: KeyPath) -> KeyPath:
        """A header's key path with the index of the current table of each array on the way."""
        path: KeyPath = ()
        for key in keys:
            path += (key,)
            if path in self.arrays:
                path += (self.arrays[path] - 1,)
        return path

    def _document(self) -> None:
        table: KeyPath = ()
        while True:
            self._skip(newlines=True)
            if self.i >= len(self.text):
                return
            line = self._here()
            if self._peek("[["):
                self.i += 2
                keys = self._key()
                array = self._resolve(keys[:-1]) + keys[-1:]
                index = self.arrays.get(array, 0)
                self.arrays[array] = index + 1
                table = self._record((), array + (index,), line)
                self.i += 2
            elif self._peek("["):
                self.i += 1
                table = self._record((), self._resolve(self._key()), line)
                self.i += 1
            else:
                self._pair(table)

    def _pair(self, table: KeyPath) -> None:
        path = self._record(table, self._key(), self._here())
        self._skip(newlines=False)
        self.i += 1                                     # "="
        self._value(path)

    def _value(self, path: KeyPath) -> None:
        self._skip(newlines=False)
        c = self.text[self.i]
        if c in "\"'":
            self._string()
        elif c == "[":
            self.i += 1
            index = 0
            while True:
                self._skip(newlines=True)
                if self._peek("]"):
                    self.i += 1
                    return
                if self._peek(","):
                    self.i += 1
                    index += 1
                    continue
                self.lines.setdefault(path + (index,), self._here())
                self._value(path + (index,))
        elif c == "{":
            self.i += 1
            while True:
                self._skip(newlines=True)
                if self._peek("}"):
                    self.i += 1
                    return
                if self._peek(","):
                    self.i += 1
                    continue
                self._pair(path)
        else:
            m = _SCALAR.match(self.text, self.i)
            self.i = m.end()


# -- reading a plan --------------------------------------------------------------------

def show(value: Any) -> str:
    """A value as it is written in TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(show, value)) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {show(v)}" for k, v in value.items()) + " }"
    return str(value)


def dotted(path: KeyPath) -> str:
    out = ""
    for key in path:
        if isinstance(key, int):
            out += f"[{key}]"
        else:
            bare = _BARE_KEY.fullmatch(key)
            out += ("." if out else "") + (key if bare else json.dumps(key))
    return out or "top level"


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

    def check(self, path: KeyPath, check: Callable[[Any], Any], value: Any) -> tuple[bool, Any]:
        try:
            return True, check(value)
        except Invalid as exc:
            self.bad(path, str(exc), show(value))
            return False, None

    def table(self, path: KeyPath, value: Any, what: str) -> dict | None:
        if isinstance(value, dict):
            return value
        self.bad(path, what, show(value))
        return None

    def values(self, path: KeyPath, check: Callable[[Any], Any],
               value: Any) -> tuple[list[Any] | None, bool]:
        """(checked values, is a sweep); None when a value was wrong."""
        takes_list = getattr(check, "takes_list", False)
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
              check_of: Callable[[KeyPath, str], Callable[[Any], Any] | None]
              ) -> list[tuple[dict, dict]]:
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
                 check_of: Callable[[KeyPath, str], Callable[[Any], Any] | None]) -> _Axis | None:
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
                self.bad((), "one of " + ", ".join(TOP_LEVEL), json.dumps(key), at=(key,))
        settings = {}
        for key, check in SETTINGS.items():
            if key in data:
                ok, value = self.check((key,), check, data[key])
                if ok:
                    settings[key] = value
        before = len(self.errors)
        target_specs = self.targets(data.get("targets"))
        targets_ok = len(self.errors) == before
        workload_specs = self.workloads(data.get("workloads"),
                                        settings.get("time", DEFAULT_TIME))
        runs = settings.get("runs", Plan.runs)
        if settings.get("max_runs", runs) < runs:
            self.bad(("max_runs",), f"at least runs ({runs})", str(settings["max_runs"]))
        names = [t.name for t in target_specs]
        if "baseline" in settings and targets_ok and settings["baseline"] not in names:
            self.bad(("baseline",), "one of the targets (" + ", ".join(names) + ")",
                     show(settings["baseline"]))
        if self.errors:
            return None
        self.check_vms(target_specs)
        if not self.errors:
            self.check_hugetlb(target_specs, workload_specs, settings.get("time", DEFAULT_TIME))
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
                self.bad(("quick",), "one of " + ", ".join(QUICK_KEYS), json.dumps(key), at=at)
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
            if (name not in workloads.WORKLOADS
                    or not isinstance(entry.get("params", {}), dict)):
                continue   # the plan itself is wrong there, and says so
            entry.setdefault("params", {})
            for param, v in params.items():
                if _takes(name, param):
                    used.add(param)
                    _replace(entry["params"], param, v, entry)
                    self.alias(("quick", "params", param),
                               ("workloads", index, "params", param))
        names = sorted({e.get("name") for e in entries if isinstance(e, dict)
                        and e.get("name") in workloads.WORKLOADS})
        for param in params:
            if param not in used:
                self.bad(("quick", "params"), "a param of a workload of the plan ("
                         + ", ".join(names) + ")", json.dumps(param), at=("quick", "params", param))

    # -- what only the host or several values together can tell --------------------------

    def check_vms(self, specs: list[TargetSpec]) -> None:
        """Each VM's options against each other, then the host huge pages all VMs hold at
        once (every target is up for the whole plan)."""
        wanted: dict[str, list[tuple[TargetSpec, int]]] = {}
        for spec in specs:
            if spec.kind != "vm":
                continue
            origin = self.target_origin[spec.name]
            options = {**vm_target.VmTarget.option_defaults, **spec.options}
            for option, expected in vm_target.option_problems(options):
                self.fail(origin.of(option), f"{self.dotted(origin.values + (option,))}: expected "
                          f"{expected}, got {show(options[option])}" + self._for(spec))
            size = options["hugepages"]
            memory = vm_target.parse_size(options["memory"])
            if size is not None and memory % hugepages.SIZES[size] == 0:
                wanted.setdefault(size, []).append(
                    (spec, hugepages.pages_needed(memory, size)))
        if wanted:
            problem = hugepages.capacity_problem(
                {size: sum(n for _, n in users) for size, users in wanted.items()})
            if problem:
                users = [spec for specs_ in wanted.values() for spec, _ in specs_]
                origin = self.target_origin[users[0].name]
                self.fail(origin.of("hugepages"), f"{self.dotted(origin.values + ('hugepages',))}: "
                          f"{problem} (for {', '.join(s.name for s in users)}, up together)")

    def _for(self, spec: TargetSpec) -> str:
        """Which of a table's swept targets a message is about."""
        return "" if spec.name == self.target_origin[spec.name].path[-1] else f" (in {spec.name})"

    def check_hugetlb(self, specs: list[TargetSpec], configs: list[WorkloadSpec],
                      time: int | None) -> None:
        """A memory-hugetlb = "on" buffer must fit in the huge pages of every target: the
        guest's own (guest_hugepages) in a VM, the host's free ones elsewhere (vmtax
        reserves host pages for guest RAM only)."""
        host_free = _host_free_hugepages()
        for config, origin in zip(configs, self.workload_origin):
            params = config.make(time).params
            if config.name != "memory" or params.get("memory-hugetlb") not in ("on", True):
                continue
            block = _bytes(params["memory-block-size"])
            local = params.get("memory-scope") == "local"
            buffers = int(params.get("threads", 1)) if local else 1
            need = hugepages.sysbench_pages(block, buffers)
            for spec in specs:
                if spec.kind == "vm":
                    have = spec.options.get("guest_hugepages", 0)
                    where = f"{spec.name} reserves {have} (guest_hugepages)"
                else:
                    have = host_free
                    where = f"{spec.name} runs on the host, which has {have} free"
                if need > have:
                    each = f"{buffers} threads' buffers of " if local else "a buffer of "
                    self.fail(origin.of("memory-block-size"),
                              f"{self.dotted(origin.path)}: memory-hugetlb = \"on\" with "
                              f"{each}{show(params['memory-block-size'])} takes {need} "
                              f"2 MiB huge pages (sysbench rounds each up by up to 4 MiB), but "
                              f"{where}")

    def targets(self, tables: Any) -> list[TargetSpec]:
        if tables is None or tables == {}:
            self.bad(("targets",), "at least one [targets.NAME] table", "none")
            return []
        if self.table(("targets",), tables, "[targets.NAME] tables") is None:
            return []
        specs: list[TargetSpec] = []
        for name, table in tables.items():
            path: KeyPath = ("targets", name)
            if self.table(path, table, "a table of target options") is None:
                continue
            kind = table.get("kind", name if name in targets.KINDS else None)
            if not isinstance(kind, str) or kind not in targets.KINDS:
                got = ("nothing (the table name is not a kind)" if kind is None
                       else show(kind))
                self.bad(path + ("kind",), "a target kind (" + ", ".join(targets.KINDS) + ")",
                         got)
                continue
            options = {k: v for k, v in table.items() if k not in ("kind", "zip")}
            for options_, swept in self.sweep(path, options, path + ("zip",), table.get("zip"),
                                              self._option_check(kind)):
                label = ",".join(f"{k}={_label(v)}" for k, v in swept.items())
                spec = TargetSpec(f"{name}[{label}]" if swept else name, kind, options_)
                if any(s.name == spec.name for s in specs):
                    self.bad(path, "target names that are unique", show(spec.name))
                specs.append(spec)
                self.target_origin[spec.name] = _Origin(path, path, options, table.get("zip"))
        return specs

    def _option_check(self, kind: str):
        def check_of(path: KeyPath, option: str):
            check = TARGET_OPTIONS.get((kind, option))
            if check is None:
                valid = kind_options(kind)
                expected = (f"a {kind} option ({', '.join(valid)})" if valid
                            else f"no options ({kind} takes none)")
                self.bad(path[:-1], expected, json.dumps(option), at=path)
            return check
        return check_of

    def workloads(self, entries: Any, time: int | None) -> list[WorkloadSpec]:
        if entries is None or entries == []:
            self.bad(("workloads",), "at least one [[workloads]] table", "none")
            return []
        if not (isinstance(entries, list) and all(isinstance(e, dict) for e in entries)):
            self.bad(("workloads",), "[[workloads]] tables", show(entries))
            return []
        specs: list[WorkloadSpec] = []
        for index, entry in enumerate(entries):
            path: KeyPath = ("workloads", index)
            for key in entry:
                if key not in WORKLOAD_KEYS:
                    self.bad(path, "one of " + ", ".join(WORKLOAD_KEYS), json.dumps(key),
                             at=path + (key,))
            name = entry.get("name")
            if not isinstance(name, str) or name not in workloads.WORKLOADS:
                self.bad(path + ("name",), "a workload (" + ", ".join(workloads.WORKLOADS) + ")",
                         "nothing" if name is None else show(name))
                continue
            params = self.table(path + ("params",), entry.get("params", {}),
                                'a table of parameters, like { threads = 4 }')
            if params is None:
                continue
            for params_, _ in self.sweep(path + ("params",), params, path + ("zip",),
                                         entry.get("zip"), self._param_check(name)):
                spec = WorkloadSpec(name, params_)
                try:
                    spec.make(time)
                except VmtaxError as exc:
                    self.fail(path, f"{self.dotted(path)}: {exc}")
                    break
                if spec in specs:
                    self.bad(path, "workload configurations that are not already in the plan",
                             f"{name} {show(params_)} again")
                specs.append(spec)
                self.workload_origin.append(
                    _Origin(path, path + ("params",), params, entry.get("zip")))
        return specs

    def _param_check(self, name: str):
        cls = workloads.get(name)
        # The workload's name is the sysbench test it runs.
        help_ = sysbench_options(name) if "sysbench" in cls.binaries else None
        known = {} if help_ is None else {**help_[1], **help_[0]}

        def check_of(path: KeyPath, param: str):
            if help_ is None or param in cls.defaults or param == cls.time_param:
                return known.get(param, _any_param)
            if param not in known and param in BUILD_OPTIONS:
                self.fail(path, f"{self.dotted(path)}: the host's {SYSBENCH} (which the "
                                f"targets run) has no --{param}: {BUILD_OPTIONS[param]}")
                return None
            if param not in known:
                options = ", ".join(help_[0])
                self.bad(path[:-1], f"a sysbench {name} option ({options}, or a general one "
                         "from sysbench --help)", json.dumps(param), at=path)
                return None
            return known[param]
        return check_of


def _takes(workload: str, param: str) -> bool:
    """Does this workload take this param? When the host's sysbench cannot tell, yes."""
    cls = workloads.get(workload)
    if param in cls.defaults or param == cls.time_param:
        return True
    help_ = sysbench_options(workload) if "sysbench" in cls.binaries else None
    return help_ is None or param in help_[0] or param in help_[1]


# Options a sysbench build may lack, and why: a missing one is named as such, not as a typo.
BUILD_OPTIONS = {
    "memory-hugetlb": "it was built without large-page support (HAVE_LARGE_PAGES, Linux "
                      "only), so the workload cannot use huge pages; use a sysbench that "
                      "lists it in `sysbench memory help` (Debian's 1.0.20 does)",
}


def _any_param(value: Any) -> Any:
    # Unknown to the host's sysbench (or it is not installed): the workload checks it.
    return value


def _syntax_error(source: str, text: str, exc: tomllib.TOMLDecodeError) -> str:
    message = str(exc)
    m = re.search(r" \(at line (\d+), column (\d+)\)$", message)
    if m:
        return f"{source}:{m[1]}: invalid TOML: {message[:m.start()]} (column {m[2]})"
    message = message.removesuffix(" (at end of document)")
    return f"{source}:{max(1, len(text.splitlines()))}: invalid TOML: {message} (at the end)"


def loads(text: str, source: str = "<plan>", quick: bool = False) -> Plan:
    """Validate and expand a plan file's text, or with quick its [quick] form; raises
    PlanError naming every problem of either form."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(source, [_syntax_error(source, text, exc)]) from None
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
    return plan


def load(path: str | os.PathLike, quick: bool = False) -> Plan:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise VmtaxError(f"{path}: cannot read the plan file ({exc})") from None
    return loads(text, str(path), quick)


# -- what a plan will cost ---------------------------------------------------------------

# Measured on the classic plan under TCG on a 2-core host (173 s for an estimate of 226 s:
# a time-bounded workload that finishes its work early, like memory, is counted in full).
RUN_OVERHEAD = 0.2      # s per repetition: start-up, result collection (0.05 native, 0.4 VM)
UNBOUNDED_RUN = 1.0     # s per repetition without a time bound (mutex: 0.1 native, 0.5 VM)
VM_BOOT = 5.0           # s per VM target: boot to agent ready under TCG, then calibration
PREPARE_MIB_S = 150.0   # rate at which a prepare step writes file-total-size (90-280 here)
_SIZE_SHIFT = {"": 0, "b": 0, "k": 10, "m": 20, "g": 30, "t": 40}


@dataclass
class Estimate:
    seconds: float
    assumptions: list[str]      # only those that entered the sum


def _bytes(value: Any) -> int:
    m = _SYSBENCH_SIZE.fullmatch(str(value))
    return int(m[1]) << _SIZE_SHIFT[m[2].lower()]


def _mib(value: Any) -> float:
    return _bytes(value) / 2**20


def _host_free_hugepages() -> int:
    """Free 2 MiB pages on the host: what sysbench on the host (native, containers) gets."""
    try:
        return int((hugepages.pool_dir("2M") / "free_hugepages").read_text())
    except (OSError, ValueError):
        return 0


def configurations(plan: Plan) -> list[tuple[str, dict[str, Any]]]:
    """(workload, parameters as they will run, defaults and time included) per configuration."""
    return [(w.name, dict(sorted(w.make(plan.time).params.items()))) for w in plan.workloads]


def estimate(plan: Plan, runs: int | None = None) -> Estimate:
    """How long the plan should take with `runs` measured repetitions (default: plan.runs)."""
    reps = plan.warmup + (plan.runs if runs is None else runs)
    n_targets = len(plan.targets)
    used: dict[str, None] = {}      # ordered set of the assumptions the sum relies on
    vms = sum(t.kind == "vm" for t in plan.targets)
    total = VM_BOOT * vms
    if vms:
        used[f"each VM target boots in {VM_BOOT:g} s"] = None
    for spec in plan.workloads:
        workload = spec.make(plan.time)
        bound = workload.params.get(workload.time_param) if workload.time_param else None
        if bound is not None:
            used["a time-bounded repetition lasts exactly its time"] = None
        else:
            used[f"a repetition without a time bound ({workload.name}) takes "
                 f"{UNBOUNDED_RUN:g} s"] = None
        total += ((UNBOUNDED_RUN if bound is None else bound) + RUN_OVERHEAD) * reps * n_targets
        if workload.prepare_jobs() and "file-total-size" in workload.params:
            used[f"{workload.name} prepare writes file-total-size at {PREPARE_MIB_S:g} MiB/s, "
                 "once per target and configuration"] = None
            total += _mib(workload.params["file-total-size"]) / PREPARE_MIB_S * n_targets
    used[f"every repetition costs {RUN_OVERHEAD:g} s beyond its run time "
         "(start-up, collecting results)"] = None
    return Estimate(total, list(used))


def duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return (f"{hours} h {minutes} min" if hours else
            f"{minutes} min {secs} s" if minutes else f"{secs} s")


# -- vmtax plan ------------------------------------------------------------------------

def _params_text(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={_label(v)}" for k, v in params.items())


def _repetitions(plan: Plan) -> int:
    return len(plan.targets) * len(plan.workloads) * (plan.warmup + plan.runs)


def _summary(source: str, plan: Plan) -> list[str]:
    n_targets, n_configs = len(plan.targets), len(plan.workloads)
    runs = (f"{plan.runs} to {plan.max_runs} measured, until the CI is within "
            f"{plan.ci_target:.0%}" if plan.max_runs else f"{plan.runs} measured")
    lines = [f"{source}: {n_targets} target{'s' * (n_targets != 1)} × {n_configs} workload "
             f"configuration{'s' * (n_configs != 1)} × ({plan.warmup} warm-up + {runs}) = "
             f"{'at least ' * bool(plan.max_runs)}{_repetitions(plan)} repetitions"]
    low = estimate(plan)
    span = duration(low.seconds)
    if plan.max_runs:
        span += f" to {duration(estimate(plan, plan.max_runs).seconds)}"
    lines += ["", f"estimated run time: {span}, assuming"]
    lines += [f"  - {a}" for a in low.assumptions]
    return lines


def _matrix(plan: Plan) -> list[str]:
    lines = [f"targets (baseline: {plan.baseline})"]
    width = max(len(t.name) for t in plan.targets)
    kind_width = max(len(t.kind) for t in plan.targets)
    for t in plan.targets:
        lines.append(f"  {t.name:<{width}}  {t.kind:<{kind_width}}  "
                     f"{_params_text(t.options)}".rstrip())
    lines += ["", "workload configurations (parameters as run)"]
    configs = configurations(plan)
    for name in dict.fromkeys(n for n, _ in configs):
        mine = [params for n, params in configs if n == name]
        # Parameters every configuration shares are printed once, above the ones that vary.
        common = {k: v for k, v in mine[0].items() if all(p.get(k, k) == v for p in mine)}
        lines.append(f"  {name}: {_params_text(common)}".rstrip())
        if len(mine) > 1:
            lines += [f"    {_params_text({k: v for k, v in p.items() if k not in common})}"
                      for p in mine]
    order = ("interleaved across targets (A B B A), so drift cancels" if plan.interleave
             else "each target's repetitions in one block")
    time = "each workload's own limit" if plan.time is None else f"{plan.time} s"
    return lines + ["", f"time per time-bounded run: {time}; order: {order}"]


PLAN_HELP = """Check a plan file and show what it would run; nothing is run.

\b
A plan file is TOML (see plans/ for complete examples):
  runs = 3                 measured repetitions; warmup = 1 runs first, discarded
  time = 2                 seconds per time-bounded run (false: no limit)
  baseline = "native"      ratios are relative to this target
  [targets.native]         kind defaults to the table name when it is a kind
  [targets.fast]
  kind = "vm"              native, container or vm; other keys are its options
  vcpus = [1, 2]           a list sweeps: fast[vcpus=1], fast[vcpus=2]
  [[workloads]]
  name = "memory"          cpu, threads, memory, fileio or mutex
  params = { threads = [1, 2, 4] }    sysbench options; lists multiply
  zip = { memory-block-size = ["16K", "1M"], memory-total-size = ["1G", "8G"] }
                           zip lists vary together (pairwise, not multiplied)
  [quick]                  the short form (--quick): settings, and
  params = { threads = 1 } params of every workload / [quick.targets.NAME] options

Every problem is reported as FILE:LINE: KEY: expected WHAT, got VALUE.
"""


@click.command(help=PLAN_HELP)
@click.argument("plan_file", metavar="PLAN.toml", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True,
              help="Print the whole expanded matrix, not only the summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the expanded plan as JSON.")
@click.option("--quick", is_flag=True, help="The plan's [quick] form, as `vmtax run --quick`.")
def plan_command(plan_file: str, dry_run: bool, as_json: bool, quick: bool) -> None:
    plan = load(plan_file, quick)
    if as_json:
        low = estimate(plan)
        click.echo(json.dumps({
            "plan": plan.to_dict(),
            "configurations": [{"workload": name, "params": params}
                               for name, params in configurations(plan)],
            "repetitions": _repetitions(plan),
            "estimate": {"seconds": round(low.seconds),
                         "max_seconds": round(estimate(plan, plan.max_runs).seconds
                                              if plan.max_runs else low.seconds),
                         "assumptions": low.assumptions},
        }, indent=2))
        return
    summary = _summary(plan_file, plan)
    lines = summary[:1] + ([""] + _matrix(plan) if dry_run else []) + summary[1:]
    click.echo("\n".join(lines))
