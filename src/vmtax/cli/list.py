"""`vmtax list targets|workloads`: every plugin with its options, units, defaults, metrics,
and for targets whether this host can run them, all read from the plugins' declarations."""

from __future__ import annotations

import json

import click

from vmtax.cli.consoles import out


@click.command()
@click.argument("what", type=click.Choice(["targets", "workloads", "collectors", "packages"]))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--plan", "plan_file", metavar="PLAN.toml|default",
              help="With packages: only those this plan needs (default: what `vmtax run` "
                   "runs without a plan file), as `make run` installs them.")
def list_command(what: str, as_json: bool, plan_file: str | None) -> None:
    """Every target kind or workload: options (type, unit, default, range), metrics, and
    whether this host can run each target; or (packages) the Debian packages all plugins
    need, one per line, which the set-up script installs."""
    from vmtax.core import plugin  # pydantic: not for `vmtax --help`
    from vmtax.core import target as targets
    from vmtax.core import workload as workloads

    if plan_file is not None and what != "packages":
        raise click.UsageError("--plan goes with `list packages`")
    if what == "packages":
        if plan_file is not None:
            from vmtax.studies import plan as plan_mod
            from vmtax.studies import planfile

            the_plan = (plan_mod.from_names(*plan_mod.classic_names()) if plan_file == "default"
                        else planfile.load(plan_file, False))
            needed = sorted(plan_mod.packages(the_plan))
        else:
            needed = sorted({p for group in plugin.registry().values()
                             for cls in group.values()
                             for p in (*cls.packages, *cls.option_packages)})
        click.echo(json.dumps(needed) if as_json else "\n".join(needed))
        return
    plugins = (targets.kinds() if what == "targets" else workloads.registered()
               if what == "workloads" else plugin.plugins("collector"))
    from vmtax.report import plugin_tables

    described = [cls.describe() for cls in plugins.values()]  # type: ignore[attr-defined]
    if as_json:
        click.echo(json.dumps(described, indent=2, default=str))
    elif what == "targets":
        plugin_tables.print_targets(out, described)
    else:
        # a collector reads like a workload without a command
        plugin_tables.print_workloads(out, described)
