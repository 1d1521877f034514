"""Commands vmtax prints for a user to paste (`vmtax run --resume ID`, `vmtax show ID --all`).

Each is built by `command`, so each works as pasted: its words quoted as a POSIX shell needs
them (a run name or a directory with a space or a quote), and `--results DIR` carried when the
results directory in use is not the one the command finds by itself (VMTAX_RESULTS, else
./results): a hint without it would look in another database.

Inside `vmtax lab` a hint is pasted on the host, where the lab's runs come into the store
LAB_RESULTS_ENV names: it carries `--results` with that store, and a command that measures
(MEASURING) runs in a lab again: `vmtax lab --results DIR run --resume ID`."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

# Set by `vmtax lab` in the lab's environment: the host's results directory.
LAB_RESULTS_ENV = "VMTAX_LAB_RESULTS"
# Commands that measure, and so run where the numbers are made: in a lab, for a hint
# printed in one.
MEASURING = ("run", "boot", "density", "tune")


def default_results() -> str:
    """The results directory a command uses without --results."""
    return os.environ.get("VMTAX_RESULTS", "results")


def command(*words: object, results: str | os.PathLike[str] | None = None) -> str:
    """`vmtax WORDS...` as a shell line, with `--results DIR` when results is not the
    default directory."""
    host_results = os.environ.get(LAB_RESULTS_ENV)
    if host_results is not None and "--help" not in words:   # a command's help is the same
        if words and words[0] in MEASURING:
            return shlex.join(["vmtax", "lab", "--results", host_results, *map(str, words)])
        return shlex.join(["vmtax", *map(str, words), "--results", host_results])
    line = shlex.join(["vmtax", *map(str, words)])
    if results is not None and Path(results) != Path(default_results()):
        line += " --results " + shlex.quote(str(results))
    return line
