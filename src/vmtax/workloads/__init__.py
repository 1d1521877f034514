"""Workloads: every module of this package may define some (see vmtax.plugin)."""

from __future__ import annotations

from vmtax import plugin
from vmtax.workloads.base import Workload


def registered() -> dict[str, type[Workload]]:
    """Workload name -> class, built-in and third-party."""
    return plugin.plugins(Workload.group)  # type: ignore[return-value]


def get(name: str) -> type[Workload]:
    return plugin.get(Workload.group, name)  # type: ignore[return-value]


__all__ = ["Workload", "get", "registered"]
