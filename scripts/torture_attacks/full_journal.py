"""A full runtime directory (issue #29, defect 7)."""

from __future__ import annotations

import contextlib
import os
import subprocess

from torture_kit.env import Env, Outcome, one_line_refusal, vmtax_with
from torture_kit.registry import Attack


def full_journal_attack(env: Env, outcome: Outcome) -> None:
    """Issue #29, defect 7: a run whose runtime directory is full stops in one line before
    it changes the host; nothing (no work directory) is left."""
    full = env.work / "full-runtime"
    full.mkdir(mode=0o700)
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8k,mode=0700", "vmtax-torture", str(full)],
        capture_output=True).returncode == 0
    if not mounted:
        outcome.note("skipped: cannot mount a tmpfs")
        return
    try:
        with contextlib.suppress(OSError), open(full / "filler", "wb") as filler:
            filler.write(b"x" * 65536)
        results = env.work / "full-results"
        outcome.cases += 1
        done = vmtax_with(env, full, "run", "--targets", "native", "--workloads", "cpu",
                          "--runs", "1", "--warmup", "0", "--time", "1", "--results",
                          str(results))
        one_line_refusal(outcome, "vmtax run with a full runtime directory", done,
                         "cannot write the undo journal")
        outcome.note(f"exit {done.returncode}")
        if list(results.glob(".work-*")):
            outcome.fail("a run with a full runtime directory left its work directory")
    finally:
        subprocess.run(["umount", "-l", str(full)], capture_output=True)


ATTACK = Attack(
    "full runtime directory", "`vmtax run` whose runtime directory (an 8 KiB tmpfs) is full",
    "one line before the host is changed; no work directory left",
    lambda env, o, quick: full_journal_attack(env, o))
