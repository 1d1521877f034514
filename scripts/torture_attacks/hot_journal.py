"""A kill -9 at a commit leaves SQLite's hot journal (issue #45, defect 6): every command
that only reads (runs, show, trend, publish, export) then works, the journal rolled back,
or says in one line what happened and how to recover; `cleanup` recovers it, and says so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from torture_kit.env import Env, Outcome, check_output
from torture_kit.registry import Attack
from torture_kit.stores import series_store

# A writer killed in the middle of a large commit: the database's pages it changed are
# written already (a cache of one page spills them), their old contents in the journal.
KILLED_AT_COMMIT = """
import os, signal, sys
from vmtax.results.store import Store
store = Store(sys.argv[1])
store.db.execute("PRAGMA cache_size=1")
store.db.execute("BEGIN IMMEDIATE")
for i in range(20000):
    store.db.execute("INSERT INTO metrics (rep_id, name, value, unit, higher_is_better,"
                     " dimensions) VALUES (1, ?, 1.0, 'u', 1, '{}')", ("m" * 100 + str(i),))
os.kill(os.getpid(), signal.SIGKILL)
"""


def _kill_at_commit(env: Env, results: Path) -> bool:
    subprocess.run([sys.executable, "-c", KILLED_AT_COMMIT, str(results)], env=env.env,
                   capture_output=True, timeout=120)
    journal = results / "vmtax.sqlite-journal"
    return journal.exists() and journal.stat().st_size > 0


def hot_journal(env: Env, outcome: Outcome, quick: bool) -> None:
    results = env.work / "hot-journal-r"
    series_store(results, "t", runs=2)
    r = ["--results", str(results)]
    readers = [["runs", *r], ["show", "last", *r], ["export", "last", "--csv", "-", *r]]
    if not quick:
        readers += [["trend", "t", *r], ["publish", "t", str(env.work / "hot-site"), *r]]
    for command in readers:
        if not _kill_at_commit(env, results):
            outcome.fail("a writer killed at a commit left no hot journal to attack")
            return
        outcome.cases += 1
        done = env.run(*command, timeout=300)
        what = f"vmtax {command[0]} after a kill -9 at a commit"
        check_output(outcome, what, done.stderr)
        if done.returncode != 0:
            outcome.fail(f"{what}: exit {done.returncode}: {done.stderr.strip()[-200:]}")
        else:
            outcome.note("read, the journal rolled back")
    _kill_at_commit(env, results)
    outcome.cases += 1
    cleaned = env.run("cleanup", *r)
    check_output(outcome, "cleanup of a hot journal", cleaned.stderr)
    if "rolled back" not in cleaned.stdout or (results / "vmtax.sqlite-journal").exists():
        outcome.fail(f"cleanup of a hot journal: {cleaned.stdout.strip()[-200:]} "
                     f"{cleaned.stderr.strip()[-200:]}")
    else:
        outcome.note("cleanup rolled it back")


ATTACK = Attack(
    "a hot journal after a kill -9 at a commit (#45.6)",
    "runs, show, export, trend, publish and cleanup on a store with a hot journal",
    "readers read (the journal rolled back); cleanup rolls it back and says so",
    hot_journal)
