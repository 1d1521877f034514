"""`vmtax density` (E4): instances of each target started until memory or `--max` says
stop, memory per instance with KSM off and on; and the session both it and `vmtax boot`
run in (journal and guardian, results store, network, targets carrying nginx).

    vmtax density --targets container,vm:tcg --max 32
    vmtax density plans/density.toml [--quick]
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
from typing import Any, Iterable, Iterator

import click

from vmtax.cli.consoles import err, out
from vmtax.cli import bounds
from vmtax.core import hints, plugin
from vmtax.core import target as targets
from vmtax.core.errors import VmtaxError
from vmtax.core.text import unique_names
from vmtax.core.text import markup as escape  # control characters too
from vmtax.host import ksm, proc
from vmtax.results import study_records as records
from vmtax.results.store import Store
from vmtax.studies import density, plan_toml
from vmtax.studies import density_results
from vmtax.studies import session as sessions
from vmtax.studies.plan import TargetSpec
from vmtax.studies.session import Session, check_target


results_option = click.option(
    "--results", "results", default=os.environ.get("VMTAX_RESULTS", "results"),
    show_default=True, type=click.Path(file_okay=False), metavar="DIR",
    help="Results directory (one SQLite database in it).")
@contextlib.contextmanager
def session(results: str) -> Iterator[Session]:
    """The session density and boot run in (vmtax.studies.session): journal and guardian,
    the results store, the network every instance joins, targets carrying nginx; all of it
    undone, and the run finished with its status, as the block ends."""
    def recovered(line: str) -> None:
        err.print(f"[yellow]recovered:[/yellow] {escape(line)}")

    with sessions.guarded_journal(recovered) as own, sessions.session(
            Store(results), own, binaries=(density.SERVER,), serves=True,
            undo_first=True) as current:
        current.ctx.shared_network()   # made up front: runs name it before they start
        yield current


# --- the plan file -----------------------------------------------------------------------

def load_plan(path: str, quick: bool = False, results: str | None = None,
              command: str = "density") -> tuple[dict[str, Any], dict[str, TargetSpec]]:
    """(settings values, targets) of command's plan file: a density plan, or a plan of
    workloads with a [density] or [boot] table of the command's settings (a whole study of
    its targets: those that start instances are taken). Errors name the file and key (and,
    for a plan of workloads alone, the `vmtax run` of it, into results)."""
    data = plan_toml.parse(plan_toml.read_text(path), path)
    tables = data.get("targets")
    if "workloads" in data:
        if command not in data:
            raise VmtaxError(f"{path}: a plan of workloads ([[workloads]]) without a "
                             f"[{command}] table: run it with "
                             f"`{hints.command('run', path, results=results)}`")
        data = data[command]
        if not isinstance(data, dict):
            raise VmtaxError(f"{path}: {command}: expected a table of its settings, got "
                             f"{data!r}")
        data, whole_study = dict(data), True
    else:
        data, whole_study = {k: v for k, v in data.items() if k != "targets"}, False
    quick_values = data.pop("quick", None)
    if not isinstance(tables, dict) or not tables:
        raise VmtaxError(f"{path}: targets: expected [targets.NAME] tables, got "
                         f"{tables!r}")
    if quick and quick_values is not None:
        if not isinstance(quick_values, dict):
            raise VmtaxError(f"{path}: quick: expected a table, got {quick_values!r}")
        data.update(quick_values)
    specs = {}
    # A name is shown and stored: printable, composed (NFC), one of its kind.
    for name, table in zip(unique_names(list(tables), f"{path}: targets"), tables.values()):
        if whole_study and isinstance(table, dict) and "kind" not in table:
            table = {**table, "kind": name}   # a run plan's [targets.native]
        if not isinstance(table, dict) or not isinstance(table.get("kind"), str):
            kinds = " or ".join(f'"{kind}"' for kind in density.instance_kinds())
            raise VmtaxError(f"{path}: targets.{name}: expected a table with kind = "
                             f"{kinds}, got {table!r}")
        if table["kind"] not in targets.kinds():
            raise VmtaxError(f"{path}: targets.{name}.kind: expected one of "
                             f"{', '.join(sorted(targets.kinds()))}, got {table['kind']!r}")
        if whole_study and not targets.get(table["kind"]).makes_instances():
            continue   # native serves the plan's workloads; it has no instances to start
        specs[name] = TargetSpec(name, table["kind"],
                                 {k: v for k, v in table.items() if k != "kind"})
        check_target(specs[name], f"{path}: targets.{name}")
    if command == "density":
        plugin.build(density.Settings, data, path, strict=False, kind="density")
    return data, specs


# --- the command -------------------------------------------------------------------------

def _step_line(name: str, with_ksm: bool, step: density.Step) -> str:
    ksm = f"  KSM sharing {step.ksm.get('pages_sharing', 0)} pages" if with_ksm else ""
    return (f"{name} (KSM {'on' if with_ksm else 'off'}): {step.instances} instances, "
            f"used +{step.used_delta:.0f} MiB, PSS {step.pss / step.instances:.1f} "
            f"MiB/instance, {step.answering}/{step.instances} answer HTTP"
            + (f" (the slowest after {step.http_slowest:.1f} s of {step.http_wait:g})"
               if step.http_slowest is not None and step.http_wait is not None else "")
            + ("" if step.settled else ", memory not settled") + ksm
            + (f"; idle, host CPUs {step.host_busy:.0f}% busy, the instances "
               f"{step.instances_cpu * 100:.0f}% of one core "
               f"({step.instances_cpu / step.instances * 100:.2f}% each)"
               if step.host_busy is not None and step.instances_cpu is not None else ""))


def ksm_note(summaries: list[density_results.Summary], kinds: dict[str, str],
             kernel: str) -> str | None:
    """Why KSM on did nothing for containers, when containers were measured with it on."""
    return ksm.unmarked_note([kinds.get(s.target, "") for s in summaries
                              if s.ksm and s.instances], kernel)


def print_summaries(summaries: list[density_results.Summary], notes: Iterable[str] = (),
                    runs: list[str] | None = None) -> None:
    """The table of memory per instance; runs: the run of each summary (across runs)."""
    from vmtax.report import density_tables

    notes = [*filter(None, map(density_results.vmm_line, summaries)), *notes]
    density_tables.print_summaries(out, summaries, density_results.ratios(summaries),
                                   density_results.ratio_lines(summaries), notes, runs,
                                   [density_results.http_line(s) for s in summaries])


def load_studies(results: str, run_ids: list[str]) -> list[density_results.StoredStudy]:
    """Stored density runs by id (a prefix, or 'last'); one-line errors otherwise."""
    store = Store(results, readonly=True)
    try:
        return [density_results.stored_study(store.load_run(run_id, with_output=True), store.dir)
                for run_id in run_ids]
    finally:
        store.close()


def print_comparison(studies: list[density_results.StoredStudy]) -> None:
    """Memory per instance of several density runs side by side, with the ratios."""
    rows, kinds = density_results.combine(studies)
    print_summaries([s for _, s in rows], comparison_notes(studies, rows, kinds),
                    runs=[run for run, _ in rows])
    for study in studies:
        for line in study.curves:
            out.print(escape(f"{line} (run {study.run_id})" if len(studies) > 1 else line))


def comparison_notes(studies: list[density_results.StoredStudy],
                     rows: list[tuple[str, density_results.Summary]],
                     kinds: dict[str, str]) -> list[str]:
    """The KSM note of each run that measured containers with KSM on, for its kernel."""
    return sorted({note for study in studies
                   if (note := ksm_note([s for run, s in rows if run == study.run_id], kinds,
                                        study.kernel or platform.release()))})


def comparison_json(studies: list[density_results.StoredStudy]) -> dict[str, Any]:
    rows, kinds = density_results.combine(studies)
    summaries = [s for _, s in rows]
    ratio = density_results.ratios(summaries)
    return {"runs": [study.run_id for study in studies],
            "summaries": [{"run": run, **s.__dict__, "kind": kinds.get(s.target),
                           "ratio": ratio.get((s.target, s.ksm))} for run, s in rows],
            "ratios": density_results.ratio_lines(summaries),
            "notes": comparison_notes(studies, rows, kinds)}


@click.command("density")
@click.argument("args", metavar="[PLAN.toml | show RUN...]", nargs=-1)
@click.option("--targets", "target_names", metavar="NAME,...",
              help="Targets to fill the host with, e.g. container,vm:tcg. [default: those "
                   "of the plan, else container]")
@click.option("--max", "max_", type=bounds.count(), help="Start up to N instances. "
              "[default: 100]")
@click.option("--batch", type=bounds.count(), help="Instances per step after the "
              "first ones, started singly. [default: 10]")
@click.option("--singles", type=bounds.count(), help="Instances started one at a "
              "time first. [default: 10]")
@click.option("--budget", metavar="PCT%|SIZE", help="Memory the instances may take. "
              "[default: 75%]")
@click.option("--ksm", type=click.Choice(["off", "on", "both"]),
              help="KSM off, on, or each in turn. [default: off]")
@click.option("--quick", is_flag=True, help="With PLAN.toml: its short [quick] form.")
@click.option("--compare", "compare", metavar="RUN", multiple=True,
              help="Also set this run's memory per instance beside that of stored density "
                   "run RUN (repeatable), with the density ratio across runs.")
@results_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def density_command(args, target_names, max_, batch, singles, budget, ksm, quick, compare,
                    results, as_json) -> None:
    """Fill the host with instances of each target serving nginx, step by step, and report
    memory per instance (E4 density).

    `vmtax density show RUN [RUN...]` runs nothing: it sets stored density runs (ids, unique
    prefixes or 'last') side by side, e.g. a container run and a vm:tcg run, with memory per
    instance of each, KSM off and on where measured, and the container-to-VM ratio."""
    import json

    if args and args[0] == "show":
        extra = [name for name, value in (("--targets", target_names), ("--max", max_),
                                          ("--batch", batch), ("--singles", singles),
                                          ("--budget", budget), ("--ksm", ksm),
                                          ("--quick", quick)) if value]
        if len(args) < 2 or extra:
            raise VmtaxError("density show RUN [RUN...]: name stored density runs"
                             + (f" (it runs nothing: {', '.join(extra)} do not apply)"
                                if extra else ""))
        studies = load_studies(results, [*args[1:], *compare])
        if as_json:
            click.echo(json.dumps(comparison_json(studies), indent=1))
        else:
            print_comparison(studies)
        return
    if len(args) > 1:
        raise VmtaxError(f"density: one plan file, got {len(args)} arguments "
                         f"({' '.join(args)}); `vmtax density show RUN...` compares runs")
    plan_file = args[0] if args else None
    # Named runs are checked before minutes of measuring, not after.
    others = load_studies(results, list(compare)) if compare else []
    values: dict[str, Any] = {}
    specs: dict[str, TargetSpec] = {}
    if plan_file:
        values, specs = load_plan(plan_file, quick, results)
    elif quick:
        raise VmtaxError("--quick runs a plan file's [quick] form: give the plan file")
    if target_names:
        specs = density.instance_specs([n.strip() for n in target_names.split(",")
                                        if n.strip()])
    if not specs:
        specs = density.instance_specs([density.default_kind()])
    given = {"max": max_, "batch": batch, "singles": singles, "budget": budget,
             "ksm": {"off": [False], "on": [True], "both": [False, True]}.get(ksm or "")}
    values.update({k: v for k, v in given.items() if v is not None})
    settings: density.Settings = plugin.build(  # type: ignore[assignment]
        density.Settings, values, "density", strict=False)
    run_id, outcomes = run_density(settings, specs, results)
    summaries = [density_results.summarize(o) for o in outcomes]
    kinds = {name: spec.kind for name, spec in specs.items()}
    this = density_results.StoredStudy(run_id, summaries, kinds, platform.release())
    if as_json:
        # What `density show RUN --json` prints for this run, with the steps of each outcome.
        found: dict[str, Any] = {"run": run_id, **comparison_json([this]),
                                 "outcomes": [o.to_json() for o in outcomes]}
        if others:
            found["across runs"] = comparison_json([this, *others])
        click.echo(json.dumps(found, indent=1))
    else:
        print_summaries(summaries, comparison_notes([this], [(run_id, s) for s in summaries],
                                                    kinds))
        for line in filter(None, map(density_results.ksm_curve_line, outcomes)):
            out.print(escape(line))
        if others:
            print_comparison([this, *others])


def run_density(settings: density.Settings, specs: dict[str, TargetSpec],
                results: str) -> tuple[str, list[density.Outcome]]:
    outcomes: list[density.Outcome] = []
    if True in settings.ksm:
        from vmtax.host import ksm
        if (why := ksm.unavailable()) is not None:
            raise VmtaxError(f"density: ksm = true: {why}")
    with session(results) as s:
        run_id = s.new_run(density.noted_plan(specs, platform.release(),
                                              settings=settings.values()))
        err.print(f"density run {run_id} on network {s.network.name}")
        for name, spec in specs.items():
            target = s.create(spec)
            for with_ksm in settings.ksm:
                proc.check_stop()
                idx = [0]

                def store_step(step: density.Step, name=name, with_ksm=with_ksm,
                               idx=idx) -> None:
                    err.print(escape(_step_line(name, with_ksm, step)))
                    s.store.add_rep(run_id, target=name, workload=density.WORKLOAD,
                                    params=density_results.params(with_ksm), phase=records.STEP,
                                    idx=idx[0], status="ok", argv=["density"],
                                    started=time.time(), stdout=density_results.json_step(step),
                                    metrics=density_results.step_metrics(step))
                    idx[0] += 1

                outcome = density.study(target, s.network, settings, with_ksm, s.ctx.journal,
                                        store_step, lambda text: err.print(escape(text)))
                outcomes.append(outcome)
                if outcome.stopped not in ("max", "budget"):
                    err.print(f"[yellow]{escape(name)}: stopped early: "
                              f"{escape(outcome.stopped)}[/yellow]")
            s.store_fingerprint(name)
            target.cleanup()
        summaries = [density_results.summarize(o) for o in outcomes]
        ratio = density_results.ratios(summaries)
        for outcome, summary in zip(outcomes, summaries):
            s.store.add_rep(run_id, target=outcome.target, workload=density.WORKLOAD,
                            params=density_results.params(outcome.ksm), phase="measure", idx=0,
                            status="ok" if summary.instances else "failed",
                            error=None if summary.instances else outcome.stopped,
                            argv=["density"], started=time.time(),
                            stdout=density_results.json_summary(outcome),
                            metrics=density_results.summary_metrics(
                                summary, ratio.get((outcome.target, outcome.ksm))))
    if sys.stderr.isatty():
        err.print(escape(f"stored as run {run_id}: "
                         + hints.command("show", run_id, results=s.store.dir)))
    return run_id, outcomes
