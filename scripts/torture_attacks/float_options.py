"""Every option of vmtax's commands that takes a real number (issue #45, defect 10), found
from the commands themselves, given NaN, infinities, numbers too small or large for any
meaning and no number at all: a value that is not finite, or not a number, is refused in
one line; any other is refused in one line or taken, never a traceback or a hang. An
option with no case here (BASES) fails the attack, so a new one gets one."""

from __future__ import annotations

import subprocess
from typing import Any

from torture_kit.env import ROOT, Env, Outcome, check_output
from torture_kit.registry import Attack
from torture_kit.stores import series_store

NOT_FINITE = ["nan", "inf", "-inf", "x"]
ODD = ["1e-320", "1e-300", "1e308", "-0"]

# How each command with such an option is run (its other arguments), {r}: a store of runs
# named t of targets native and other. None that starts anything: a dry run, or a target
# that does not exist.
BASES = {
    ("run",): ["run", "--targets", "native", "--workloads", "cpu", "--runs", "auto",
               "--dry-run", "--results", "{r}"],
    ("compare",): ["compare", "last:native", "last:other", "--results", "{r}"],
    ("trend",): ["trend", "t", "--results", "{r}"],
    ("boot",): ["boot", "--target", "nope", "--results", "{r}"],
    ("exits", "import"): ["exits", "import", str(ROOT / "tests/fixtures/perf_kvm/classic-vmx.txt"),
                          "--label", "floats", "--results", "{r}"],
    ("lab",): ["lab", "--memory", "999G", "--results", "{r}", "run", "--targets", "native",
               "--workloads", "cpu"],
}


def real_options() -> list[tuple[tuple[str, ...], str]]:
    """(command words, option) of every option whose value is a real number."""
    import click

    from vmtax.cli.bounds import Bounded
    from vmtax.cli.main import cli

    found = []

    def walk(command: click.Command, words: tuple[str, ...], ctx: click.Context) -> None:
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None:
                    walk(sub, (*words, name), click.Context(sub, parent=ctx))
            return
        for param in command.params:
            kind: Any = param.type
            if (isinstance(kind, Bounded) and kind.kind is float
                    or isinstance(kind, (click.FloatRange, type(click.FLOAT)))):
                found.append((words, param.opts[0]))
    walk(cli, (), click.Context(cli))
    return found


def real_numbers(env: Env, outcome: Outcome, quick: bool) -> None:
    results = env.work / "floats-r"
    series_store(results, "t", runs=4)
    for words, option in real_options():
        base = BASES.get(words)
        if base is None:
            outcome.fail(f"vmtax {' '.join(words)} {option}: no case attacks it")
            continue
        if quick and words not in (("compare",), ("trend",)):
            continue
        for value in (["nan", "1e-320"] if quick else NOT_FINITE + ODD):
            args = [a.format(r=results) for a in base]
            at = len(words) if words != ("lab",) else 1
            args[at:at] = [option, value]
            what = f"vmtax {' '.join(words)} {option} {value}"
            outcome.cases += 1
            try:
                done = env.run(*args, timeout=60)
            except subprocess.TimeoutExpired:
                outcome.fail(f"{what}: still running after 60 s")
                continue
            check_output(outcome, what, done.stderr)
            lines = done.stderr.strip().splitlines()
            if value in NOT_FINITE and done.returncode == 0:
                outcome.fail(f"{what}: taken")
            elif done.returncode == 2 and len(lines) == 1:
                outcome.note("refused in one line")
            elif done.returncode == 0:
                outcome.note("taken")
            else:
                outcome.fail(f"{what}: exit {done.returncode}, {len(lines)} lines: "
                             f"{done.stderr.strip()[-160:]}")


ATTACK = Attack(
    "every real-number option (#45.10)",
    "compare/trend --alpha and --noise-floor, run --ci-target, boot --http-timeout, exits "
    "import --seconds, lab --hang-timeout: every option taking a real number",
    "NaN, infinities and words refused in one line; any value refused in one line or "
    "taken, never a traceback or a hang", real_numbers)
