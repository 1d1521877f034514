"""Collectors: every module of this package may define some (see vmtax.plugin and
vmtax.collectors.base)."""

from __future__ import annotations

from vmtax import plugin
from vmtax.collectors.base import Collector, CollectorError, Subject


def registered() -> dict[str, type[Collector]]:
    """Collector name -> class, built-in and third-party."""
    return plugin.plugins(Collector.group)  # type: ignore[return-value]


def get(name: str) -> type[Collector]:
    """The collector named `name`; VmtaxError naming the known ones when there is none."""
    return plugin.get(Collector.group, name)  # type: ignore[return-value]


__all__ = ["Collector", "CollectorError", "Subject", "get", "registered"]
