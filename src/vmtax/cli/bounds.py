"""Numbers the flags take, bounded above as plan keys are (vmtax.core.limits): a value out
of range is vmtax's one-line error naming the flag, never an overflow later (a wait of
3000 years is more than a poll can take). Every flag that takes a number takes it through
Bounded: finite, within the range its help states (`words`), one line otherwise; NaN
fails every comparison, so it is refused too."""

from __future__ import annotations

import math
from typing import Any

import click

from vmtax.core.errors import VmtaxError
from vmtax.core.limits import MAX_COUNT, MAX_SECONDS
from vmtax.core.text import printable


class Bounded(click.ParamType[float]):
    """A whole number or a number from low to high (above low when low_open)."""

    def __init__(self, kind: type[int] | type[float], low: float, high: float,
                 unit: str = "", low_open: bool = False, metavar: str | None = None):
        self.kind, self.low, self.high, self.low_open = kind, low, high, low_open
        self.metavar = metavar or ("N" if kind is int else "S")
        self.name = "integer" if kind is int else "float"
        self.words = (f"{'a whole number' if kind is int else 'a number'}"
                      f"{' of ' + unit if unit else ''} "
                      f"{'above' if low_open else 'from'} {low} "
                      f"{'and at most' if low_open else 'to'} {high}")

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return self.metavar

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        flag = param.opts[0] if param is not None and param.opts else "a value"
        try:
            number = self.kind(value)
        except (TypeError, ValueError, OverflowError):
            number = math.nan
        if not (self.low < number if self.low_open else self.low <= number) \
                or not number <= self.high:   # NaN fails both
            raise VmtaxError(f"{flag}: expected {self.words}, got {printable(str(value))}")
        return number


def count(low: int = 1) -> Bounded:
    """A count (of repetitions, instances, lines): a whole number from low to MAX_COUNT."""
    return Bounded(int, low, MAX_COUNT)


def seconds(low: float = 1, whole: bool = False, low_open: bool = False,
            high: float = MAX_SECONDS) -> Bounded:
    """A duration in seconds, from low to high (above low when low_open)."""
    return Bounded(int if whole else float, low, high, "seconds", low_open)


def number(low: float, high: float, low_open: bool = False) -> Bounded:
    """A real number from low to high (above low when low_open)."""
    return Bounded(float, low, high, low_open=low_open, metavar="X")


# A significance level, after the adjustment across metrics or series. Below 0.001 a
# trend's permutation tests would need millions of draws per series to reach it (and
# compare's bootstrap as many); above 0.5, noise alone would be called a change more
# often than not.
ALPHA = number(0.001, 0.5)
# A relative change (0.02: 2%) below which no change is called; 1 is a doubling.
NOISE_FLOOR = number(0, 1)
