"""`vmtax list targets|workloads`: every plugin with its options, units, defaults, metrics,
and for targets whether this host can run them, all read from the plugins' declarations."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from vmtax.core.text import markup as escape  # control characters too

out = Console(highlight=False)


def _options_table(options: list[dict[str, Any]]) -> Table:
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


def _show_targets(described: list[dict[str, Any]]) -> None:
    for kind in described:
        mark = "[green]available[/green]" if kind["available"] else (
            "[red]unavailable[/red]: " + escape(kind["why_not"]))
        out.print(f"[bold]{escape(kind['name'])}[/bold] — {escape(kind['description'])} ({mark})")
        for v in kind["variants"]:
            state = ("[green]ok[/green]" if v["available"]
                     else "[red]no[/red]: " + escape(v["why_not"]))
            out.print(f"  {escape(v['name'])}: {state}")
        if kind["options"]:
            out.print(_options_table(kind["options"]))
        out.print()


def _show_workloads(described: list[dict[str, Any]]) -> None:
    for w in described:
        out.print(f"[bold]{escape(w['name'])}[/bold] — {escape(w['description'])}")
        out.print(f"  needs: {escape(', '.join(w.get('binaries', [])) or 'nothing')}"
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
            out.print(_options_table(w["options"]))
        out.print()


@click.command()
@click.argument("what", type=click.Choice(["targets", "workloads", "collectors", "packages"]))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def list_command(what: str, as_json: bool) -> None:
    """Every target kind or workload: options (type, unit, default, range), metrics, and
    whether this host can run each target; or (packages) the Debian packages all plugins
    need, one per line, which the set-up script installs."""
    from vmtax.core import plugin  # pydantic: not for `vmtax --help`
    from vmtax.core import target as targets
    from vmtax.core import workload as workloads

    if what == "packages":
        needed = sorted({p for group in plugin.registry().values() for cls in group.values()
                         for p in cls.packages})
        click.echo(json.dumps(needed) if as_json else "\n".join(needed))
        return
    plugins = (targets.kinds() if what == "targets" else workloads.registered()
               if what == "workloads" else plugin.plugins("collector"))
    described = [cls.describe() for cls in plugins.values()]  # type: ignore[attr-defined]
    if as_json:
        click.echo(json.dumps(described, indent=2, default=str))
    elif what == "targets":
        _show_targets(described)
    else:
        _show_workloads(described)   # a collector reads like a workload without a command
