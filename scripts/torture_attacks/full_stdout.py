"""A full disk on stdout, and a reader that goes away (issue #45, defect 14): `export
--jsonl -`, `show --json`, `show`, `runs` and `trend --json` writing to /dev/full, and to a
pipe closed after its first bytes. One line saying so, or (a closed pipe) nothing; never a
traceback."""

from __future__ import annotations

import subprocess

from torture_kit.env import VMTAX, Env, Outcome, check_output
from torture_kit.registry import Attack
from torture_kit.stores import series_store


def full_stdout(env: Env, outcome: Outcome, quick: bool) -> None:
    results = env.work / "full-stdout-r"
    series_store(results, "t", runs=3, reps=50)
    r = ["--results", str(results)]
    commands = [["export", "last", "--jsonl", "-", *r], ["show", "last", "--json", *r],
                ["runs", *r]]
    if not quick:
        commands += [["show", "last", *r], ["trend", "t", "--json", *r]]
    for command in commands:
        what = f"vmtax {' '.join(command[:-2])}"
        outcome.cases += 1
        with open("/dev/full", "w") as full:
            done = subprocess.run([*VMTAX, *command], stdout=full, stderr=subprocess.PIPE,
                                  text=True, env=env.env, timeout=120)
        check_output(outcome, f"{what} > /dev/full", done.stderr)
        lines = done.stderr.strip().splitlines()
        if done.returncode == 0 or len(lines) != 1 or "standard output" not in lines[0]:
            outcome.fail(f"{what} > /dev/full: exit {done.returncode}: "
                         f"{done.stderr.strip()[-200:]}")
        else:
            outcome.note("one line")
        outcome.cases += 1
        reader = subprocess.Popen(["head", "-c", "1"], stdin=subprocess.PIPE,
                                  stdout=subprocess.DEVNULL)
        done = subprocess.run([*VMTAX, *command], stdout=reader.stdin, stderr=subprocess.PIPE,
                              text=True, env=env.env, timeout=120)
        reader.stdin.close()
        reader.wait()
        check_output(outcome, f"{what} | head -c 1", done.stderr)
        if done.stderr.strip():
            outcome.fail(f"{what} | head -c 1: {done.stderr.strip()[-200:]}")


ATTACK = Attack(
    "a full disk and a closed pipe on stdout (#45.14)",
    "export --jsonl -, show --json, show, runs, trend --json writing to /dev/full or a pipe "
    "closed early",
    "one line naming standard output on a full disk, nothing for a reader gone; never a "
    "traceback", full_stdout)
