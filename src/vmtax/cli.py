"""The `vmtax` command line."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
from typing import Any, Callable

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, \
    TextColumn, TimeElapsedColumn

from vmtax import __version__, guardian, journal, plan as plan_mod, proc
from vmtax.errors import VmtaxError
from vmtax.store import Store

DEFAULT_RESULTS = os.environ.get("VMTAX_RESULTS", "results")

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def _csv(value: str | None, flag: str) -> list[str] | None:
    """A comma-separated list; None when the flag was not given. An empty one is an error:
    running everything instead would be a surprise (and a long one)."""
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise VmtaxError(f"{flag}: expected a comma-separated list of names, got {value!r}")
    return items


def _target_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """A flag for every target option a plugin marks cli=True (--vcpus, --qemu, ...): it
    applies to every target whose kind has that option; repeated, or as LABEL=VALUE, it
    makes one target per value (NAME@LABEL)."""
    from vmtax import plugin, targets

    found: dict[str, plugin.OptionInfo] = {}
    for kind in targets.kinds().values():
        for info in plugin.option_infos(kind.Options).values():
            if info.cli:
                found.setdefault(info.field, info)
    for field, info in sorted(found.items(), reverse=True):
        unit = f" [{info.unit}]" if info.unit and info.unit != "bytes" else ""
        default = "" if info.default in (None, [], "") else f" [default: {info.default}]"
        command = click.option(f"--{field.replace('_', '-')}", field, multiple=True,
                               metavar="[LABEL=]VALUE",
                               help=f"{info.doc}{unit}.{default}")(command)
    return command


def warn_left_behind() -> None:
    """One line on stderr when killed vmtax processes left host changes in place."""
    line = journal.left_behind_warning()
    if line:
        click.echo(f"vmtax: warning: {line}", err=True)


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


class ProgressReporter:
    """Progress on stderr, so stdout stays clean for tables and --json."""

    def __init__(self) -> None:
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False),
                                 BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                                 transient=True, disable=not err.is_terminal)
        self.task: TaskID | None = None

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def start(self, total: int) -> None:
        self.task = self.progress.add_task("starting", total=total)

    def step(self, text: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, description=text)

    def advance(self) -> None:
        if self.task is not None:
            self.progress.advance(self.task)

    def warn(self, text: str) -> None:
        self.progress.console.print("[yellow]warning:[/yellow] " + escape(text))


results_option = click.option(
    "--results", "results", default=DEFAULT_RESULTS, show_default=True,
    type=click.Path(file_okay=False), help="Results directory (one SQLite database in it).")
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print machine-readable JSON instead of a table.")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="vmtax")
def cli() -> None:
    """Measure the virtualization tax: how much slower a workload runs in a VM or a container
    than on the bare host.

    \b
    Quick start:
      vmtax doctor                  what this host can do (KVM, QEMU, runtimes, huge pages)
      vmtax run                     native vs container vs VM, five sysbench workloads (E1)
      vmtax run --targets native,container:runc --workloads cpu,memory --runs 5
      vmtax runs                    stored runs
      vmtax show last               reprint a run
    """


@cli.command()
@click.argument("plan_file", metavar="[PLAN.toml]", required=False, type=click.Path())
@click.option("--targets", help="Comma-separated targets, KIND or KIND:VARIANT "
              "(`vmtax list targets`). [default: those of plans/classic.toml]")
@click.option("--workloads", help="Comma-separated workloads (`vmtax list workloads`). "
              "[default: those of plans/classic.toml]")
@click.option("--runs", default=str(plan_mod.DEFAULT_RUNS), show_default=True, metavar="N|auto",
              help="Measured repetitions per target and workload; 'auto' repeats until the "
                   "median's 95% CI is within --ci-target (between --min-runs and --max-runs).")
@click.option("--min-runs", type=click.IntRange(min=1), default=5, show_default=True,
              help="With --runs auto: runs before precision is judged.")
@click.option("--max-runs", type=click.IntRange(min=1), default=20, show_default=True,
              help="With --runs auto: give up (and flag it) after this many runs.")
@click.option("--ci-target", type=click.FloatRange(0, 100, min_open=True, max_open=True),
              default=2.0, show_default=True, metavar="PCT",
              help="With --runs auto: wanted CI half-width, percent of the median.")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
              help="Warm-up repetitions run first and discarded.")
@click.option("--time", "time_", type=click.IntRange(min=1),
              default=plan_mod.DEFAULT_TIME, show_default=True,
              help="Seconds each time-bounded workload runs (its declared time option).")
@_target_flags
@click.option("--collect", metavar="NAME,...",
              help="Collectors recording on the host around each cell's measured "
                   "repetitions, e.g. host-cpu,host-mem (`vmtax list collectors`).")
@click.option("--no-interleave", is_flag=True,
              help="Run all repetitions of one target before the next (default: A B B A order).")
@click.option("--resume", metavar="RUN_ID",
              help="Continue an interrupted run, skipping what it stored.")
@click.option("--quick", is_flag=True, help="With PLAN.toml: run its short [quick] form.")
@results_option
@json_option
def run(plan_file, targets, workloads, runs, min_runs, max_runs, ci_target, warmup, time_,
        collect, no_interleave, resume, quick, results, as_json, **target_options) -> None:
    """Run a comparison and print the table (results are stored as each run finishes).

    Without PLAN.toml this is the classic plan (E1), shaped by the options below; with a
    plan file, the file says what to run (see plans/ for examples).
    """
    from vmtax.runner import Runner

    if runs == "auto":
        repetitions = dict(runs=min_runs, max_runs=max_runs, ci_target=ci_target / 100)
    elif runs.isdigit() and int(runs) >= 1:
        repetitions = dict(runs=int(runs))
    else:
        raise VmtaxError(f"--runs takes a whole number (1 or more) or 'auto', got {runs!r}")
    target_options = {k: list(v) for k, v in target_options.items() if v}
    target_names, workload_names = _csv(targets, "--targets"), _csv(workloads, "--workloads")
    if quick and not plan_file:
        raise VmtaxError("--quick runs a plan file's [quick] form: give the plan file")
    if resume:
        store = Store(results)
        the_plan = plan_mod.Plan.from_dict(store.load_run(resume).plan)
    elif plan_file:
        from vmtax import planfile
        the_plan = planfile.load(plan_file, quick)
        if collect:
            the_plan.collect = list(dict.fromkeys([*the_plan.collect,
                                                   *(_csv(collect, "--collect") or [])]))
            the_plan.__post_init__()
    else:
        classic_targets, classic_workloads = plan_mod.classic_names()
        the_plan = plan_mod.from_names(
            target_names or classic_targets, workload_names or classic_workloads,
            target_options, warmup=warmup, time=time_, **repetitions,
            interleave=not no_interleave, collect=_csv(collect, "--collect") or [])
    if not resume:
        store = Store(results)   # only once the plan is valid: a typo creates nothing
    for line in journal.recover():
        err.print(f"[yellow]recovered:[/yellow] {line}")
    own = journal.Journal()
    with ProgressReporter() as progress, guardian.guard(own.path):
        runner = Runner(the_plan, store, progress, resume=resume, journal=own)
        try:
            run_id = runner.execute()
        except KeyboardInterrupt:
            if runner.run_id:
                err.print(f"interrupted; what finished is stored in run {runner.run_id} "
                          f"(continue it with: vmtax run --resume {runner.run_id})")
            else:
                err.print("interrupted before the first run; nothing stored")
            sys.exit(proc.stopped_exit_code())
    _show(store, run_id, as_json)


def _show(store: Store, run_id: str, as_json: bool) -> None:
    run_rec = store.load_run(run_id)
    from vmtax import analysis, report as tables   # scipy: only where numbers are shown

    summary = analysis.summarize_run(run_rec)
    if as_json:
        _print_json({"run": {"id": run_rec.id, "status": run_rec.status,
                             "created": run_rec.created, "finished": run_rec.finished,
                             "host": run_rec.host, "targets": run_rec.targets,
                             "plan": run_rec.plan},
                     "summary": summary.to_json()})
    else:
        tables.print_summary(out, run_rec, summary)


@cli.command()
@click.argument("run_id", default="last")
@results_option
@json_option
def show(run_id, results, as_json) -> None:
    """Reprint a stored run (RUN_ID, a unique prefix of it, or 'last')."""
    warn_left_behind()
    _show(Store(results, readonly=True), run_id, as_json)


@cli.command()
@results_option
@json_option
def runs(results, as_json) -> None:
    """List the stored runs."""
    warn_left_behind()
    rows = Store(results, readonly=True).list_runs()
    if as_json:
        _print_json(rows)
    elif not rows:
        out.print(f"no runs stored in {results} yet; start one with `vmtax run`")
    else:
        from vmtax import report as tables
        tables.print_runs(out, rows)


def _side(store: Store, spec: str) -> tuple:
    """RUN or RUN:TARGET (run ids never contain ':'; target names may, e.g. container:runc)."""
    run_id, _, target = spec.partition(":")
    run_rec = store.load_run(run_id)
    if target and target not in run_rec.targets:
        raise VmtaxError(f"run {run_rec.id} has no target {target!r}; it has: "
                         + ", ".join(run_rec.targets))
    return run_rec, target


@cli.command()
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.01,
              show_default=True, help="Significance level after the multiplicity adjustment.")
@click.option("--noise-floor", type=click.FloatRange(min=0), default=0.02, show_default=True,
              help="Relative changes smaller than this are never called significant.")
@click.option("--method", type=click.Choice(["bh", "holm"]), default="bh", show_default=True,
              help="Adjustment across metrics: Benjamini-Hochberg (false discovery rate) or Holm.")
@results_option
@json_option
def compare(a, b, alpha, noise_floor, method, results, as_json) -> None:
    """Is B better or worse than A, metric by metric, beyond noise?

    \b
    A and B are stored runs (RUN_ID, a unique prefix, or 'last'), compared target by
    target, or targets of runs (RUN:TARGET), e.g. two QEMU builds in one run:
      vmtax compare last:vm@stock last:vm@patched
      vmtax compare 20261121-2236 20261122-0910
    Failed repetitions are excluded and counted, never treated as zero.
    """
    store = Store(results, readonly=True)
    (run_a, target_a), (run_b, target_b) = _side(store, a), _side(store, b)
    if bool(target_a) != bool(target_b):
        raise VmtaxError("give a target on both sides (RUN:TARGET RUN:TARGET) or on neither")
    if target_a:
        pairs = [(run_a, target_a, run_b, target_b)]
    else:
        pairs = [(run_a, t, run_b, t) for t in run_a.targets if t in run_b.targets]
        if not pairs:
            raise VmtaxError(f"runs {run_a.id} and {run_b.id} share no target; "
                             "compare targets explicitly with RUN:TARGET")
    from vmtax import analysis, report as tables

    rows = analysis.compare_targets(pairs, alpha=alpha, noise_floor=noise_floor, method=method)
    if as_json:
        _print_json({"alpha": alpha, "noise_floor": noise_floor, "method": method,
                     "rows": [dataclasses.asdict(r) for r in rows]})
    else:
        tables.print_comparison(out, rows, alpha, noise_floor, method)


@cli.command()
@json_option
def doctor(as_json) -> None:
    """What this host can do for vmtax, and what to do where it can't."""
    from rich.table import Table

    from vmtax import host

    warn_left_behind()
    checks = host.doctor()
    if as_json:
        _print_json({"host": host.fingerprint(),
                     "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in checks]})
        return
    table = Table(title="vmtax doctor", show_lines=False)
    table.add_column("check")
    table.add_column("", justify="center")
    table.add_column("detail")
    for c in checks:
        table.add_row(escape(c.name), "[green]ok[/green]" if c.ok else "[red]no[/red]",
                      escape(c.detail))
    out.print(table)


@cli.command()
def cleanup() -> None:
    """Undo what killed vmtax processes left on this host: processes, containers, cgroups,
    mounts, huge pages. (`vmtax run` does it too, before it starts.)"""
    lines = journal.recover()
    for line in lines:
        out.print(line)
    if not lines:
        out.print("nothing to clean up")


def main() -> None:
    # SIGTERM takes the same path as Ctrl-C: targets are cleaned up, results kept. SIGINT
    # stays ignored when vmtax was started so (a background job of a script).
    signal.signal(signal.SIGTERM, proc.stop_on_signal)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, proc.stop_on_signal)
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        err.print("interrupted")
        sys.exit(proc.stopped_exit_code())
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except VmtaxError as exc:
        click.echo(f"vmtax: error: {exc}", err=True)   # one line, never wrapped
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(proc.stopped_exit_code())


from vmtax.cli_report import export, report  # noqa: E402  (commands live beside their code)
cli.add_command(report)
cli.add_command(export)

from vmtax.cli_plan import plan_command  # noqa: E402  (command lives beside its code)
cli.add_command(plan_command, "plan")

from vmtax.cli_list import list_command  # noqa: E402
cli.add_command(list_command, "list")
