"""A device, a FIFO and a huge file as a perf report or a plan (issue #29, defect 6)."""

from __future__ import annotations

import os
import subprocess
import time

from torture_kit.env import Env, Outcome, check_output
from torture_kit.registry import Attack


def unbounded_read_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Defect 6: a device, a FIFO and a huge file given as a perf report or a plan: one
    line each, at once, never a hang or a traceback."""
    fifo = env.work / "fifo"
    os.mkfifo(fifo)
    huge = env.work / "huge.txt"
    with open(huge, "wb") as f:
        f.truncate(64 << 20)     # sparse: no disk used
    cases = [("exits", "import", "/dev/zero", "--label", "x"),
             ("exits", "import", str(fifo), "--label", "x")]
    if not quick:
        cases += [("exits", "import", str(huge), "--label", "x"), ("plan", "/dev/zero"),
                  ("plan", str(fifo)), ("run", str(fifo), "--dry-run"),
                  ("density", str(fifo))]
    for args in cases:
        outcome.cases += 1
        started = time.monotonic()
        try:
            done = env.run(*args, "--results", str(env.work / "unbounded-r"), timeout=30) \
                if args[0] == "exits" else env.run(*args, timeout=30)
        except subprocess.TimeoutExpired:
            outcome.fail(f"vmtax {' '.join(args)}: still reading after 30 s")
            continue
        check_output(outcome, f"vmtax {' '.join(args)}", done.stderr)
        lines = done.stderr.strip().splitlines()
        if done.returncode != 2 or len(lines) != 1:
            outcome.fail(f"vmtax {' '.join(args)}: exit {done.returncode}: "
                         f"{done.stderr.strip()[-200:]}")
        outcome.note(f"{time.monotonic() - started:.0f} s each")


ATTACK = Attack(
    "devices, FIFOs and huge files as input", "`exits import`, `plan`, `run`, `density`",
    "one line each, exit 2, at once", unbounded_read_attack)
