"""Workload registry: every workload name a plan may use."""

from __future__ import annotations

from vmtax.errors import VmtaxError
from vmtax.workloads.base import Metric, Workload
from vmtax.workloads import sysbench


def _workloads_of(module) -> dict[str, type[Workload]]:
    return {obj.name: obj for obj in vars(module).values()
            if isinstance(obj, type) and issubclass(obj, Workload) and "name" in vars(obj)}


WORKLOADS: dict[str, type[Workload]] = {**_workloads_of(sysbench)}


def get(name: str) -> type[Workload]:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise VmtaxError(f"unknown workload {name!r}; known workloads: "
                         + ", ".join(WORKLOADS)) from None


__all__ = ["Metric", "Workload", "WORKLOADS", "get"]
