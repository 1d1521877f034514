"""`vmtax doctor`'s table: each check of the host (vmtax.host.doctor, and the collectors'
own), ok or not, with what to do."""

from __future__ import annotations

from typing import Protocol, Sequence

from rich.console import Console
from rich.table import Table

from vmtax.core.text import markup as escape  # control characters too


class Check(Protocol):
    """A check as vmtax.host.doctor makes it (a renderer imports nothing of the host)."""
    name: str
    ok: bool
    detail: str


def print_checks(out: Console, checks: Sequence[Check]) -> None:
    table = Table(title="vmtax doctor", show_lines=False)
    table.add_column("check")
    table.add_column("", justify="center")
    table.add_column("detail")
    for c in checks:
        table.add_row(escape(c.name), "[green]ok[/green]" if c.ok else "[red]no[/red]",
                      escape(c.detail))
    out.print(table)
