"""`vmtax fleet status`'s table: the fleet's hosts, up or gone, their fingerprints and
what each is running."""

from __future__ import annotations

import datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from vmtax.core.text import markup as escape  # control characters too


def _since(ts: float | None) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%H:%M:%S") if ts else ""


def print_hosts(out: Console, address: str, found: list[Any]) -> None:
    """The hosts (vmtax.studies.fleet_ray.Host) of the fleet at address."""
    table = Table(title=f"fleet at {address}")
    for column in ("host", "state", "cpu", "cpus", "memory", "kernel", "running"):
        table.add_column(column)
    for h in found:
        fp = h.fingerprint
        memory = f"{fp['memory_bytes'] / 2**30:.0f} GiB" if fp.get("memory_bytes") else ""
        running = (f"{h.running['cell']}: {h.running['step']} (since "
                   f"{_since(h.running.get('since'))})" if h.running else "")
        table.add_row(escape(h.name), "up" if h.alive else "[red]gone[/red]",
                      escape(str(fp.get("cpu_model") or "")), str(fp.get("logical_cpus") or ""),
                      memory, escape(str(fp.get("kernel") or "")), escape(running))
    out.print(table)
