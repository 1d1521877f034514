"""The guardian of one `vmtax run`: undoes the run's journal the moment vmtax is gone.

PR_SET_PDEATHSIG only reaches vmtax's own children; container payloads run in sessions
their runtime made, and a mount, a cgroup or a huge page lease is no process at all. So
`guard` starts this module as a process of its own: in a new session (no terminal, out of
reach of a kill of vmtax's process group), without PR_SET_PDEATHSIG, reading a pipe whose
only writer is vmtax (the write end is not inherited by vmtax's children). End of file on
it means vmtax is done or dead, Ctrl-C, kill -9 or a crash alike: the guardian undoes
whatever the journal still lists (after a normal end, nothing) and exits. It imports
little until then.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path


@contextlib.contextmanager
def guard(journal_path: Path):
    """A guardian for the journal at journal_path while the block runs; at its end the
    guardian undoes what the journal still lists, and is waited for."""
    read, write = os.pipe()
    try:
        guardian = subprocess.Popen(
            [sys.executable, "-m", "vmtax.guardian", str(journal_path)], stdin=read,
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
        guardian.wait()


def main(journal_path: str) -> None:
    sys.stdin.buffer.read()          # returns at end of file: vmtax is done or dead
    from vmtax import journal
    journal.undo_left(Path(journal_path))


if __name__ == "__main__":
    main(sys.argv[1])
