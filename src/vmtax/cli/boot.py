"""`vmtax boot`: N cold starts of each target configuration, side by side (E4 start-up).

    vmtax boot --target vm:tcg --count 20
    vmtax boot --target container,vm:tcg --count 10
    vmtax boot --target vm:tcg --count 10 --kernel minimal
    vmtax boot plans/microvms.toml             the plan's targets, its [boot] settings

Each start is stored as a repetition of the workload "boot" with the metrics "ready" and
"first http" (seconds), and for a guest "guest ready" (its uptime at READY), so `vmtax
show` lists them and the report draws their ECDF.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import click

from vmtax.cli import bounds
from vmtax.cli.consoles import err, out
from vmtax.cli.density import load_plan, results_option, session
from vmtax.core import plugin
from vmtax.core import target as targets
from vmtax.core.errors import VmtaxError
from vmtax.core.text import markup as escape  # control characters too
from vmtax.core.types import Metric
from vmtax.host import machine
from vmtax.studies import boot as boottime
from vmtax.studies.density import instance_specs, stored_plan
from vmtax.studies.plan import TargetSpec
from vmtax.studies.session import check_target


# The target option --kernel sets.
KERNEL = "kernel"


def with_kernel(specs: dict[str, TargetSpec], kernel: str,
                target_names: str) -> dict[str, TargetSpec]:
    """The guests among specs booting kernel, named NAME@KERNEL as `vmtax run` names a
    target an option made (vm:tcg@minimal; a path's file name: vm:tcg@vmlinuz-6.1.0)."""
    # Kinds whose options choose a kernel of their own: guests.
    kinds = [kind for kind, cls in sorted(targets.kinds().items())
             if KERNEL in plugin.option_infos(cls.Options)]
    if not any(spec.kind in kinds for spec in specs.values()):
        raise VmtaxError(f"boot: --kernel {kernel} is a guest's kernel, and --target "
                         f"{target_names} names no guest target ({', '.join(kinds[:-1])} "
                         f"or {kinds[-1]})")
    label = os.path.basename(kernel.rstrip("/")) or kernel
    renamed = {}
    for spec in specs.values():
        if spec.kind in kinds:
            spec = TargetSpec(f"{spec.name}@{label}", spec.kind, {**spec.options, KERNEL: kernel},
                              spec.written)
        renamed[spec.name] = spec
    return renamed


# What --count, --warmup and --http-timeout default to (a plan's [boot] table may say).
DEFAULTS = {"count": 20, "warmup": 1, "http_timeout": 60.0}


def plan_settings(path: str) -> tuple[dict[str, TargetSpec], dict[str, Any]]:
    """The targets that start instances and the [boot] table of a plan file."""
    values, specs = load_plan(path, command="boot")
    unknown = sorted(set(values) - set(DEFAULTS))
    if unknown:
        raise VmtaxError(f"{path}: boot.{unknown[0]}: expected one of "
                         f"{', '.join(DEFAULTS)}, got {unknown[0]!r}")
    checks = {"count": bounds.count(), "warmup": bounds.count(0),
              "http_timeout": bounds.seconds()}
    settings = {}
    for key, value in values.items():
        try:
            settings[key] = checks[key].convert(value, None, None)
        except VmtaxError as exc:   # "a value: expected ..."
            raise VmtaxError(f"{path}: boot.{key}: "
                             + str(exc).removeprefix("a value: ")) from None
    return specs, settings


@click.command("boot")
@click.argument("plan_file", metavar="[PLAN.toml]", required=False)
@click.option("--target", "target_names", metavar="NAME[,NAME...]",
              help="Target(s) to start, e.g. vm:tcg or container,vm:tcg. [default: the "
                   "plan's that start instances]")
@click.option("--count", type=bounds.count(),
              help=f"Measured cold starts per target. [default: the plan's [boot] count, "
                   f"else {DEFAULTS['count']}]")
@click.option("--warmup", type=bounds.count(0),
              help="Unrecorded starts first (builds the image and rootfs caches). "
                   f"[default: {DEFAULTS['warmup']}]")
@click.option("--http-timeout", type=bounds.seconds(),
              help="Seconds an instance may take to answer HTTP. "
                   f"[default: {DEFAULTS['http_timeout']:g}]")
@click.option("--kernel", metavar="KERNEL", help='Guest kernel of the vm targets: "debian", '
              '"debian-rt", "minimal" or a path. [default: the target\'s, "debian"]')
@results_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def boot_command(plan_file: str | None, target_names: str | None, count: int | None,
                 warmup: int | None, http_timeout: float | None, kernel: str | None,
                 results: str, as_json: bool) -> None:
    """Cold-start each target COUNT times, one at a time: time to ready and to the first
    HTTP answer, p50/p90/p99/max. With PLAN.toml (a plan with a [boot] table, as
    plans/microvms.toml has), the plan's targets that start instances, as it configures
    them."""
    settings: dict[str, Any] = dict(DEFAULTS)
    if plan_file is not None:
        specs, planned = plan_settings(plan_file)
        settings.update(planned)
    if target_names:
        specs = instance_specs([n.strip() for n in target_names.split(",") if n.strip()])
    elif plan_file is None:
        raise VmtaxError("boot: name the targets to start (--target NAME[,NAME...]) or give "
                         "a plan file")
    given = {"count": count, "warmup": warmup, "http_timeout": http_timeout}
    settings.update({k: v for k, v in given.items() if v is not None})
    count, warmup, http_timeout = (settings["count"], settings["warmup"],
                                   settings["http_timeout"])
    target_names = target_names or ",".join(specs)
    if kernel is not None:
        specs = with_kernel(specs, kernel, target_names)
    for spec in specs.values():   # a bad option says so before a run is made
        check_target(spec)
    found: dict[str, dict[str, dict[str, float]]] = {}
    with session(results) as s:
        run_id = s.new_run(stored_plan(boottime.WORKLOAD, specs, runs=count, warmup=warmup))
        err.print(f"boot run {run_id} on network {s.network.name}")
        for name, spec in specs.items():
            target = s.create(spec)

            def store(i: int, start: boottime.Start, name: str = name) -> None:
                metrics = [Metric("ready", start.ready, "s", False)]
                if start.http is not None:
                    metrics.append(Metric("first http", start.http, "s", False))
                if start.guest is not None:
                    metrics.append(Metric("guest ready", start.guest, "s", False))
                err.print(f"{escape(name)} start {i + 1}/{count}: ready {start.ready:.3f} s"
                          + ("" if start.guest is None
                             else f" (guest's uptime then {start.guest:.3f} s)") + ", "
                          + ("no HTTP answer" if start.http is None
                             else f"first HTTP answer {start.http:.3f} s"))
                s.store.add_rep(run_id, target=name, workload=boottime.WORKLOAD, params={},
                                phase="measure", idx=i,
                                status="ok" if start.http is not None else "failed",
                                error=None if start.http is not None else "no HTTP answer",
                                argv=["boot"], started=time.time(), metrics=metrics)

            starts = boottime.run(target, s.network, count, warmup, http_timeout, store)
            s.store_fingerprint(name)
            target.cleanup()
            found[name] = {
                "ready": boottime.distribution([x.ready for x in starts]),
                "first http": boottime.distribution([x.http for x in starts
                                                     if x.http is not None])}
            if any(x.guest is not None for x in starts):
                found[name]["guest ready"] = boottime.distribution(
                    [x.guest for x in starts if x.guest is not None])
                # The VMM's own part: its start to the guest's first instant (ready less
                # the guest's uptime then), apart from the kernel's and /init's.
                found[name]["vmm before the guest"] = boottime.distribution(
                    [x.ready - x.guest for x in starts if x.guest is not None])
    if as_json:
        click.echo(json.dumps({"run": run_id, "targets": found}, indent=1))
        return
    lab = machine.lab()   # vmtax lab: a nested KVM's boots, never hardware's
    from vmtax.report import density_tables

    density_tables.print_starts(out, found, count, lab)
    out.print(f"stored as run {run_id}")
