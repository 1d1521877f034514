"""Commas in target names (issue #45, defect 15): a plan may name targets "a,b"; the store
once joined a run's target names with commas and split them again, so `runs --json` listed
7 targets for a run of 5 and `compare` paired runs by names no run had."""

from __future__ import annotations

import json

from torture_kit.env import Env, Outcome, check_output
from torture_kit.registry import Attack
from torture_kit.stores import series_store


def comma_names(env: Env, outcome: Outcome, quick: bool) -> None:
    results = env.work / "commas-r"
    five = ("native", "a,b", "c,d,e", "x", "y")
    series_store(results, "commas", runs=1, targets=five)
    outcome.cases += 1
    done = env.run("runs", "--json", "--results", str(results))
    check_output(outcome, "runs --json", done.stderr)
    listed = json.loads(done.stdout or "[]")
    if not listed or sorted(listed[-1]["targets"]) != sorted(five):
        outcome.fail(f"runs --json lists {listed[-1]['targets'] if listed else None} for a "
                     f"run of {list(five)}")
    # The latest run has targets "x" and "y"; the one before, only "a,b" and "x,y": they
    # share no target, so `compare` with no runs named must say so, not pair them.
    other = env.work / "commas-compare"
    series_store(other, "one", runs=1, targets=("a,b", "x,y"))
    series_store(other, "two", runs=1, targets=("x", "y"))
    outcome.cases += 1
    done = env.run("compare", "--results", str(other))
    check_output(outcome, "compare", done.stderr)
    if "shares a target" not in done.stderr:
        outcome.fail(f"compare paired runs that share no target: exit {done.returncode}: "
                     f"{(done.stdout + done.stderr).strip()[-160:]}")
    else:
        outcome.note("names kept whole")


ATTACK = Attack(
    "commas in target names (#45.15)", "`runs --json` and `compare` of targets named a,b",
    "a run's targets are listed as named, and runs are paired by whole names", comma_names)
