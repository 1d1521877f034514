"""An LXD container that cannot start (issue #35, items 2 and 11)."""

from __future__ import annotations

import os
from pathlib import Path

from torture_kit.env import Env, Outcome, check_output
from torture_kit.registry import Attack


LXD_LOGS = Path("/var/log/lxd")


def lxd_left(runtime: Path) -> list[str]:
    """What of vmtax's is in LXD (by its directories, with or without a daemon), in LXD's
    log directory, and in runtime's journals."""
    found = [str(p) for d in (Path("/var/lib/lxd/containers"), Path("/var/lib/lxd/storage-pools"),
                              LXD_LOGS) for p in d.glob("vmtax-*")]
    return found + [str(p) for p in runtime.glob("journal-*")]


def lxd_start_failure_attack(env: Env, outcome: Outcome) -> None:
    """Issue #35, items 2 and 11: an LXD container that cannot start (memory = "1K") is
    reported in LXD's own words in one line and leaves nothing: no instance, profile or
    pool, no journal, no log directory; `cleanup` then finds nothing. A container that
    starts leaves no log directory either."""
    from vmtax.targets.lxd import LxdTarget

    if os.geteuid() != 0 or LxdTarget.unavailable() is not None:
        outcome.note("skipped: LXD unavailable, or not root")
        return
    before = lxd_left(env.runtime)
    if before:
        outcome.note(f"skipped: vmtax's objects in LXD before the attack ({before[0]})")
        return
    for memory in ("1K", "64M"):
        plan = env.work / "lxd.toml"
        plan.write_text(f'runs = 1\nwarmup = 0\ntime = 1\n[targets.l]\nkind = "lxd"\n'
                        f'memory = "{memory}"\n[[workloads]]\nname = "cpu"\n')
        done = env.run("run", str(plan), "--results", str(env.work / "lxd-r"))
        outcome.cases += 1
        name = f"lxd memory = {memory}"
        check_output(outcome, name, done.stderr)
        lines = done.stderr.strip().splitlines()
        if memory == "1K" and (done.returncode == 0 or len(lines) != 1
                               or "Starting instance" not in lines[0]):
            outcome.fail(f"{name}: exit {done.returncode}, not LXD's reason in one line: "
                         f"{done.stderr.strip()[-300:]}")
        elif memory != "1K" and done.returncode != 0:
            outcome.fail(f"{name}: exit {done.returncode}: {done.stderr.strip()[-300:]}")
        left = lxd_left(env.runtime)
        if left:
            outcome.fail(f"{name}: left {', '.join(left[:3])}")
        cleaned = env.run("cleanup")
        if cleaned.stdout.strip() != "nothing to clean up":
            outcome.fail(f"{name}: `vmtax cleanup` found {cleaned.stdout.strip()[-200:]}")
    outcome.note("nothing left in LXD")


ATTACK = Attack(
    "an LXD container that cannot start", "the lxd target with memory = \"1K\"",
    "LXD's reason in one line; nothing left in LXD, its logs or the journal",
    lambda env, o, quick: lxd_start_failure_attack(env, o))
