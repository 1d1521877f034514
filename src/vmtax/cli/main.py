"""The `vmtax` command line."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from vmtax import __version__
from vmtax.cli import bounds, run_flags
from vmtax.cli.consoles import (StdoutError, err, guard_stdout, out, reader_gone,
                                silence_stdout)
from vmtax.core import hints
from vmtax.core.errors import VmtaxError
from vmtax.core.text import printable
from vmtax.core.text import markup as escape  # control characters too
from vmtax.host import journal, proc
from vmtax.results.store import Store

if TYPE_CHECKING:
    from vmtax.analysis.model import RunModel
    from vmtax.cli.progress import ProgressReporter
    from vmtax.studies.requests import RunRequest

DEFAULT_RESULTS = os.environ.get("VMTAX_RESULTS", "results")

# `_csv` stays importable from here (cli/tune.py, cli/trend.py read their lists with it).
_csv = run_flags.csv_list


# Commands that undo what killed vmtax processes left (and say so) rather than warn of it.
RECOVERING = {"run", "cleanup", "density", "boot", "lab"}


def warn_left_behind(refuse: bool = True) -> None:
    """One line on stderr when killed vmtax processes left host changes in place. A runtime
    directory that is not to be trusted is refused (VmtaxError), or only warned of."""
    try:
        line = journal.left_behind_warning()
    except VmtaxError as exc:
        if refuse:
            raise
        line = str(exc)
    if line:
        click.echo(f"vmtax: warning: {printable(line)}", err=True)


def recovered(line: str) -> None:
    """Say what a crashed run left behind and was now undone (guarded_journal's report)."""
    err.print(f"[yellow]recovered:[/yellow] {escape(line)}")


def stopped(message: str) -> NoReturn:
    """End a study that Ctrl-C or SIGTERM stopped: say what was kept, exit as stopped."""
    # Plain text (a hint's directory may hold "[...]"), unwrapped: a command pastes whole.
    err.print(escape(message), soft_wrap=True)
    sys.exit(proc.stopped_exit_code())


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


results_option = click.option(
    "--results", "results", default=DEFAULT_RESULTS, show_default=True,
    type=click.Path(file_okay=False), help="Results directory (one SQLite database in it).")
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print machine-readable JSON instead of a table.")
all_option = click.option("--all", "--metrics", "show_all", is_flag=True,
                          help="Every metric with every flag spelt out, not only the summary "
                               "of primary metrics.")


class _Commands(click.Group):
    """vmtax's commands. Those in modules of their own are imported only when one of them
    runs: they pull in Ray, asyncssh, numpy or pydantic, which `vmtax --help`, `runs` and
    `show` must not wait for. Their one-line help is kept here for `vmtax --help`
    (tests/test_cli.py checks it against each command's own)."""

    LAZY: dict[str, tuple[str, str]] = {
        "report": ("vmtax.cli.report:report", "Write an HTML report of stored runs: findings, "
                   "figures, every metric, fingerprints; of two runs, also the second "
                   "against the first (change, CI, verdict per metric)."),
        "export": ("vmtax.cli.report:export", "Write a run's tidy data: one row per "
                   "repetition × metric, with every parameter and the host and target "
                   "fingerprints as columns (for pandas, R, spreadsheets); or its samples "
                   "for benchstat; or its summary as Markdown."),
        "plan": ("vmtax.cli.plan:plan_command", "Check a plan file and show what it would "
                 "run; nothing is run."),
        "list": ("vmtax.cli.list:list_command", "Every target kind or workload: options "
                 "(type, unit, default, range), metrics, and whether this host can run each "
                 "target; or (packages) the Debian packages all plugins need, one per line, "
                 "which the set-up script installs."),
        "exits": ("vmtax.cli.exits:exits_command", "VM exits per reason (`--collect exits`, "
                  "or imported perf kvm stat reports)."),
        "profile": ("vmtax.cli.profile:profile_command", "Where profiled cells' host CPU "
                    "time went (`--collect profile`): top functions per thread class; which "
                    "rose from A to B per unit of work."),
        "composite": ("vmtax.cli.composite:composite_command", "The composite index of a "
                      "stored run (RUN_ID, a prefix, its name or 'last'): per class, each "
                      "target's geometric mean of its workloads' ratios to the baseline."),
        "density": ("vmtax.cli.density:density_command", "Fill the host with instances of "
                    "each target serving nginx, step by step, and report memory per "
                    "instance (E4 density)."),
        "boot": ("vmtax.cli.boot:boot_command", "Cold-start each target COUNT times, one at "
                 "a time: time to ready and to the first HTTP answer, p50/p90/p99/max."),
        "lab": ("vmtax.cli.lab:lab_command", "Run a vmtax COMMAND inside a lab: a TCG guest "
                "with emulated AMD-V in which KVM really runs guests (nested, so the shape "
                "of the tax, never hardware's numbers)."),
        "fleet": ("vmtax.cli.fleet:fleet_command", "Run plans on many hosts through Ray: one "
                  "head, one Ray node per benchmark host."),
        "publish": ("vmtax.cli.trend:publish_command", "Write a static site of the runs "
                    "named NAME... into DIR: an index of series and runs, each name's trends, "
                    "each run's report, a comparison per change point; it opens from file:// "
                    "and fetches nothing."),
        "trend": ("vmtax.cli.trend:trend_command", "The runs named NAME (`vmtax run --name "
                  "NAME`) as series, per host: for each target × workload × headline metric "
                  "the latest value, a sparkline of the runs' medians, the change points "
                  "(effect, CI, adjusted p) and what changed between the runs on either side "
                  "of each: plans, host and target fingerprints, vmtax's version."),
        "tune": ("vmtax.cli.tune:tune_command", "Which knob a target declares wins the tax "
                 "back: each knob value against the baseline, raced so repetitions go where "
                 "the answer is open; the winners combined and confirmed; verdicts adjusted "
                 "for the number of comparisons, an A-vs-A control beside."),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.LAZY})

    def invoke(self, ctx: click.Context) -> Any:
        # A reader that took what it wanted and went (`vmtax list targets | head -1`) is
        # no failure: click would exit 1 on EPIPE, and a pipefail script would stop.
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()
            return result
        except BrokenPipeError:
            reader_gone()

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.LAZY and name not in self.commands:
            import importlib
            module, attribute = self.LAZY[name][0].split(":")
            self.add_command(getattr(importlib.import_module(module), attribute), name)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            if name in self.LAZY and name not in self.commands:
                stand_in = click.Command(name, help=self.LAZY[name][1])
                rows.append((name, stand_in.get_short_help_str(limit)))
            elif not (command := self.commands[name]).hidden:
                rows.append((name, command.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_Commands,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="vmtax")
@click.pass_context
def cli(ctx: click.Context) -> None:
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
    if ctx.invoked_subcommand not in RECOVERING:
        # `doctor` names an untrusted runtime directory among its checks.
        warn_left_behind(refuse=ctx.invoked_subcommand != "doctor")


@cli.command(cls=run_flags.RunCommand)
@run_flags.parsed
def run(request: "RunRequest", output: run_flags.RunOutput) -> None:
    """Run a comparison and print the table (results are stored as each run finishes).

    Without PLAN.toml this is the classic plan (E1), shaped by the options below; with a
    plan file, the file says what to run (see plans/ for examples).
    """
    from vmtax.studies import comparison

    store = Store(output.results) if request.resume else None
    if store is not None and request.resume and (
            done := store.load_run(request.resume)).status == "done":
        # Resuming a finished run would start its targets to run nothing: said, and shown.
        err.print(escape(f"run {done.id} is finished: nothing to resume; as stored:"))
        _show(store, done.id, output.as_json, output.show_all)
        return
    the_plan = comparison.plan_of(request, store)
    from vmtax.cli import plan as cli_plan

    if output.dry_run:
        click.echo(cli_plan.describe(request.plan_file or "the run", the_plan, matrix=True))
        return
    for warning in cli_plan.warnings(the_plan):
        err.print("[yellow]warning:[/yellow] " + escape(warning))
    store = store or Store(output.results)   # only once the plan is valid: a typo creates nothing
    if request.fleet is not None:
        from vmtax.cli import fleet as cli_fleet
        from vmtax.cli.progress import ProgressReporter
        with ProgressReporter() as progress:
            cli_fleet.run_on_fleet(the_plan, store, request.fleet.address, request.fleet.hosts,
                                   request.fleet.spread, request.resume, progress,
                                   lambda s, r: _show(s, r, False, output.show_all),
                                   _run_json if output.as_json else None)
        return
    model = comparison.run(the_plan, store, request.resume, _run_progress, recovered,
                           functools.partial(_run_stopped, output.results))
    _render(model, output.as_json, output.show_all, store.dir)


def _run_progress(estimate: float | None, per_cell: int,
                  notes: list[str]) -> "ProgressReporter":
    from vmtax.cli.progress import ProgressReporter

    reporter = ProgressReporter(estimate, per_cell)
    reporter.before_first = notes
    return reporter


def _run_stopped(results: str | os.PathLike | None, run_id: str | None) -> NoReturn:
    stopped(f"interrupted; what finished is stored in run {run_id} "
            f"(continue it with: {hints.command('run', '--resume', run_id, results=results)})"
            if run_id else "interrupted before the first run; nothing stored")


def _run_json(store: Store, run_id: str) -> dict[str, Any]:
    """What `vmtax show RUN --json` prints: the run, its summary and its composite index."""
    from vmtax.analysis.model import analyse

    return analyse(store.load_run(run_id)).to_json()


def _show(store: Store, run_id: str, as_json: bool, show_all: bool = False) -> None:
    from vmtax.analysis.model import analyse

    _render(analyse(store.load_run(run_id)), as_json, show_all, store.dir)


def _render(model: "RunModel", as_json: bool, show_all: bool,
            results: str | os.PathLike | None = None) -> None:
    """A run's model as `vmtax show` prints it: JSON, every metric (--all), or the
    headline."""
    if as_json:
        _print_json(model.to_json())
        return
    from vmtax.report import terminal as tables

    if show_all:
        tables.print_summary(out, model.run, model.summary)
    else:
        tables.print_headline(out, model, results=results)


@cli.command()
@click.argument("run_id", default="last")
@results_option
@json_option
@all_option
def show(run_id, results, as_json, show_all) -> None:
    """Reprint a stored run (RUN_ID, a unique prefix of it, its name, or 'last': the latest
    run recorded here, imported perf kvm stat reports aside)."""
    _show(Store(results, readonly=True), run_id, as_json, show_all)


@cli.command()
@results_option
@json_option
def runs(results, as_json) -> None:
    """List the stored runs."""
    store = Store(results, readonly=True)
    names = store.run_names()
    rows = [{**r, "name": names.get(r["id"]),
             **({"missing": store.missing(r["id"])} if r["status"] == "interrupted" else {})}
            for r in store.list_runs()]
    if as_json:
        _print_json(rows)
    elif not rows:
        out.print(escape(f"no runs stored in {store.path} yet; start one with "
                         f"`{hints.command('run', results=results)}`"), soft_wrap=True)
    else:
        from vmtax.report import runs_table
        runs_table.print_runs(out, rows, str(store.path))
        for r in rows:
            if lacking := r.get("missing"):
                shown = ", ".join(lacking[:4]) + (f" and {len(lacking) - 4} more"
                                                  if len(lacking) > 4 else "")
                out.print(escape(f"{r['id']} interrupted, missing {shown}; continue it: "
                                 + hints.command("run", "--resume", r["id"],
                                                 results=results)), soft_wrap=True)


def _latest_comparable(store: Store) -> tuple[str, str]:
    """The latest run, and the latest before it sharing a target and a workload with it;
    imported reports have neither to compare."""
    found = store.list_runs(imported=False)
    if len(found) < 2:
        raise VmtaxError(f"compare without arguments needs two stored runs, imported reports "
                         f"aside; {store.path} has {len(found)}")
    latest = found[-1]
    for earlier in reversed(found[:-1]):
        if (set(earlier["targets"]) & set(latest["targets"])
                and set(earlier["workloads"]) & set(latest["workloads"])):
            return earlier["id"], latest["id"]
    raise VmtaxError(f"no stored run shares a target and a workload with the latest, "
                     f"{latest['id']}; give two runs (A B)")


def same_run(spec_a: str, spec_b: str, run_id: str) -> str:
    """Why two specs that name one run are refused: a run against itself shows no change."""
    return (f"{spec_a} and {spec_b} are both run {run_id}: give two runs (NAME~1 is the run "
            "of a name before its latest, last~1 the run before the latest)")


def _side(store: Store, spec: str) -> tuple:
    """RUN or RUN:TARGET (run ids never contain ':'; target names may, e.g. container:runc),
    RUN@HOST[:TARGET] for a host of a fleet run (run ids and names never contain '@')."""
    run_id, _, target = spec.partition(":")
    run_id, at, host_name = run_id.partition("@")
    run_rec = store.load_run(run_id)
    if at:
        from vmtax.studies import fleet
        run_rec = fleet.host_run(store, run_rec, host_name)
    if target and target not in run_rec.targets:
        raise VmtaxError(f"run {run_rec.id} has no target {target!r}; it has: "
                         + ", ".join(run_rec.targets))
    return run_rec, target


@cli.command()
@click.argument("a", metavar="[A", required=False)
@click.argument("b", metavar="B]", required=False)
@click.option("--alpha", type=bounds.ALPHA, default=0.01, show_default=True,
              help=f"Significance level after the multiplicity adjustment ({bounds.ALPHA.words}).")
@click.option("--noise-floor", type=bounds.NOISE_FLOOR, default=0.02, show_default=True,
              help="Relative changes smaller than this are never called significant "
                   f"({bounds.NOISE_FLOOR.words}).")
@click.option("--method", type=click.Choice(["bh", "holm"]), default="bh", show_default=True,
              help="Adjustment across metrics: Benjamini-Hochberg (false discovery rate) or Holm.")
@click.option("--fail-on", type=click.Choice(["worse", "change", "inconclusive"]),
              help="Exit with status 1 when a metric is significantly worse (or, 'change', "
                   "worse or better; or, 'inconclusive', worse or without a verdict for too "
                   "few runs): for CI.")
@click.option("--junit", "junit_path", type=click.Path(), metavar="FILE",
              help="Also write the verdicts as JUnit XML, a test case per primary metric "
                   "failing as --fail-on judges it ('worse' without it), for CI systems' "
                   "test reports.")
@results_option
@json_option
@all_option
def compare(a, b, alpha, noise_floor, method, fail_on, junit_path, results, as_json,
            show_all) -> None:
    """Is B better or worse than A, metric by metric, beyond noise?

    \b
    A and B are stored runs (RUN_ID, a unique prefix, a name, or 'last': the latest run
    recorded here, imported perf kvm stat reports aside), compared target
    by target, or targets of runs (RUN:TARGET), e.g. two QEMU builds in one run:
      vmtax compare last:vm:tcg@stock last:vm:tcg@patched   (--qemu stock=…,patched=…)
      vmtax compare last@h1 last@h2 two hosts of one fleet run (RUN@HOST[:TARGET])
      vmtax compare 20261121-2236 20261122-0910
      vmtax compare nightly~1 nightly   a name's latest run against the one before
      vmtax compare                 the latest run against the one before it that
                                    shares a target and a workload with it
                                    (imported reports aside)
    Failed repetitions are excluded and counted, never treated as zero.
    """
    store = Store(results, readonly=True)
    if a is None:
        a, b = _latest_comparable(store)
    elif b is None:
        raise VmtaxError("compare takes two runs (A B), or none for the latest two")
    (run_a, target_a), (run_b, target_b) = _side(store, a), _side(store, b)
    host_a, host_b = (spec.partition(":")[0].partition("@")[2] for spec in (a, b))
    if (run_a.id, target_a, host_a) == (run_b.id, target_b, host_b):
        raise VmtaxError(same_run(a, b, run_a.id))
    if bool(target_a) != bool(target_b):
        raise VmtaxError("give a target on both sides (RUN:TARGET RUN:TARGET) or on neither")
    if target_a:
        pairs = [(run_a, target_a, run_b, target_b)]
    else:
        pairs = [(run_a, t, run_b, t) for t in run_a.targets if t in run_b.targets]
        if not pairs:
            raise VmtaxError(f"runs {run_a.id} and {run_b.id} share no target; "
                             "compare targets explicitly with RUN:TARGET")
    from vmtax.analysis import drift
    from vmtax.analysis import summary as analysis
    from vmtax.report import comparison_table as tables

    rows = analysis.compare_targets(pairs, alpha=alpha, noise_floor=noise_floor, method=method)
    rows, caveat = drift.within_drift(store, rows, run_a, run_b, alpha)
    if as_json:
        _print_json({"alpha": alpha, "noise_floor": noise_floor, "method": method,
                     "rows": [dataclasses.asdict(r) for r in rows],
                     **({"caveat": caveat} if caveat else {})})
    # A secondary metric (a fixed time's total, a fairness spread) is no regression.
    primary = [r for r in rows if not analysis.is_secondary(r.workload, r.metric)]
    if not as_json:
        shown = rows if show_all else primary
        tables.print_comparison(out, shown, alpha, noise_floor, method)
        if not show_all and len(primary) < len(rows):
            out.print(f"[dim]{len(rows) - len(primary)} secondary metrics hidden: --all[/dim]")
        if caveat and any(r.comparison.significant for r in shown):
            out.print(f"[dim]{escape(caveat)}[/dim]")
        if shown:   # the answer last, where a long comparison ends
            out.print(tables.verdict_line(shown, alpha))
    failing = {"worse": {"worse"}, "change": {"worse", "better"},
               "inconclusive": {"worse", "too few runs"}}.get(fail_on, set())
    hits = [r for r in primary if r.comparison.verdict in failing]
    if junit_path:
        from vmtax.host import outputs
        from vmtax.report import junit

        gate = f"--fail-on {fail_on}" if fail_on else "no --fail-on: failing on worse"
        outputs.write_file(junit_path, junit.render(primary, failing or {"worse"}, gate))
        click.echo(f"wrote {junit_path}", err=True)
    open_ = [r for r in primary if r.comparison.verdict == "too few runs"]
    if fail_on and open_ and fail_on != "inconclusive":
        # A gate that cannot fail must not pass silently.
        click.echo(f"vmtax: {len(open_)} of {len(primary)} metrics have too few runs for a "
                   f"verdict, which --fail-on {fail_on} lets pass; --fail-on inconclusive "
                   "fails on them", err=True)
    if hits:
        said = {"worse": "significantly worse", "change": "significantly changed",
                "inconclusive": "worse or without a verdict"}[fail_on]
        click.echo(f"vmtax: {len(hits)} metric{'s' * (len(hits) != 1)} {said} "
                   f"(--fail-on {fail_on}): "
                   + printable(", ".join(f"{r.workload} {r.metric}" for r in hits[:5]))
                   + (" …" if len(hits) > 5 else ""), err=True)
        sys.exit(1)


@cli.command()
@json_option
def doctor(as_json) -> None:
    """What this host can do for vmtax, and what to do where it can't."""
    from concurrent.futures import ThreadPoolExecutor

    from vmtax.host import quiet

    # The quiet check samples other processes' CPU use for 0.1 s: while every plugin is
    # imported (the checks need them all), and over before a probe starts a process the
    # sample could count. The collectors' own checks (profile's runs perf) run beside the
    # host's.
    with ThreadPoolExecutor(max_workers=4) as pool:
        sampled = pool.submit(quiet.snapshot)
        from vmtax.core import collector as collectors
        from vmtax.core import plugin
        from vmtax.host import doctor as host_doctor
        from vmtax.host import machine as host

        for group in plugin.registry().values():
            list(group.values())
        now = sampled.result()
        own = {name: pool.submit(cls.doctor) for name, cls in collectors.registered().items()}
        checks = host_doctor.doctor()
        checks += [host_doctor.Check(name, *line) for name, found in own.items()
                   if (line := found.result()) is not None]
    checks.append(host_doctor.Check("host quiet", not quiet.problems(now),
                                    quiet.doctor_line(now)))
    if as_json:
        _print_json({"host": {**host.fingerprint(), "quiet": now},
                     "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in checks]})
        return
    from vmtax.report import doctor_table

    doctor_table.print_checks(out, checks)


@cli.command()
@results_option
def cleanup(results) -> None:
    """Undo what killed vmtax processes left on this host: processes, containers, cgroups,
    mounts, huge pages, temporary files; and a commit one left unfinished in the results
    database. (`vmtax run` does it too, before it starts.)"""
    from vmtax.results.connection import roll_back
    from vmtax.results.store import DB_NAME

    lines = journal.recover()
    database = Path(results) / DB_NAME
    if roll_back(database):
        lines.append(f"rolled back the commit a killed vmtax left unfinished in {database}")
    for line in lines:
        out.print(escape(line), soft_wrap=True)
    if not lines:
        out.print("nothing to clean up")


def _command_words(ctx: click.Context | None) -> list[str]:
    """The (sub)command a usage error is about, as typed after `vmtax` (an option's own
    parse error comes without its command's context: then the command line's first word)."""
    if ctx is None:
        return sys.argv[1:2] if sys.argv[1:2] and sys.argv[1] in {*cli.LAZY, *cli.commands} \
            else []
    words: list[str] = []
    while ctx.parent is not None:
        words.insert(0, ctx.info_name or "")
        ctx = ctx.parent
    return words


def main() -> None:
    # What vmtax writes, only its user may change: it reads back (caches, side files, a
    # site's manifest) only files no one else can write (vmtax.core.files).
    os.umask(os.umask(0) | 0o022)
    # SIGTERM takes the same path as Ctrl-C: targets are cleaned up, results kept. SIGINT
    # stays ignored when vmtax was started so (a background job of a script).
    signal.signal(signal.SIGTERM, proc.stop_on_signal)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, proc.stop_on_signal)
    guard_stdout()
    try:
        # "vmtax" in usage lines and help, however it was started (`python -m vmtax`, as
        # the lab starts it): what a user types.
        cli.main(prog_name="vmtax", standalone_mode=False)
        sys.stdout.flush()
    except BrokenPipeError:   # the reader went away (`| head`): nothing to say
        reader_gone()
    except StdoutError as exc:
        silence_stdout()
        click.echo(f"vmtax: error: cannot write to standard output ({exc.strerror})",
                   err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        err.print("interrupted")
        sys.exit(proc.stopped_exit_code())
    except click.UsageError as exc:
        # One line, as vmtax's own errors, where click prints a usage block.
        click.echo(f"vmtax: error: {printable(exc.format_message().rstrip('.'))}; "
                   f"`{hints.command(*_command_words(exc.ctx), '--help')}` lists what it "
                   "takes", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except VmtaxError as exc:
        # One line, never wrapped; a name it quotes cannot drive the terminal.
        click.echo(f"vmtax: error: {printable(str(exc), newlines=True)}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(proc.stopped_exit_code())
