"""Control characters in names (issue #29, defect 5)."""

from __future__ import annotations

import json

from torture_kit.env import Env, Outcome, in_process
from torture_kit.registry import Attack
from torture_kit.stores import ESCAPES, hostile_store


def terminal_escape_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Defect 5: control characters in names are refused where names come in, and shown
    escaped where they were stored before (runs, show, compare, export's error lines)."""
    from vmtax.core.errors import VmtaxError
    from vmtax.studies import plan, planfile

    for escape in ESCAPES:
        toml = f'[targets.native]\n[targets."{json.dumps(escape)[1:-1]}"]\nkind = "native"\n' \
               '[[workloads]]\nname = "cpu"\n'
        for what, refuse, args in (
                ("a plan's target name", planfile.loads, (toml, "hostile.toml")),
                ("--qemu LABEL=PATH", plan.from_names, (
                    ["vm"], ["cpu"], {"qemu": [f"{escape}=/bin/true", "b=/bin/true"]})),
                ("--targets", plan.from_names, ([f"native{escape}"], ["cpu"])),
                ("--name", in_process, ("run", "--targets", "native", "--workloads", "cpu",
                                        "--name", escape, "--dry-run")),
                ("--label", in_process, ("exits", "import", "/dev/null", "--label",
                                         escape))):
            outcome.cases += 1
            try:
                result = refuse(*args)
            except VmtaxError as exc:
                result = (2, "", exc)
            if not isinstance(result, tuple) or not isinstance(result[2], VmtaxError):
                outcome.fail(f"{what} with {escape!r}: not refused")
            elif not str(result[2]).isprintable():
                outcome.fail(f"{what} with {escape!r}: the refusal holds it raw")
    results = hostile_store(env, "terminal-escapes")
    commands = [["runs"], ["show", "last", "--all"]]
    if not quick:   # compare loads SciPy: seconds
        commands += [["show", "last"], ["show", "last:nope"],
                     ["compare", "last:native", "last:" + ESCAPES[0]]]
    for command in commands:
        outcome.cases += 1
        code, output, exc = in_process(*command, "--results", str(results))
        shown = output + (str(exc) if exc and not isinstance(exc, SystemExit) else "")
        raw = [c for c in shown if not (c.isprintable() or c == "\n")]
        if raw:
            outcome.fail(f"vmtax {' '.join(command)}: control characters reach the terminal: "
                         f"{raw[:5]!r}")
        outcome.note(f"exit {code}")


ATTACK = Attack(
    "terminal escapes in names", "names in plans, --qemu, --targets, --name, --label; "
    "`runs`, `show`, `compare` of names stored before",
    "refused where names come in, the refusal printable; shown escaped where stored",
    terminal_escape_attack)
