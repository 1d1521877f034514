"""The consoles the commands print to: tables and JSON on stdout, progress, warnings and
errors on stderr; and stdout guarded (`guard_stdout`), so a write that fails there (a full
disk, a reader gone) is told apart from any other OSError and said in one line."""

import sys
from typing import Any

from rich.console import Console

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


class StdoutError(OSError):
    """Standard output could not be written."""


class _Guarded:
    """A stream whose write and flush failures are StdoutError (its buffer too)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: Any) -> Any:
        try:
            return self._stream.write(data)
        except OSError as exc:
            raise StdoutError(exc.errno, exc.strerror) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
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
