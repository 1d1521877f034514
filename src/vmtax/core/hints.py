"""Commands vmtax prints for a user to paste (`vmtax run --resume ID`, `vmtax show ID --all`).

Each is built by `command`, so each works as pasted: its words quoted as a POSIX shell needs
them (a run name or a directory with a space or a quote), and `--results DIR` carried when the
results directory in use is not the one the command finds by itself (VMTAX_RESULTS, else
./results): a hint without it would look in another database."""

from __future__ import annotations

import os
import shlex
from pathlib import Path


def default_results() -> str:
    """The results directory a command uses without --results."""
    return os.environ.get("VMTAX_RESULTS", "results")


def command(*words: object, results: str | os.PathLike | None = None) -> str:
    """`vmtax WORDS...` as a shell line, with `--results DIR` when results is not the
    default directory."""
    line = shlex.join(["vmtax", *map(str, words)])
    if results is not None and Path(results) != Path(default_results()):
        line += " --results " + shlex.quote(str(results))
    return line
