"""`vmtax list`'s tables: each target kind or workload as its plugin describes itself
(Plugin.describe()): options, units, defaults, metrics, and whether this host can run it."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from vmtax.core.text import markup as escape  # control characters too


def options_table(options: list[dict[str, Any]]) -> Table:
    table = Table(show_header=True, box=None, padding=(0, 1), pad_edge=False)
    for column in ("option", "default", "unit", "takes"):
        table.add_column(column, overflow="fold")
    for o in options:
        default = "—" if o["default"] in (None, []) else json.dumps(o["default"])
        table.add_row(escape(o["name"]), escape(default), escape(o["unit"] or ""),
                      escape(o["expected"]) + ("\n[dim]" + escape(o["doc"]) + "[/dim]"
                                               if o["doc"] else "") + _tune_text(o))
    return table


def _tune_text(option: dict[str, Any]) -> str:
    """The values `vmtax tune` tries for a knob, and what each unsafe one gives up: what
    --json lists, said in the table too."""
    tried = option.get("tune") or []
    if not tried:
        return ""
    text = ("\n[cyan]vmtax tune tries: "
            + escape(", ".join(json.dumps(t["value"]) for t in tried)) + "[/cyan]")
    return text + "".join(f"\n[yellow]⚠ {escape(json.dumps(t['value']))} is unsafe: "
                          f"{escape(t['safety'])}[/yellow]" for t in tried if t.get("safety"))


def print_targets(out: Console, described: list[dict[str, Any]]) -> None:
    for kind in described:
        mark = "[green]available[/green]" if kind["available"] else (
            "[red]unavailable[/red]: " + escape(kind["why_not"]))
        out.print(f"[bold]{escape(kind['name'])}[/bold] — {escape(kind['description'])} ({mark})")
        for v in kind["variants"]:
            state = ("[green]ok[/green]" if v["available"]
                     else "[red]no[/red]: " + escape(v["why_not"]))
            out.print(f"  {escape(v['name'])}: {state}")
        if kind["options"]:
            out.print(options_table(kind["options"]))
        out.print()


def needs(plugin: dict[str, Any]) -> str:
    """What a workload or collector needs on the host: its programs, else its Debian
    packages (a collector names those: exits and profile need perf), else nothing."""
    binaries, packages = plugin.get("binaries", []), plugin.get("packages", [])
    if binaries:
        return ", ".join(binaries)
    return f"the Debian package{'s' * (len(packages) != 1)} {', '.join(packages)}" if packages \
        else "nothing"


def print_workloads(out: Console, described: list[dict[str, Any]]) -> None:
    for w in described:
        out.print(f"[bold]{escape(w['name'])}[/bold] — {escape(w['description'])}")
        out.print(f"  needs: {escape(needs(w))}"
                  + (f"; time option: {w['time_option']}" if w.get("time_option") else ""))
        metrics = Table(show_header=True, box=None, padding=(0, 1), pad_edge=False)
        for column in ("metric", "unit", "better", "group"):
            metrics.add_column(column)
        for m in w["metrics"]:
            name = m["name"] + (" (primary)" if m.get("primary") else "") + (
                f" per {', '.join(m['dimensions'])}" if m["dimensions"] else "")
            metrics.add_row(escape(name), escape(m["unit"]), m["direction"],
                            escape(m.get("group") or ("secondary" if m.get("secondary") else "")))
        out.print(metrics)
        if w["options"]:
            out.print(options_table(w["options"]))
        out.print()
