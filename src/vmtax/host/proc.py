"""Child processes that cannot outlive vmtax.

Every process vmtax starts gets SIGKILL from the kernel when vmtax dies (PR_SET_PDEATHSIG),
and runs in its own process group so that a timeout kills the whole tree. User strings
are only ever passed as argv, never through a shell.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


# Set by `stop_on_signal`: the signal that asked for a stop. The KeyboardInterrupt its
# handler raises is dropped (printed as "Exception ignored") when the signal lands while
# subprocess runs fork's at-fork hooks; this still stops vmtax at its next `check_stop`.
_stop_signal: int | None = None


def stop_on_signal(signum: int, frame: FrameType | None) -> None:
    global _stop_signal
    _stop_signal = signum
    raise KeyboardInterrupt


def check_stop() -> None:
    """Raise the KeyboardInterrupt of a stop request that was lost on its way."""
    if _stop_signal is not None:
        raise KeyboardInterrupt


def stopped_exit_code() -> int:
    """128 + the signal that stopped vmtax, as a shell reports a death by that signal:
    130 for Ctrl-C (also a KeyboardInterrupt no handler saw), 143 for SIGTERM."""
    return 128 + (_stop_signal or signal.SIGINT)


def _die_with_parent() -> None:
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


# Signals whose handler raises KeyboardInterrupt (stop_on_signal).
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def spawn(argv: list[str], *, preexec: Callable[[], object] | None = None,
          **kwargs: Any) -> subprocess.Popen[bytes]:
    """Start argv in a new process group that is killed when vmtax dies."""
    def child_setup() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _die_with_parent()
        if preexec is not None:
            preexec()
    # With a preexec function Python runs its at-fork hooks around fork(); a stop signal
    # landing in one raises KeyboardInterrupt there, which Python prints as an ignored
    # exception with a traceback. Held back until the fork is done, it is handled (and
    # raised) in vmtax's own code right after; the child unblocks it before exec.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        return subprocess.Popen(argv, start_new_session=True, preexec_fn=child_setup,
                                **kwargs)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def kill_group(proc: subprocess.Popen[Any], grace: float = 0.0) -> None:
    """Kill proc's process group (SIGTERM first when grace > 0) and reap proc."""
    if proc.poll() is None and grace > 0:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


@dataclass
class Completed:
    exit_code: int | None   # None when killed at the timeout
    stdout: str
    stderr: str
    elapsed: float
    timed_out: bool


def run(argv: list[str], *, timeout: float | None = None, env: dict[str, str] | None = None,
        cwd: str | None = None, input: bytes | None = None,
        preexec: Callable[[], object] | None = None) -> Completed:
    """Run argv to completion (or kill its whole group at the timeout) and time it."""
    start = time.perf_counter()
    proc = spawn(argv, preexec=preexec, env=env, cwd=cwd,
                 stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        timed_out = True
    except BaseException:
        kill_group(proc)
        raise
    elapsed = time.perf_counter() - start
    return Completed(None if timed_out else proc.returncode,
                     out.decode(errors="replace"), err.decode(errors="replace"),
                     elapsed, timed_out)


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of pid (clock ticks since boot), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def cpu_ticks(pid: int) -> int:
    """User plus system CPU time of pid so far, in clock ticks (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def running(pid: int, start: int | None) -> bool:
    """Is the process that started at `start` (process_start_time) still running? A pid
    reused by another process, or a zombie, is not."""
    if start is None or process_start_time(pid) != start:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def smaps_rollup(path: Path) -> tuple[int, int] | None:
    """(RSS, PSS) in KiB from a /proc/PID/smaps_rollup file (Linux 4.14 or later); None
    when unreadable or empty (a process that exited, or a zombie with no memory left).
    Raises ValueError naming a line it cannot read."""
    try:
        text = path.read_text()
    except OSError:
        return None
    found = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            value = rest.split()
            if len(value) != 2 or not value[0].isdigit():
                raise ValueError(f"unexpected line in {path}: {line!r}")
            found[key] = int(value[0])
    return (found["Rss"], found["Pss"]) if len(found) == 2 else None


_MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


def large_mappings_pss(path: Path, at_least: int) -> int | None:
    """KiB of PSS in the mappings of a /proc/PID/smaps file that are at least `at_least`
    KiB large (a guest's RAM, mapped whole by its VMM); None when unreadable."""
    try:
        text = path.read_text()
    except OSError:
        return None
    total, size = 0, 0
    for line in text.splitlines():
        if _MAPPING.match(line):
            size = 0
        key, _, rest = line.partition(":")
        if key == "Size":
            size = int(rest.split()[0])
        elif key == "Pss" and size >= at_least:
            total += int(rest.split()[0])
    return total


def cpu_seconds(pid: int) -> float | None:
    """The CPU time (user + system) process pid has used so far; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_PR_SET_THP_DISABLE = 41


def no_transparent_hugepages() -> None:
    """In a child before exec: no transparent huge pages for it (kept across exec), even
    where it asks for them with madvise."""
    _libc.prctl(_PR_SET_THP_DISABLE, 1, 0, 0, 0)
