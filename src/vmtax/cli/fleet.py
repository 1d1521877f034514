"""`vmtax fleet start|join|status`, and what `vmtax run --fleet` prints (vmtax.studies.fleet,
imported where used: with the runner and analysis it would slow every vmtax command)."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

import click

from vmtax.cli.consoles import err, out
from vmtax.core.errors import VmtaxError
from vmtax.core.text import markup as escape  # control characters too
from vmtax.results.store import Store

if TYPE_CHECKING:
    from vmtax.studies.plan import Plan


temp_dir_option = click.option(
    "--ray-temp-dir", type=click.Path(file_okay=False),
    help="Ray's session files and logs on this host. [default: Ray's, /tmp/ray]")


@click.group("fleet")
def fleet_command() -> None:
    """Run plans on many hosts through Ray: one head, one Ray node per benchmark host.

    \b
      vmtax fleet start                       on the head (stays up; Ctrl-C stops it)
      vmtax fleet join HEAD:6379 --name h1    on each benchmark host (stays up)
      vmtax fleet status --fleet HEAD:6379    the hosts and what each runs
      vmtax run PLAN.toml --fleet HEAD:6379 --spread hosts|cells
      vmtax fleet show last                   each target's ratio per host, and its spread
      vmtax compare last@h1 last@h2           one host against another
    """


@fleet_command.command()
@click.option("--port", type=click.IntRange(1, 65535), default=6379, show_default=True,
              help="Port of the head (the address hosts join is HEAD_IP:PORT).")
@temp_dir_option
def start(port: int, ray_temp_dir: str | None) -> None:
    """Start the fleet's head here, until Ctrl-C. It runs no workload itself."""
    from vmtax.studies import fleet_ray

    address = f"127.0.0.1:{port}"

    def up(ray: ModuleType) -> None:
        head = next(n["NodeManagerAddress"] for n in ray.nodes()
                    if "node:__internal_head__" in n.get("Resources", {}))
        click.echo(f"fleet head up at {head}:{port}; on each benchmark host run:\n"
                   f"  vmtax fleet join {head}:{port} --name NAME\n"
                   "Ctrl-C stops the head.", err=True)

    _serve(fleet_ray.head_argv(port, ray_temp_dir), fleet_ray.ray_log(f"head-{port}"), address,
           None, None, up)


@fleet_command.command()
@click.argument("head", metavar="HEAD_ADDRESS")
@click.option("--name", required=True, help="This host's name in the fleet (--hosts NAME).")
@click.option("--results", "results", default=os.environ.get("VMTAX_RESULTS", "results"),
              show_default=True, type=click.Path(file_okay=False),
              help="This host's own results directory: every repetition it runs is kept "
                   "there too.")
@temp_dir_option
def join(head: str, name: str, results: str, ray_temp_dir: str | None) -> None:
    """Join the fleet at HEAD_ADDRESS as benchmark host NAME, until Ctrl-C."""
    from vmtax.studies import fleet_ray

    fleet_ray.check_name(name)
    fleet_ray.check_head(head)    # before Ray, which would retry a wrong address for minutes
    results = os.path.abspath(results)
    Store(results).close()    # a results directory that cannot be written fails here
    env = {**os.environ, "VMTAX_RESULTS": results,   # for the runner in Ray's workers
           # Ray kills the processes a dead worker left, vmtax's guardian among them; it
           # must live on to undo what the runner changed (vmtax's own die with the worker).
           "RAY_kill_child_processes_on_worker_exit": "false",
           "RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper": "false"}

    def up(ray: ModuleType) -> None:
        fleet_ray.register(name, results)
        click.echo(f"joined the fleet at {head} as {name} (results kept in {results}); "
                   "Ctrl-C leaves it.", err=True)

    _serve(fleet_ray.join_argv(head, name, ray_temp_dir), fleet_ray.ray_log(f"join-{name}"), head,
           name, env, up)


def _serve(argv: list[str], log: Path, address: str, name: str | None,
           env: dict[str, str] | None, up: Callable[[ModuleType], None]) -> None:
    from vmtax.studies import fleet_ray

    try:
        fleet_ray.serve(argv, log, address, name, env, up)
    except KeyboardInterrupt:
        click.echo("stopped", err=True)


@fleet_command.command()
@click.option("--fleet", "address", required=True, metavar="HEAD_ADDRESS",
              help="The head's address, HEAD_IP:PORT.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def status(address: str, as_json: bool) -> None:
    """The fleet's hosts: up or gone, their fingerprints, and what each is running."""
    from vmtax.studies import fleet_ray

    with fleet_ray.connected(address) as ray:
        found = fleet_ray.hosts(ray)
    if as_json:
        import json
        click.echo(json.dumps([vars(h) for h in found], indent=2))
        return
    if not found:
        out.print(f"no host has joined the fleet at {address} yet")
        return
    from vmtax.report import fleet_tables

    fleet_tables.print_hosts(out, address, found)


def run_on_fleet(plan: "Plan", store: Store, address: str | None, hosts: list[str] | None,
                 spread: str | None, resume: str | None, reporter: Any,
                 show: Callable[[Store, str], None],
                 document: Callable[[Store, str], dict[str, Any]] | None) -> None:
    """`vmtax run ... --fleet HEAD`: the plan on the fleet, then each stored run: shown, or
    with document (--json) one JSON document of every run, as document makes each, and the
    spread across hosts."""
    if not address:
        raise VmtaxError("--hosts and --spread run on a fleet: give --fleet HEAD_ADDRESS")
    from vmtax.studies import fleet

    outcome = fleet.run(plan, store, address, hosts, spread, reporter, resume)
    if not outcome.runs:
        raise VmtaxError("nothing was stored: " + "; ".join(outcome.failures))
    if document is not None:
        import json

        run, per_host, rows = spread_of(store, outcome.runs[0][0])
        click.echo(json.dumps({"fleet": run.host["fleet"],
                               "runs": [{"on": whose, **document(store, run_id)}
                                        for run_id, whose in outcome.runs],
                               "spread": [r.to_json() for r in rows],
                               "failures": outcome.failures}, indent=2, default=str))
    else:
        for run_id, whose in outcome.runs:
            out.print(f"[bold]{escape(whose)}[/bold]")
            show(store, run_id)
        print_spread(store, outcome.runs[0][0])
    for line in outcome.failures:
        err.print(f"[yellow]fleet:[/yellow] {escape(line)}")


def spread_of(store: Store, spec: str) -> tuple[Any, dict[str, Any], list[Any]]:
    """The run spec names (as `vmtax show` takes it), its fleet run set per host, and the
    spread of each target's ratio across those hosts."""
    from vmtax.analysis.spread import spread
    from vmtax.studies import fleet

    run = store.load_run(spec)
    per_host = fleet.host_runs(store, run)
    return run, per_host, spread(per_host)


def print_spread(store: Store, spec: str) -> None:
    from vmtax.report import comparison_table as report

    run, per_host, rows = spread_of(store, spec)
    info = run.host["fleet"]
    report.print_spread(out, rows, list(per_host),
                        f"across {len(per_host)} host{'s' * (len(per_host) != 1)} "
                        f"(fleet {info.get('id') or run.id}, --spread {info['spread']}): "
                        + ", ".join(f"{h} {r.id}" for h, r in per_host.items()))


@fleet_command.command()
@click.argument("run_id", default="last")
@click.option("--results", "results", default=os.environ.get("VMTAX_RESULTS", "results"),
              show_default=True, type=click.Path(file_okay=False),
              help="Results directory (one SQLite database in it).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def show(run_id: str, results: str, as_json: bool) -> None:
    """A fleet run across its hosts: per target, its ratio to the baseline on each host and
    the spread (median, min–max). RUN_ID is any run of it (a prefix, a name or 'last')."""
    store = Store(results, readonly=True)
    if as_json:
        import json

        run, per_host, rows = spread_of(store, run_id)
        click.echo(json.dumps({"fleet": run.host["fleet"],
                               "runs": {h: r.id for h, r in per_host.items()},
                               "spread": [r.to_json() for r in rows]}, indent=2))
        return
    print_spread(store, run_id)
