"""A native serving run killed with -9 (issue #35, item 10)."""

from __future__ import annotations

import time
from pathlib import Path

from torture_kit.env import CLEAN_WITHIN, Env, Outcome
from torture_kit.registry import Attack


def serving_kill_attack(env: Env, outcome: Outcome) -> None:
    """Issue #35, item 10: a native serving run killed with -9 once its httpd runs leaves
    nothing in /dev/shm (the server's scratch directory is journaled before it is made)."""
    shm = Path("/dev/shm")
    before = set(shm.glob("vmtax-*"))
    results = env.work / "serving-kill"
    proc = env.start("run", "--targets", "native", "--workloads", "serving", "--runs", "1",
                     "--warmup", "0", "--time", "2", "--results", str(results))
    outcome.cases += 1
    # The first serving run builds its tools (minutes); then httpd starts and makes its
    # directory (in one of vmtax's, or, as it did, in /dev/shm itself).
    deadline = time.monotonic() + 900
    while proc.poll() is None and time.monotonic() < deadline and not (
            set(shm.glob("vmtax-httpd-*")) | set(shm.glob("vmtax-*/vmtax-httpd-*"))) - before:
        time.sleep(0.1)
    if proc.poll() is not None:
        _, err = proc.communicate()
        outcome.fail(f"the serving run ended before its server started: {err.strip()[-200:]}")
        return
    made = set(shm.glob("vmtax-*")) - before
    proc.kill()
    proc.communicate()
    deadline = time.monotonic() + CLEAN_WITHIN
    while (left := [p for p in made if p.exists()] + list(env.runtime.glob("journal-*"))) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    if not made:
        outcome.fail("the server made no directory in /dev/shm")
    elif left:
        outcome.fail(f"serving killed -9 left {', '.join(map(str, left[:3]))}")
    else:
        outcome.note(f"clean within {CLEAN_WITHIN:g} s")


ATTACK = Attack(
    "serving killed -9 on the bare host", "a native serving run killed once httpd runs",
    "nothing left in /dev/shm, no journal, within 5 s",
    lambda env, o, quick: serving_kill_attack(env, o))
