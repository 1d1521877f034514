"""A planted pending side file (issue #45, defects 2 and 5): records whose run id climbs
out with "../", whose names hold ESC or "/"; a side file writable by others or of another
user; a FIFO and /dev/zero in its place. The next writer refuses each in one line and
imports nothing of it; publish then writes nothing outside its directory."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

from torture_kit.env import OTHER_UID, Env, Outcome
from torture_kit.registry import Attack
from torture_kit.stores import files


def _records(run_id: str, target: str, workload: str) -> list[dict[str, Any]]:
    plan = {"name": "t", "targets": [{"name": target, "kind": "native"}]}
    return [{"kind": "run", "id": run_id, "created": 1.0, "plan": json.dumps(plan),
             "host": "{}", "version": "0"},
            {"kind": "target", "run_id": run_id, "name": target, "target_kind": "native",
             "fingerprint": "{}"},
            {"kind": "rep", "run_id": run_id, "target": target, "workload": workload,
             "params": "{}", "phase": "measure", "idx": 0, "status": "ok", "error": None,
             "exit_code": 0, "host_elapsed": 1.0, "guest_elapsed": None, "started": 1.0,
             "argv": "[]", "stdout": None, "stderr": None,
             "metrics": [["events/s", 1.0, "events/s", 1, "{}"]]},
            {"kind": "finish", "run_id": run_id, "finished": 2.0, "status": "done"}]


def _plant(results: Path, records: list[dict[str, Any]]) -> Path:
    from vmtax.results.store import PENDING_NAME, Store

    Store(results).close()                  # a database to import into
    side = results / PENDING_NAME
    side.write_text("".join(json.dumps(r) + "\n" for r in records))
    return side


def _writer(env: Env, outcome: Outcome, what: str, results: Path) -> None:
    """A writer opens the store (it imports side files): refused in one line, nothing in."""
    from vmtax.core.errors import VmtaxError
    from vmtax.results.store import Store

    outcome.cases += 1
    done: list[Any] = []

    def open_store() -> None:
        try:
            Store(results).close()
            done.append(None)
        except Exception as exc:   # noqa: BLE001 - what the attack looks for
            done.append(exc)
    opener = threading.Thread(target=open_store, daemon=True)
    opener.start()
    opener.join(30)
    if not done:
        outcome.fail(f"{what}: the next writer still waits after 30 s")
        return
    exc = done[0]
    if not isinstance(exc, VmtaxError) or "\n" in str(exc):
        outcome.fail(f"{what}: the next writer opened the store ({type(exc).__name__}: "
                     f"{exc})" if exc else f"{what}: the next writer imported it")
    reader = Store(results, readonly=True)
    imported = [r["id"] for r in reader.list_runs()]
    reader.close()
    if imported:
        outcome.fail(f"{what}: imported runs {imported[:2]}")
    else:
        outcome.note("refused in one line, nothing imported")


def planted_side_file(env: Env, outcome: Outcome, quick: bool) -> None:
    good = "20260101-000000-abcd"
    hostile = {"a run id climbing out": ("../../../../tmp/x", "native", "cpu"),
               "a target name with ESC": (good, "nat\x1b]0;pwn\x07ive", "cpu"),
               "a workload name with /": (good, "native", "../cpu")}
    for n, (what, record) in enumerate(hostile.items()):
        results = env.work / f"pending-planted-{n}"
        _plant(results, _records(*record))
        _writer(env, outcome, what, results)
        site = env.work / f"pending-site-{n}"
        before = files(env.work)
        done = env.run("publish", "t", str(site), "--results", str(results))
        outside = [p for p in files(env.work) - before
                   if not p.startswith((f"pending-site-{n}", f"pending-planted-{n}"))]
        if outside:
            outcome.fail(f"{what}: publish (exit {done.returncode}) wrote outside its "
                         f"directory: {outside[:2]}")
    # A side file that holds good records but that others could have written.
    kinds = {"writable by others": lambda side: side.chmod(0o666)}
    if os.geteuid() == 0:
        kinds["of another user"] = lambda side: os.chown(side, OTHER_UID, OTHER_UID)
    for n, (what, spoil) in enumerate(kinds.items()):
        results = env.work / f"pending-untrusted-{n}"
        spoil(_plant(results, _records(good, "native", "cpu")))
        _writer(env, outcome, f"a side file {what}", results)
    # Files that are no side file at all, in its place (defect 5).
    odd = {"a FIFO": lambda side: os.mkfifo(side)}
    if os.geteuid() == 0:
        odd["/dev/zero"] = lambda side: os.mknod(side, 0o666 | stat.S_IFCHR,
                                                  os.makedev(1, 5))
    for n, (what, make) in enumerate(odd.items()):
        results = env.work / f"pending-odd-{n}"
        side = _plant(results, [])
        side.unlink()
        make(side)
        _writer(env, outcome, f"{what} as the side file", results)


ATTACK = Attack(
    "a planted pending side file (#45.2, #45.5)",
    "the side file a store's next writer imports (vmtax.pending.jsonl)",
    "a record that breaks the rules of a first write, a file others could write, a FIFO "
    "or device: refused in one line, at once, nothing imported; publish stays in DIR",
    planted_side_file)
