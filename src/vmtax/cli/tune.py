"""`vmtax tune`: which of the knobs a target declares wins the tax back, with significance.

    vmtax tune --targets vm:tcg --workloads cpu --knobs machine,vcpus --budget 6m --json
    vmtax tune --targets native,vm:tcg --workloads cpu,memory,fileio --budget 30m
    vmtax tune plans/tune.toml            # a plan with a [tune] table
    vmtax tune ... --resume               # continue the same search after Ctrl-C
"""

from __future__ import annotations

from typing import Literal, NoReturn

import click

from vmtax.cli import bounds
from vmtax.cli.consoles import err, out
from vmtax.cli.main import _csv, _print_json, recovered, results_option, stopped
from vmtax.cli.progress import ProgressReporter
from vmtax.core.errors import VmtaxError
from vmtax.core.text import markup as escape  # control characters too
from vmtax.report.tune_table import print_search, print_summary
from vmtax.results.store import Store
from vmtax.studies import tune as search_mod


@click.command("tune")
@click.argument("plan_file", metavar="[PLAN.toml]", required=False, type=click.Path())
@click.option("--targets", help="The target to tune, KIND or KIND:VARIANT, and optionally "
              "native (for the tax recovered), comma-separated.")
@click.option("--workloads", help="Comma-separated workloads (`vmtax list workloads`).")
@click.option("--knobs", metavar="KNOB[=VALUE],...",
              help="Knobs to try (each its declared values) or single values "
                   "(vcpus=4). [default: every knob the target declares]")
@click.option("--budget", metavar="DURATION",
              help='Time for the whole search, like "30m", "90s", "1h". [default: 30m]')
@click.option("--time", "time_", type=bounds.seconds(whole=True),
              help="Seconds each time-bounded workload runs.")
@click.option("--method", type=click.Choice(["holm", "bh"]),
              help="Multiplicity adjustment of the verdicts. [default: holm]")
@click.option("--resume", is_flag=True,
              help="Continue the same search (same arguments) after an interruption.")
@results_option
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@click.option("--dry-run", is_flag=True,
              help="Check the search and say what it would try, within what time; run nothing.")
def tune_command(plan_file: str | None, targets: str | None, workloads: str | None,
                 knobs: str | None, budget: str | None, time_: int | None,
                 method: Literal["holm", "bh"] | None,
                 resume: bool, results: str, as_json: bool, dry_run: bool) -> None:
    """Which knob a target declares wins the tax back: each knob value against the
    baseline, raced so repetitions go where the answer is open; the winners combined and
    confirmed; verdicts adjusted for the number of comparisons, an A-vs-A control beside."""
    asked = _csv(knobs, "--knobs")
    if plan_file:
        if targets or workloads:
            raise VmtaxError("give either PLAN.toml or --targets/--workloads, not both")
        search = search_mod.load(plan_file, asked, budget)
        if method:
            search.method = method
        if time_:
            search.plan.time = time_
    else:
        if not targets or not workloads:
            raise VmtaxError("give PLAN.toml, or --targets and --workloads")
        search = search_mod.from_names(
            _csv(targets, "--targets") or [], _csv(workloads, "--workloads") or [], asked,
            budget or "30m", method=method or "holm", time=time_ or 2)
    if dry_run:
        print_search(out, search.outline())
        return
    store = Store(results)

    def said(stage: str, text: str) -> None:
        err.print(f"tune · {stage}: {escape(text)}")

    def interrupted() -> NoReturn:
        stopped("interrupted; every repetition so far is stored (continue the search with "
                "the same command and --resume)")

    from vmtax.studies import tune_run

    outcome = tune_run.guarded(search, store, ProgressReporter(), recovered, interrupted,
                               resume, said)
    if as_json:
        _print_json(outcome.summary.to_json())
    else:
        print_summary(out, outcome.summary)
