"""The guardian of one `vmtax run`: undoes the run's journal the moment vmtax is gone.

PR_SET_PDEATHSIG only reaches vmtax's own children; container payloads run in sessions
their runtime made, and a mount, a cgroup or a huge page lease is no process at all. So
`guard` starts this module as a process of its own: in a new session (no terminal, out of
reach of a kill of vmtax's process group), without PR_SET_PDEATHSIG, reading a pipe whose
only writer is vmtax (the write end is not inherited by vmtax's children). End of file on
it means vmtax is done or dead, Ctrl-C, kill -9 or a crash alike: the guardian undoes
whatever the journal still lists (after a normal end, nothing) and exits. It imports
the journal's module before it waits: in a nested lab under load that import alone took
seconds, which a kill -9 left its VMM's run directory and network namespace for.

The guardian is watched too: at the end vmtax waits for it a bounded time (a stopped or
hung guardian must not hang vmtax), then kills it, undoes the journal itself and says so.
When vmtax and its guardian both die, the journal stays: every vmtax command warns of it,
`vmtax doctor` names it and `vmtax cleanup` (or the next run) undoes it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

# How long vmtax waits at its end for its guardian, which then has nothing left to undo
# but must start Python first (seconds on a loaded host).
WAIT = 30.0


@contextlib.contextmanager
def guard(journal_path: Path) -> Iterator[None]:
    """A guardian for the journal at journal_path while the block runs; at its end the
    guardian undoes what the journal still lists, and is waited for: at most WAIT seconds,
    and not at all once it is stopped (SIGSTOP); then vmtax kills it, undoes the journal
    itself and says so in one line on stderr."""
    read, write = os.pipe()
    try:
        guardian = subprocess.Popen(
            [sys.executable, "-m", "vmtax.host.guardian", str(journal_path)], stdin=read,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
            start_new_session=True)
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    try:
        yield
    finally:
        os.close(write)
        _await(guardian, journal_path)


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except OSError:
        return False


def _await(guardian: subprocess.Popen[bytes], journal_path: Path) -> None:
    deadline = time.monotonic() + WAIT
    while guardian.poll() is None:
        if _stopped(guardian.pid) or time.monotonic() > deadline:
            why = "was stopped" if _stopped(guardian.pid) else f"did not end within {WAIT:g} s"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(guardian.pid, signal.SIGKILL)
            guardian.wait()
            from vmtax.host import journal   # not at the top: the guardian imports little
            undone = journal.undo_left(journal_path)
            print(f"vmtax: warning: the guardian of this run (pid {guardian.pid}) {why}: "
                  f"killed it; {undone or 'its journal listed nothing left to undo'}",
                  file=sys.stderr)
            return
        time.sleep(0.02)


def main(journal_path: str) -> None:
    from vmtax.host import journal
    sys.stdin.buffer.read()          # returns at end of file: vmtax is done or dead
    journal.undo_left(Path(journal_path))


if __name__ == "__main__":
    main(sys.argv[1])
