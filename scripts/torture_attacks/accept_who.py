"""Who accepted a change (issue #45, defect 9): `trend NAME --accept RUN` with SUDO_USER,
LOGNAME and USER set to another name holding an escape sequence, and of a run that is still
running. The acceptance records the real user (uid and name), nothing raw reaches the
terminal, and a running run is refused in one line."""

from __future__ import annotations

import os
import pwd
import sqlite3
import subprocess
import sys

from torture_kit.env import VMTAX, Env, Outcome, check_output
from torture_kit.registry import Attack
from torture_kit.stores import raw_controls, series_store

FORGED = "mallory\x1b]0;pwned\x07"
# A vmtax still running a run of the name: its run is stored, and it is alive.
RUNNING = """
import sys, time
from vmtax.results.store import Store
store = Store(sys.argv[1])
print(store.new_run({"name": "t"}, {"hostname": "h", "kernel": "k"}, "0"), flush=True)
time.sleep(120)
"""


def accept_who(env: Env, outcome: Outcome, quick: bool) -> None:
    results = env.work / "accept-r"
    series_store(results, "t", runs=4)
    forged = {**env.env, "SUDO_USER": FORGED, "LOGNAME": FORGED, "USER": FORGED}
    outcome.cases += 1
    done = subprocess.run([*VMTAX, "trend", "t", "--accept", "last", "--results",
                           str(results)], text=True, capture_output=True, env=forged,
                          timeout=120)
    check_output(outcome, "trend --accept", done.stderr)
    if raw_controls(done.stdout + done.stderr):
        outcome.fail(f"trend --accept printed {raw_controls(done.stdout + done.stderr)[:3]!r} raw")
    with sqlite3.connect(results / "vmtax.sqlite") as db:
        who = [row[0] for row in db.execute("SELECT who FROM accepted")]
    me = pwd.getpwuid(os.getuid()).pw_name
    if not who or "mallory" in who[-1] or me not in who[-1]:
        outcome.fail(f"trend --accept recorded who = {who[-1:]!r}, not {me}")
    else:
        outcome.note("the real user recorded")
    running = subprocess.Popen([sys.executable, "-c", RUNNING, str(results)], env=env.env,
                               text=True, stdout=subprocess.PIPE)
    env.started.append(running)
    assert running.stdout is not None
    run_id = running.stdout.readline().strip()
    outcome.cases += 1
    done = env.run("trend", "t", "--accept", run_id, "--results", str(results))
    running.kill()
    running.communicate()
    check_output(outcome, "trend --accept of a running run", done.stderr)
    lines = done.stderr.strip().splitlines()
    if done.returncode != 2 or len(lines) != 1 or "running" not in lines[0]:
        outcome.fail(f"trend --accept of a running run: exit {done.returncode}: "
                     f"{(done.stdout + done.stderr).strip()[-200:]}")
    else:
        outcome.note("a running run refused")


ATTACK = Attack(
    "who accepted a change (#45.9)",
    "`trend NAME --accept RUN` with SUDO_USER/LOGNAME/USER forged, and of a running run",
    "the real uid and its name recorded, printed escaped; a running run refused in one line",
    accept_who)
