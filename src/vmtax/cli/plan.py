"""`vmtax plan`: check a plan file and show what it would run."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from vmtax.studies.plan import Plan


def _repetitions(plan: Plan) -> int:
    return len(plan.targets) * len(plan.workloads) * (plan.warmup + plan.runs)


def _summary(source: str, plan: Plan) -> list[str]:
    from vmtax.studies.estimate import duration, estimate

    n_targets, n_configs = len(plan.targets), len(plan.workloads)
    runs = (f"{plan.runs} to {plan.max_runs} measured, until the CI is within "
            f"{plan.ci_target:.0%}" if plan.max_runs else f"{plan.runs} measured")
    lines = [f"{source}: {n_targets} target{'s' * (n_targets != 1)} × {n_configs} workload "
             f"configuration{'s' * (n_configs != 1)} × ({plan.warmup} warm-up + {runs}) = "
             f"{'at least ' * bool(plan.max_runs)}{_repetitions(plan)} repetitions"]
    low = estimate(plan)
    span = duration(low.seconds)
    if plan.max_runs:
        span += f" to {duration(estimate(plan, plan.max_runs).seconds)}"
    lines += ["", f"estimated run time: {span}, assuming"]
    lines += [f"  - {a}" for a in low.assumptions]
    return lines


def _matrix(plan: Plan) -> list[str]:
    from vmtax.studies.estimate import configurations
    from vmtax.studies.plan_sweeps import params_text

    lines = [f"targets (baseline: {plan.baseline})"]
    width = max(len(t.name) for t in plan.targets)
    kind_width = max(len(t.kind) for t in plan.targets)
    for t in plan.targets:
        lines.append(f"  {t.name:<{width}}  {t.kind:<{kind_width}}  "
                     f"{params_text(t.options)}".rstrip())
    lines += ["", "workload configurations (parameters as run)"]
    configs = configurations(plan)
    for name in dict.fromkeys(n for n, _ in configs):
        mine = [params for n, params in configs if n == name]
        # Parameters every configuration shares are printed once, above the ones that vary.
        common = {k: v for k, v in mine[0].items() if all(p.get(k, k) == v for p in mine)}
        lines.append(f"  {name}: {params_text(common)}".rstrip())
        if len(mine) > 1:
            lines += [f"    {params_text({k: v for k, v in p.items() if k not in common})}"
                      for p in mine]
    order = ("interleaved across targets (A B B A), so drift cancels" if plan.interleave
             else "each target's repetitions in one block")
    time = "each workload's own limit" if plan.time is None else f"{plan.time} s"
    caches = (["page caches: the host's and each target's dropped before every repetition"]
              if plan.drop_caches else [])
    return lines + ["", f"time per time-bounded run: {time}; order: {order}", *caches]


PLAN_HELP = """Check a plan file and show what it would run; nothing is run.

\b
A plan file is TOML (see plans/ for complete examples):
  runs = 3                 measured repetitions; warmup = 1 runs first, discarded
  time = 2                 seconds per time-bounded run (false: no limit)
  baseline = "native"      ratios are relative to this target
  [targets.native]         kind defaults to the table name when it is a kind;
  [targets."vm:tcg"]       a name as --targets takes sets its variant too
  [targets.fast]
  kind = "vm"              a target kind (vmtax list targets); other keys: its options
  vcpus = [1, 2]           a list sweeps: fast[vcpus=1], fast[vcpus=2]
  [[workloads]]
  name = "memory"          a workload (vmtax list workloads)
  params = { threads = [1, 2, 4] }    the workload's options; lists multiply
  zip = { memory-block-size = ["16K", "1M"], memory-total-size = ["1G", "8G"] }
                           zip lists vary together (pairwise, not multiplied)
  [quick]                  the short form (--quick): settings, and
  params = { threads = 1 } params of every workload / [quick.targets.NAME] options

Every problem is reported as FILE:LINE: KEY: expected WHAT, got VALUE.
"""


@click.command(help=PLAN_HELP)
@click.argument("plan_file", metavar="PLAN.toml", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True,
              help="Print the whole expanded matrix, not only the summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the expanded plan as JSON.")
@click.option("--quick", is_flag=True, help="The plan's [quick] form, as `vmtax run --quick`.")
def plan_command(plan_file: str, dry_run: bool, as_json: bool, quick: bool) -> None:
    from vmtax.studies.estimate import configurations, estimate
    from vmtax.studies.planfile import load

    plan = load(plan_file, quick)
    if as_json:
        low = estimate(plan)
        click.echo(json.dumps({
            "plan": plan.to_dict(),
            "configurations": [{"workload": name, "params": params}
                               for name, params in configurations(plan)],
            "repetitions": _repetitions(plan),
            "estimate": {"seconds": round(low.seconds),
                         "max_seconds": round(estimate(plan, plan.max_runs).seconds
                                              if plan.max_runs else low.seconds),
                         "assumptions": low.assumptions},
        }, indent=2))
        return
    click.echo(describe(plan_file, plan, matrix=dry_run))


def warnings(plan: Plan) -> list[str]:
    """What in a valid plan will not measure what it seems to: more vCPUs than this host
    has CPUs (they then take turns, and the result is contention); a collector that cannot
    record on this host at all (its doctor line says why)."""
    from vmtax.core import collector as collectors

    usable = len(os.sched_getaffinity(0))
    found = [f"{t.name}: vcpus = {t.options['vcpus']} is more than the {usable} CPUs this "
             "host lets vmtax use: the vCPUs take turns on them"
             for t in plan.targets
             if isinstance(t.options.get("vcpus"), int) and t.options["vcpus"] > usable]
    for name in plan.collect:
        line = collectors.get(name).doctor()
        if line is not None and not line[0]:
            found.append(f"--collect {name}: {line[1]}; it would record nothing here")
    return found


def describe(source: str, plan: Plan, matrix: bool) -> str:
    """What a plan runs and how long it should take (`vmtax plan`, `vmtax run --dry-run`);
    with matrix, every target and workload configuration as they will run."""
    summary = _summary(source, plan)
    return "\n".join(summary[:1] + ([""] + _matrix(plan) if matrix else []) + summary[1:]
                     + [f"warning: {w}" for w in warnings(plan)])
