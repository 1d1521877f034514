"""Watching one lab (vmtax.studies.lab) until its QEMU is gone: its commands' stdout and
stderr echoed as they come, each command's start told, the host's load sampled, and how
the lab ended: its QEMU exited, or the lab hung while booting, or stopped making progress
(no heartbeat from inside it and no output, for `hang_timeout` seconds: its kernel hung,
or its QEMU was stopped), or the watch was interrupted (Ctrl-C).

The heartbeat, not the output alone, tells a hung lab from a quiet one: a command may
print nothing for minutes (a guest booting under TCG) while the lab's kernel runs its
processes and so writes the heartbeat."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from vmtax.guest import lab

# A lab whose vmtax has not started by then has hung while booting. A lab's boot took
# 15-55 s of the host's time at load 16, and its Python 8-13 s more.
BOOT_TIMEOUT = 300.0
# No heartbeat and no output for this long: the lab has stopped. Its heartbeat comes every
# lab.HEARTBEAT_EVERY seconds; the longest gap between two measured in the fault census
# (docs/lab.md) is far below.
HANG_TIMEOUT = 120.0
POLL = 0.2
# The host's 1-minute load average is sampled this often while a lab runs.
LOAD_EVERY = 30.0
# Lines of the lab's kernel console shown when it ended without the command's status.
CONSOLE_TAIL = 15
# How a dying kernel says so on its console.
_DIED = re.compile(r"Kernel panic - not syncing[^\n]*|BUG: [^\n]*")


@dataclass(frozen=True)
class Ended:
    how: str                       # "exited", "boot hang", "hang" or "interrupted"
    qemu_status: int | None = None
    silent: float = 0.0            # a hang: seconds without a heartbeat or output


def console_tail(share: Path, lines: int = CONSOLE_TAIL) -> str:
    try:
        said = (share / lab.CONSOLE_LOG).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(said[-lines:])


def fault_of(ended: Ended, share: Path) -> str | None:
    """The nested fault that ended a lab before its commands did, in words; None: none
    is known (its QEMU exited without a kernel's dying words)."""
    if ended.how == "hang":
        return (f"hung: no heartbeat and no output for {ended.silent:.0f} s (its kernel "
                "stopped running its processes, or its QEMU was stopped)")
    try:
        console = (share / lab.CONSOLE_LOG).read_text(errors="replace")
    except OSError:
        return None
    died: list[str] = _DIED.findall(console)
    panic = [line for line in died if line.startswith("Kernel panic")]
    if panic:
        first_bug = next((line for line in died if line.startswith("BUG: ")), None)
        return ("its kernel panicked: " + panic[-1].strip()
                + (f" (after {first_bug.strip()})" if first_bug else ""))
    return None


class _Tail:
    """One of the lab's output files, echoed from where the last read stopped."""

    def __init__(self, path: Path, echo: Callable[[bytes], None]) -> None:
        self.path, self.echo, self.offset = path, echo, 0

    def __call__(self) -> bool:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return False
        if data:
            self.echo(data)
            self.offset += len(data)
        return bool(data)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


class _Commands:
    """Tells started(index) as each command of the lab's job starts (lab.COMMANDS)."""

    def __init__(self, path: Path, started: Callable[[int], None]) -> None:
        self.path, self.started, self.seen = path, started, 0

    def __call__(self) -> None:
        try:
            records = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        for index in range(self.seen, len(records)):
            self.started(index)
        self.seen = max(self.seen, len(records))


def watch(qemu_proc: subprocess.Popen[bytes], share: Path, echo_out: Callable[[bytes], None],
          echo_err: Callable[[bytes], None], started: Callable[[int], None],
          hang_timeout: float, loads: list[float]) -> Ended:
    """Watch the lab whose QEMU is qemu_proc until it is gone, or has hung: how it ended.
    The host's load is appended to loads every LOAD_EVERY seconds."""
    tails = [_Tail(share / lab.OUT_LOG, echo_out), _Tail(share / lab.ERR_LOG, echo_err)]
    commands = _Commands(share / lab.COMMANDS, started)
    now = time.monotonic()
    boot_deadline, next_load = now + BOOT_TIMEOUT, now
    beat, beat_at, output_at = None, now, now
    try:
        while qemu_proc.poll() is None:
            now = time.monotonic()
            commands()
            if any([tail() for tail in tails]):
                output_at = now
            if now >= next_load:
                loads.append(os.getloadavg()[0])
                next_load = now + LOAD_EVERY
            if not (share / lab.STARTED).exists():
                if now > boot_deadline:
                    return Ended("boot hang")
                beat_at = now
            else:
                current = _read(share / lab.HEARTBEAT)
                if current != beat:
                    beat, beat_at = current, now
                silent = now - max(beat_at, output_at)
                if silent > hang_timeout:
                    return Ended("hang", silent=silent)
            time.sleep(POLL)
    except KeyboardInterrupt:
        return Ended("interrupted")
    commands()
    for tail in tails:
        tail()
    return Ended("exited", qemu_proc.returncode)
