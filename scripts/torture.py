"""vmtax attacked as a hostile user would (issue #16), seeded and repeatable.

    python scripts/torture.py [--seed N] [--quick] [--only TEXT] [--list]

Runs every attack of the registry (torture_kit.registry: the modules of the
torture_attacks package, one attack or family a module, each saying what it attacks and
what it expects) in a private sandbox, then checks the registry's own property: every
option of vmtax's commands that names a path has an attack that gives it one meant to
escape its tree (torture_kit.coverage). Prints a table of attacks and outcomes, and the
totals; exits 1 on any traceback, leak, lost or duplicated repetition or side effect, 2
when two attacks share a name.

Each attack draws its random choices from its own generator, seeded by --seed and its
name, so adding an attack changes no other's cases.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from torture_kit import coverage, registry
from torture_kit.env import Env, Outcome


def attack_rng(seed: int, name: str) -> random.Random:
    return random.Random(f"{seed}/{name}")


def run_attack(env: Env, attack: registry.Attack, quick: bool, seed: int) -> Outcome:
    outcome = Outcome(attack.name)
    env.rng = attack_rng(seed, attack.name)
    started = time.monotonic()
    try:
        attack.run(env, outcome, quick)
    except Exception as exc:   # noqa: BLE001 - a broken attack is a finding too
        outcome.fail(f"the attack itself failed: {type(exc).__name__}: {exc}")
    finally:
        env.stop_all()
    outcome.notes[f"{time.monotonic() - started:.0f} s"] = 0
    return outcome


def coverage_outcome(attacks: list[registry.Attack]) -> Outcome:
    """The registry's property, over every attack found (whichever were run)."""
    outcome = Outcome("every path option attacked (declared covers)")
    options = coverage.path_options()
    outcome.cases = len(options)
    for option in coverage.unattacked(attacks):
        outcome.fail(f"vmtax {' '.join(option)}: no attack covers it with a path out of "
                     "its tree")
    outcome.note(f"{len(options)} path options")
    return outcome


def totals(outcomes: list[Outcome]) -> tuple[int, int, int]:
    """(attacks, cases, problems)."""
    return (len(outcomes), sum(o.cases for o in outcomes),
            sum(len(o.problems) for o in outcomes))


def print_table(outcomes: list[Outcome], title: str) -> None:
    table = Table(title=title)
    for column in ("attack", "cases", "outcomes", "problems"):
        table.add_column(column)
    for o in outcomes:
        notes = ", ".join(f"{k}: {v}" if v else k for k, v in o.notes.items())
        table.add_row(escape(o.attack), str(o.cases), escape(notes),
                      "[red]" + escape("\n".join(o.problems[:5])) + "[/red]"
                      if o.problems else "0")
    console = Console(width=160)
    console.print(table)
    attacks, cases, failed = totals(outcomes)
    console.print(f"{attacks} attacks, {cases} cases, {failed} problems")
    console.print(f"{failed} problems" if failed else "no traceback, leak, lost repetition "
                  "or side effect")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--quick", action="store_true",
                        help="small counts and two kills (what `make test` runs)")
    parser.add_argument("--only", metavar="TEXT",
                        help="only the attacks whose name holds TEXT")
    parser.add_argument("--list", action="store_true",
                        help="list the attacks of the form: name, what it attacks, expects")
    args = parser.parse_args()
    try:
        found = registry.discover()
    except registry.DuplicateAttack as exc:
        print(f"torture: {exc}", file=sys.stderr)
        return 2
    chosen = list(registry.selected(found, args.quick, args.only))
    if args.list:
        for attack in chosen:
            print(f"{attack.name}\n  attacks: {attack.attacks}\n  expects: {attack.expects}")
        return 0
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="vmtax-torture-") as tmp:
        env = Env(Path(tmp), args.seed)
        for attack in chosen:
            outcomes.append(run_attack(env, attack, args.quick, args.seed))
    outcomes.append(coverage_outcome(found))
    print_table(outcomes, f"vmtax torture (seed {args.seed}{', quick' if args.quick else ''}"
                          f"{f', only {args.only!r}' if args.only else ''})")
    return 1 if totals(outcomes)[2] else 0


if __name__ == "__main__":
    sys.exit(main())
