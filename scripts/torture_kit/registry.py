"""The registry of attacks: each is declared once, in a module of its own, and found there.

An attack module is any module of the `torture_attacks` namespace package: every
directory named `torture_attacks` on the import path adds its modules, as namespace
packages do for plugins (scripts/torture_attacks/ is vmtax's own). A module declares its
attacks as module-level `Attack` values (one, or a list or tuple of them for a family:
the kill attacks are one per target, signal and moment). Nothing else names them: the
driver (scripts/torture.py) runs what it finds, in the order of the modules' names. Two
attacks of one name are refused when found, naming both modules.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

if TYPE_CHECKING:
    from torture_kit.env import Env, Outcome

PACKAGE = "torture_attacks"
QUICK, FULL = "quick", "full"
BOTH = frozenset({QUICK, FULL})


class DuplicateAttack(Exception):
    """Two attacks found under one name."""


@dataclass(frozen=True)
class Attack:
    """One attack: what it attacks (a command, a file, the host), what must hold after it
    (its outcome has no problem otherwise), and how it is run: run(env, outcome, quick)
    fills outcome, with smaller counts when quick. forms says in which of the two forms
    (`--quick`, what `make test` runs, and the full one) it runs. covers names the options
    and arguments of vmtax's commands that name a path (coverage.path_options) to which it
    gives a path meant to escape its tree."""
    name: str
    attacks: str
    expects: str
    run: Callable[[Env, Outcome, bool], None]
    forms: frozenset[str] = BOTH
    covers: frozenset[tuple[str, ...]] = frozenset()


def _declared(value: object) -> Iterable[Attack]:
    if isinstance(value, Attack):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, Attack) for v in value):
        return value
    return []


def discover() -> list[Attack]:
    """Every attack in the modules of the torture_attacks package, by module name then as
    each module declares them."""
    package = importlib.import_module(PACKAGE)
    importlib.invalidate_caches()
    found: dict[str, tuple[Attack, str]] = {}
    ordered = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{PACKAGE}.{info.name}")
        for value in list(vars(module).values()):
            for attack in _declared(value):
                if attack.name in found and found[attack.name][0] is not attack:
                    raise DuplicateAttack(f"two attacks named {attack.name!r}: in "
                                          f"{found[attack.name][1]} and {module.__name__}")
                if attack.name not in found:
                    found[attack.name] = attack, module.__name__
                    ordered.append(attack)
    return ordered


def selected(attacks: Iterable[Attack], quick: bool, only: str | None) -> Iterator[Attack]:
    """The attacks of one form; with only, those whose name holds it."""
    form = QUICK if quick else FULL
    for attack in attacks:
        if form in attack.forms and (only is None or only in attack.name):
            yield attack
