"""A plan's sweeps: a list of values is a dimension, a zip table's lists one more.

`sweep` checks one target's options or one workload's params and gives its fixed values
and its dimensions (`Axis`); `configurations` counts the points of their cartesian
product (vmtax.studies.plan_bounds bounds them before any is made), which `expand` then
lists, in the order written. `label` writes a swept value
the way a target's name shows it (`vm[pin=0+1]`).

May import: `vmtax.core`, `vmtax.studies.toml_lines`, `vmtax.studies.plan_checks`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from vmtax.core import plugin
from vmtax.studies.plan_checks import Checker, CheckOf
from vmtax.studies.toml_lines import KeyPath, show

# One configuration: (all its values, the swept ones among them).
Point = tuple[dict[str, Any], dict[str, Any]]


@dataclass
class Axis:
    """One sweep dimension: the keys it sets and, per step, their values."""
    keys: tuple[str, ...]
    steps: list[tuple[Any, ...]]


@dataclass
class Sweep:
    """One table's values: those it fixes, and the dimensions it sweeps."""
    fixed: dict[str, Any]
    axes: list[Axis]

    @property
    def configurations(self) -> int:
        """How many points expand() gives, counted without listing them."""
        return math.prod(len(axis.steps) for axis in self.axes)

    @property
    def shape(self) -> str:
        """The product configurations counts, as `100 × 100 × 3`."""
        return " × ".join(str(len(axis.steps)) for axis in self.axes) or "1"

    def expand(self) -> list[Point]:
        """(all values, swept values) of every point of the cartesian product of axes."""
        points = []
        for combo in itertools.product(*(axis.steps for axis in self.axes)):
            swept = {k: v for axis, step in zip(self.axes, combo)
                     for k, v in zip(axis.keys, step)}
            points.append(({**self.fixed, **swept}, swept))
        return points


def params_text(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={label(v)}" for k, v in params.items())


def label(value: Any) -> str:
    """A swept value in a target name: vm[pin=0+1], vm[hugepages=none]."""
    if value is None:
        return "none"
    if isinstance(value, list):
        return "+".join(map(str, value))
    return str(value)


def replace(values: dict[str, Any], key: str, value: Any,
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


def _values(checker: Checker, path: KeyPath, check: plugin.OptionInfo,
            value: Any) -> tuple[list[Any] | None, bool]:
    """(checked values, is a sweep); None when a value was wrong."""
    takes_list = check.takes_list
    sweeps = isinstance(value, list) and (
        not takes_list or all(isinstance(v, list) or v == "none" for v in value))
    if not sweeps:
        ok, checked = checker.check(path, check, value)
        return ([checked] if ok else None), False
    if not value:
        checker.bad(path, "a value or a non-empty list of values to sweep", "[]")
        return None, True
    results = [checker.check(path + (i,), check, v) for i, v in enumerate(value)]
    return ([v for _, v in results] if all(ok for ok, _ in results) else None), True


def sweep(checker: Checker, path: KeyPath, given: dict[str, Any], zip_path: KeyPath,
          zipped: Any, check_of: CheckOf) -> Sweep | None:
    """One target's options or one workload's params, checked; None after an error."""
    fixed: dict[str, Any] = {}
    axes: list[Axis] = []
    failed = False
    for key, value in given.items():
        check = check_of(path + (key,), key)
        if check is None:
            failed = True
            continue
        checked, is_sweep = _values(checker, path + (key,), check, value)
        if checked is None:
            failed = True
        elif is_sweep:
            axes.append(Axis((key,), [(v,) for v in checked]))
        else:
            fixed[key] = checked[0]
    if zipped is not None:
        axis = _zip_axis(checker, zip_path, zipped, given, check_of)
        if axis is None:
            failed = True
        else:
            axes.append(axis)
    return None if failed else Sweep(fixed, axes)


def _zip_axis(checker: Checker, path: KeyPath, zipped: Any, given: dict[str, Any],
              check_of: CheckOf) -> Axis | None:
    table = checker.table(path, zipped, "a table of equally long lists, like "
                                        '{ a = [1, 2], b = ["x", "y"] }')
    if table is None:
        return None
    if not table:
        checker.bad(path, "at least one list of values", "{ }")
        return None
    columns: dict[str, list[Any]] = {}
    failed = False
    for key, value in table.items():
        check = check_of(path + (key,), key)
        if check is None:
            failed = True
        elif key in given:
            checker.bad(path + (key,), "each key either swept in zip or set outside it",
                        "both")
            failed = True
        elif not isinstance(value, list) or not value:
            checker.bad(path + (key,), "a non-empty list of values", show(value))
            failed = True
        else:
            results = [checker.check(path + (key, i), check, v) for i, v in enumerate(value)]
            columns[key] = [v for _, v in results]
            failed = failed or not all(ok for ok, _ in results)
    lengths = {key: len(v) for key, v in table.items() if isinstance(v, list)}
    if len(set(lengths.values())) > 1:
        first = next(iter(lengths))
        for key, n in lengths.items():
            if n != lengths[first]:
                checker.bad(path + (key,), f"{lengths[first]} values, as many as {first} has",
                            str(n))
        failed = True
    if failed:
        return None
    return Axis(tuple(columns), list(zip(*columns.values())))
