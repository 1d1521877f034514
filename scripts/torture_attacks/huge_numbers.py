"""Durations and counts far past what anything can wait or count (issue #35, item 8)."""

from __future__ import annotations

import subprocess
import time

from torture_kit.env import ROOT, Env, Outcome, one_line_refusal
from torture_kit.registry import Attack


HUGE = "9" * 400


def huge_number_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Item 8: durations and counts far past what anything can wait or count, on the
    command line and in plan keys: one line each, never an overflow's traceback, and
    nothing started."""
    plan = env.work / "huge.toml"
    cases = [["tune", "--targets", "vm", "--workloads", "cpu", "--budget", f"{HUGE}h",
              "--dry-run"],
             ["run", "--targets", "native", "--workloads", "cpu", "--time", "99999999999"],
             ["run", "--targets", "native", "--workloads", "cpu", "--runs", HUGE],
             ["run", "--targets", "native", "--workloads", "cpu", "--warmup", "1e400"],
             ["boot", "--target", "vm:tcg", "--count", HUGE],
             ["density", "--max", HUGE], ["profile", "last", "--top", HUGE],
             ["exits", "import", str(ROOT / "tests/fixtures/perf_kvm/classic-vmx.txt"),
              "--label", "x", "--seconds", "inf"],
             ["run", str(plan)], ["tune", str(plan), "--dry-run"]]
    workload = '[targets.native]\n[[workloads]]\nname = "cpu"\n'
    plans = [f"time = 99999999999\n{workload}", f"runs = 99999999999\n{workload}",
             f"timeout = 1e300\n{workload}", f"max_runs = {HUGE[:18]}\n{workload}",
             workload + "params = { cpu-max-prime = 999999999999 }\n",
             f'{workload}[tune]\nbudget = "{HUGE}h"\n']
    if quick:
        cases, plans = cases[:3] + cases[-2:], plans[:2]
    for i, text in enumerate(plans):
        plan.write_text(text)
        for args in cases:
            if str(plan) not in args and i or "budget" in text and args[0] != "tune":
                continue
            outcome.cases += 1
            started = time.monotonic()
            what = f"vmtax {' '.join(args)[:80]}" + (f" ({text.splitlines()[-1]})"
                                                     if str(plan) in args else "")
            try:
                done = env.run(*args, "--results", str(env.work / "huge-r"), timeout=60)
            except subprocess.TimeoutExpired:
                outcome.fail(f"{what}: still running after 60 s")
                continue
            one_line_refusal(outcome, what, done, "--runs" if "--runs" in args else
                             "expected")
            outcome.note(f"{time.monotonic() - started:.0f} s")


ATTACK = Attack(
    "huge durations and counts (#35)", "counts and durations on the command line and in plans",
    "one line each, nothing started, never an overflow", huge_number_attack)
