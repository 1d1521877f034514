"""The consoles the commands print to: tables and JSON on stdout, progress, warnings and
errors on stderr. A reader that went away (`vmtax list targets | head -1`) has taken what
it wanted: that is no failure (rich would exit 1, and a pipefail script would stop)."""

import os
import sys

from rich.console import Console


class _Console(Console):
    def on_broken_pipe(self) -> None:
        reader_gone()


def reader_gone() -> None:
    """Exit 0 quietly, stdout silenced so that no flush at exit fails again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)


out = _Console(highlight=False)
err = _Console(stderr=True, highlight=False)
