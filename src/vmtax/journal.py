"""An undo journal of every change vmtax makes to the host.

Each change (a process started, a directory created, a sysctl written) is recorded in a
file under the runtime directory *before* it is made, and removed once it is undone. On
a normal exit, Ctrl-C or SIGTERM the owner undoes its own entries; if vmtax was killed,
its guardian (vmtax.guardian) undoes them at once, or failing that the next vmtax start
(or `vmtax cleanup`) finds the journal of a dead process and undoes it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from vmtax import paths
from vmtax.proc import process_start_time, running


class Journal:
    """The journal of the process (pid, start): its start time tells a live owner from a
    dead one whose pid was reused, whatever program the owner is (vmtax, a script, tests)."""

    def __init__(self, directory: Path | None = None, pid: int | None = None,
                 start: int | None = None):
        self.dir = directory or paths.runtime_dir()
        self.pid = pid or os.getpid()
        self.start = start if start is not None else (process_start_time(self.pid) or 0)
        self.path = self.dir / f"journal-{self.pid}-{self.start}.json"
        self.entries: dict[int, dict[str, Any]] = {}
        with contextlib.suppress(FileNotFoundError):   # no changes yet, or all undone
            self.entries = {int(k): v for k, v in json.loads(self.path.read_text()).items()}
        self._ids = itertools.count(max(self.entries, default=0) + 1)
        # Guests of a factory boot in threads: one writer of the file at a time.
        self._lock = threading.RLock()

    @classmethod
    def at(cls, path: Path) -> "Journal":
        """The journal stored at path (journal-PID-START.json)."""
        pid, start = (int(x) for x in path.stem.split("-")[1:3])
        return cls(path.parent, pid, start)

    def _save(self) -> None:
        with self._lock:
            self._write()

    def _write(self) -> None:
        if not self.entries:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.entries))
        os.replace(tmp, self.path)

    def add(self, **entry: Any) -> int:
        """Record a change about to be made; returns a token for `undo`/`forget`."""
        with self._lock:
            token = next(self._ids)
            self.entries[token] = entry
            self._save()
        return token

    def update(self, token: int, **fields: Any) -> None:
        """A recorded change grew or shrank (a huge page lease): record its new extent."""
        with self._lock:
            self.entries[token].update(fields)
            self._save()

    def process(self, pid: int) -> int:
        return self.add(type="kill", pid=pid, start=process_start_time(pid))

    def forget(self, token: int) -> None:
        """The change was undone by its owner: drop it from the journal."""
        with self._lock:
            if self.entries.pop(token, None) is not None:
                self._save()

    def undo(self, token: int) -> None:
        entry = self.entries.get(token)
        if entry is not None:
            _undo(entry, self)
            self.forget(token)

    def undo_all(self) -> list[str]:
        """Undo every entry, newest first. Returns a description of each failure."""
        errors = []
        for token in sorted(self.entries, reverse=True):
            try:
                self.undo(token)
            except Exception as exc:  # keep undoing the rest
                errors.append(f"{self.entries.get(token)}: {exc}")
                self.forget(token)
        return errors


def _undo(entry: dict[str, Any], journal: Journal) -> None:
    kind = entry["type"]
    if kind == "kill":
        pid = entry["pid"]
        if entry.get("start") is not None and process_start_time(pid) == entry["start"]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    elif kind == "rmtree":
        shutil.rmtree(entry["path"], ignore_errors=True)
    elif kind == "write":
        Path(entry["path"]).write_text(entry["value"])
    elif kind == "rmdir":
        _rmdir_all(entry["paths"])
    elif kind == "umount":
        subprocess.run(["umount", "-l", entry["path"]], capture_output=True)
    elif kind == "argv":
        subprocess.run(entry["argv"], capture_output=True, timeout=30)
    elif kind == "hugepages":
        from vmtax import hugepages   # here: the guardian imports little
        hugepages.end_lease(journal, entry)
    elif kind == "ksm":
        from vmtax import ksm   # the host's KSM settings, unless another run leases them
        ksm.end_lease(journal, entry)
    elif kind == "remote":   # files and jobs on an ssh target: undone over a new connection
        from vmtax import ssh_session
        ssh_session.undo(entry)
    else:
        raise ValueError(f"unknown journal entry type {kind!r}")


def _rmdir_all(paths: list[str], within: float = 2.0) -> None:
    """Remove empty directories that may still be busy for a moment (a cgroup whose last
    task is exiting refuses rmdir with EBUSY); missing ones are already gone."""
    deadline = time.monotonic() + within
    for path in paths:
        while True:
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)


def held_elsewhere(journal: Journal, pool: str) -> int:
    """Pages of the huge page pool at `pool` that the leases in the other journals of
    journal's directory hold (live runs, and dead ones not undone yet)."""
    held = 0
    for path in journal.dir.glob("journal-*-*.json"):
        if path != journal.path:
            with contextlib.suppress(OSError, ValueError):   # undone meanwhile
                held += sum(e["added"] for e in json.loads(path.read_text()).values()
                            if e["type"] == "hugepages" and e["path"] == pool)
    return held


@contextlib.contextmanager
def _undoing(directory: Path):
    """One undoer of left journals at a time: a guardian, a starting vmtax and `vmtax
    cleanup` may find the same journal at once, and a lease must not be given back twice."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def undo_left(path: Path) -> str | None:
    """Undo what the journal at `path` still lists, in its owner's stead (the owner is dead
    or done); one line saying so, or None if nothing was left."""
    with _undoing(path.parent):
        journal = Journal.at(path)
        if not journal.entries:
            return None
        n = len(journal.entries)
        errors = journal.undo_all()
        path.unlink(missing_ok=True)
    return (f"undid {n} host change(s) left by vmtax process {journal.pid}"
            + (f" ({len(errors)} failed)" if errors else ""))


def left_behind(directory: Path | None = None) -> list[Journal]:
    """Journals of dead processes, not undone yet."""
    directory = directory or paths.runtime_dir(create=False)
    found = [Journal.at(path) for path in sorted(directory.glob("journal-*-*.json"))]
    return [j for j in found if j.entries and not running(j.pid, j.start)]


def left_behind_warning(directory: Path | None = None) -> str | None:
    """One line about changes dead vmtax processes left on this host, and how to undo them."""
    dead = left_behind(directory)
    if not dead:
        return None
    who = "vmtax process" + ("es " if len(dead) > 1 else " ") + ", ".join(str(j.pid) for j in dead)
    changes = sum(len(j.entries) for j in dead)
    return (f"{who} died leaving {changes} host change(s) (processes, cgroups, mounts, huge "
            "pages) in place; `vmtax cleanup` undoes them, as does the next `vmtax run`")


def recover(directory: Path | None = None) -> list[str]:
    """Undo what crashed vmtax processes left behind. Returns one line per recovered journal."""
    return [line for j in left_behind(directory or paths.runtime_dir())
            if (line := undo_left(j.path))]
