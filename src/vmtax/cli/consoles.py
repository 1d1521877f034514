"""The consoles the commands print to: tables and JSON on stdout, progress, warnings and
errors on stderr. A reader that went away (`vmtax list targets | head -1`) has taken what
it wanted: that is no failure (rich would exit 1, and a pipefail script would stop).
stdout is guarded (`guard_stdout`), so a write that fails there (a full disk) is told
apart from any other OSError and said in one line."""

import os
import sys
from typing import Any

from rich.console import Console


class _Console(Console):
    def on_broken_pipe(self) -> None:
        reader_gone()


def reader_gone() -> None:
    """Exit 0 quietly, stdout silenced so that no flush at exit fails again."""
    silence_stdout()
    sys.exit(0)


def silence_stdout() -> None:
    """What is still buffered for stdout goes to /dev/null at exit, not to a failed one."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


out = _Console(highlight=False)
err = _Console(stderr=True, highlight=False)


class StdoutError(OSError):
    """Standard output could not be written."""


class _Guarded:
    """A stream whose write and flush failures are StdoutError (its buffer's too)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: Any) -> Any:
        try:
            return self._stream.write(data)
        except BrokenPipeError:
            raise   # a reader gone is no failure (reader_gone), and click must see it so
        except OSError as exc:
            raise StdoutError(exc.errno, exc.strerror) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StdoutError(exc.errno, exc.strerror) from None

    @property
    def buffer(self) -> "_Guarded":
        return _Guarded(self._stream.buffer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_stdout() -> None:
    if not isinstance(sys.stdout, _Guarded):
        sys.stdout = _Guarded(sys.stdout)  # type: ignore[assignment]  # a stream's stand-in
