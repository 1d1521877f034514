"""A runtime directory and journal entries another user planted (issue #29, defect 1)."""

from __future__ import annotations

import json
import os

from torture_kit.env import OTHER_UID, Env, Outcome, check_output, one_line_refusal, vmtax_with
from torture_kit.registry import Attack


def planted_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Issue #29, defect 1: another user plants a journal whose undo runs a command; and
    entries vmtax never writes, in a journal of its own user's."""
    sentinel = env.work / "PLANTED"
    planted = env.work / "planted"
    planted.mkdir()
    (planted / "journal-1-0.json").write_text(json.dumps(
        {"1": {"type": "argv", "argv": ["sh", "-c", f"id > {sentinel}"]}}))
    if os.geteuid() == 0:
        for path in (planted, planted / "journal-1-0.json"):
            os.chown(path, OTHER_UID, OTHER_UID)
        outcome.note(f"runtime directory owned by uid {OTHER_UID}")
    else:
        os.chmod(planted, 0o770)
        outcome.note("runtime directory group-writable")
    commands = [["cleanup"]] if quick else [["cleanup"], ["runs"], [
        "run", "--targets", "native", "--workloads", "cpu", "--runs", "1", "--time", "1"]]
    for command in commands:
        outcome.cases += 1
        results = [] if command == ["cleanup"] else ["--results", str(env.work / "planted-r")]
        one_line_refusal(outcome, f"vmtax {command[0]} with a planted runtime directory",
                         vmtax_with(env, planted, *command, *results), str(planted))
    own = env.work / "runtime-entries"
    own.mkdir(mode=0o700)
    kept = env.work / "kept"
    kept.mkdir()
    (kept / "file").write_text("")
    (env.work / "kept-link").symlink_to(kept)
    entries = [{"type": "argv", "argv": ["sh", "-c", f"id > {sentinel}"]},
               {"type": "argv", "argv": ["env", "X=1", "sh", "-c", f"id > {sentinel}"]},
               {"type": "rmtree", "path": str(env.work / "kept-link")},
               {"type": "kill", "pid": -1, "start": 1},
               {"type": "write", "path": str(sentinel), "value": "x"},
               {"type": "lease", "undo": "subprocess:getoutput"}]
    (own / f"journal-{2**22 + 9}-1.json").write_text(json.dumps(dict(enumerate(entries, 1))))
    outcome.cases += 1
    done = vmtax_with(env, own, "cleanup")
    check_output(outcome, "vmtax cleanup of entries vmtax never writes", done.stderr)
    if done.returncode != 0 or f"({len(entries)} failed" not in done.stdout:
        outcome.fail(f"entries vmtax never writes: exit {done.returncode}, "
                     f"{(done.stdout + done.stderr).strip()[-200:]}")
    else:
        outcome.note(f"{len(entries)} entries refused")
    if sentinel.exists():
        outcome.fail("a planted journal ran a command")
    if not (kept / "file").exists():
        outcome.fail("a planted rmtree removed a directory through a symbolic link")


ATTACK = Attack(
    "planted runtime directory and journal entries",
    "the undo journal: `cleanup`, `runs`, `run` with a runtime directory of another user's",
    "refused in one line naming the directory; entries vmtax never writes are refused; "
    "nothing planted runs or removes anything", planted_attack)
