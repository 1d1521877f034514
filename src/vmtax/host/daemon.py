"""System daemons vmtax needs (libvirtd, dockerd, lxd): started when none runs, stopped after.

This host has no systemd, so a plugin that needs a daemon asks `ensure` for it. A daemon
that already answers on its socket is someone else's: it is used and left running. One
that vmtax starts is journaled before anything else of the plugin's, so the journal (undone
newest first) removes the plugin's domains or containers while the daemon still answers,
then stops it: SIGTERM, and SIGKILL after a grace period. The daemon does not die with
vmtax (no PR_SET_PDEATHSIG): killed at once with it, it would leave its guests running; the
guardian stops it after undoing them.

Two vmtax processes may use one daemon that the first started: each holds a shared lock on
the daemon's lock file while it uses it, and the daemon is stopped only by the last one
(whoever can take the lock exclusively); a later user of a daemon vmtax started journals
its stop as well, so the daemon stops with whichever user ends last, or its guardian.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.host.journal import Journal, undone_by
from vmtax.host.proc import process_start_time, running

# How long a daemon gets to exit on SIGTERM before SIGKILL: dockerd stops its containers.
STOP_GRACE = 15.0
# A daemon's name names its files in the runtime directory.
DAEMON_NAME = re.compile(r"[a-z][a-z0-9_-]*")
# The lock file descriptors this process holds, by daemon name: released at its exit.
_held: dict[str, int] = {}
# The daemons whose stop this process has journaled.
_journaled: set[str] = set()


@dataclass(frozen=True)
class Daemon:
    """A daemon: its name in messages and file names, its argv (it must stay in the
    foreground), the unix socket that answers once it is ready, and daemons it needs first."""
    name: str
    argv: tuple[str, ...]
    socket: Path
    needs: tuple["Daemon", ...] = field(default=())


def answers(path: Path, timeout: float = 2.0) -> bool:
    """Does a unix socket at path accept a connection?"""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def _use(name: str) -> None:
    """Hold a shared lock on the daemon's lock file while this process uses the daemon."""
    if name in _held:
        return
    fd = os.open(paths.runtime_dir() / f"daemon-{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    _held[name] = fd


def _started_by_vmtax(name: str) -> dict[str, Any] | None:
    """The record of a running daemon that a vmtax process started (pid, start)."""
    try:
        record = json.loads((paths.runtime_dir() / f"daemon-{name}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return None
    return record if running(record["pid"], record.get("start")) else None


def ensure(journal: Journal, daemon: Daemon, log_dir: Path, timeout: float = 60.0) -> bool:
    """Make daemon answer on its socket: True if vmtax started it (journaled, stopped by the
    journal), False if it was running already. VmtaxError, in one line naming its log, if it
    does not answer within timeout."""
    for need in daemon.needs:
        ensure(journal, need, log_dir, timeout)
    _use(daemon.name)
    if answers(daemon.socket):
        record = _started_by_vmtax(daemon.name)
        if record is not None and daemon.name not in _journaled:
            journal.add(type="daemon", undo=undone_by(stop), name=daemon.name, **record)
            _journaled.add(daemon.name)
        return False
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{daemon.name}.log"
    try:
        with open(log, "ab") as out:
            proc = subprocess.Popen(list(daemon.argv), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        raise VmtaxError(f"cannot start {daemon.name} ({daemon.argv[0]}): "
                         f"{exc.strerror}") from None
    record = {"pid": proc.pid, "start": process_start_time(proc.pid)}
    journal.add(type="daemon", undo=undone_by(stop), name=daemon.name, **record)
    _journaled.add(daemon.name)
    (paths.runtime_dir() / f"daemon-{daemon.name}.json").write_text(json.dumps(record))
    deadline = time.monotonic() + timeout
    while not answers(daemon.socket, timeout=1.0):
        if proc.poll() is not None:
            raise VmtaxError(f"{daemon.name} exited with status {proc.returncode} before it "
                             f"answered on {daemon.socket}; its log: {log}")
        if time.monotonic() > deadline:
            raise VmtaxError(f"{daemon.name} did not answer on {daemon.socket} within "
                             f"{timeout:.0f} s; its log: {log}")
        time.sleep(0.1)
    return True


def _last_user(name: str) -> bool:
    """Release this process's use of the daemon: is no other process using it?"""
    fd = _held.pop(name, None)
    _journaled.discard(name)
    if fd is not None:
        os.close(fd)
    try:
        fd = os.open(paths.runtime_dir() / f"daemon-{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _still_needed(journal: Journal, entry: dict[str, Any]) -> int:
    """How many changes journaled after the daemon's start are still listed: their undo
    failed, and a retry may need the daemon (an LXD instance is deleted through LXD)."""
    mine = [token for token, listed in journal.entries.items() if listed is entry]
    return sum(token > mine[0] for token in journal.entries) if mine else 0


def stop(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo a daemon vmtax started: SIGTERM, then SIGKILL after STOP_GRACE seconds; unless
    another vmtax process still uses it (it stops it when it ends), or a change made after
    it is not undone yet (VmtaxError: it stays journaled, stopped once that is undone)."""
    name = str(entry.get("name"))
    needed = _still_needed(journal, entry)
    if needed:
        raise VmtaxError(f"{name} left running: {needed} change(s) made through it are not "
                         "undone yet")
    if not DAEMON_NAME.fullmatch(name) or not _last_user(name):
        return
    pid, start = entry.get("pid"), entry.get("start")
    if not isinstance(pid, int) or pid <= 1 or not running(pid, start):
        return
    (paths.runtime_dir() / f"daemon-{name}.json").unlink(missing_ok=True)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_GRACE
    while running(pid, start) and time.monotonic() < deadline:
        try:   # our own child: reap it, or it stays a zombie that "runs"
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            pass
        time.sleep(0.05)
    if running(pid, start):
        os.kill(pid, signal.SIGKILL)
