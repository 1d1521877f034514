"""Opening the results database and guarding its use: a connection whose first read already
checked the file, and SQLite's errors (and a filesystem's under it) as one line
(StoreError) saying what is wrong and what to do."""

from __future__ import annotations

import functools
import sqlite3
from pathlib import Path
from typing import Any, Callable, TypeVar

from vmtax.core.errors import VmtaxError


class StoreError(VmtaxError):
    """The results database cannot be read or written."""



def problem(path: Path, exc: BaseException) -> str:
    """One line saying what is wrong with the database at path, and what to do."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if any(word in text for word in ("not a database", "malformed", "corrupt")):
        return (f"{path} is damaged ({text}); move it aside and vmtax starts a new one "
                f"(`sqlite3 {path} .recover` may rescue its runs), or give --results DIR")
    if "locked" in text or "busy" in text:
        return f"{path} is locked by another process ({text}); try again when it is done"
    return (f"{path} cannot be used ({text}); check the file's permissions and attributes "
            "(lsattr) and its filesystem, or give --results DIR")


_F = TypeVar("_F", bound=Callable[..., Any])


def guarded(method: _F) -> _F:
    """SQLite's errors (and a filesystem's under it) as one StoreError line."""
    @functools.wraps(method)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(problem(self.path, exc)) from None
    return wrapped  # type: ignore[return-value]


def connect(path: Path, uri: str | None = None) -> sqlite3.Connection:
    """A connection whose first read already checked the file: SQLite opens lazily, so a
    garbage header would otherwise surface at some later query."""
    db = (sqlite3.connect(uri, uri=True, timeout=30) if uri
          else sqlite3.connect(path, timeout=30))
    try:
        db.execute("PRAGMA schema_version").fetchone()
        # quick_check reads every page of the b-trees (not the indexes' contents): tens of
        # milliseconds for thousands of repetitions, and no half-broken file is run into.
        problems = [row[0] for row in db.execute("PRAGMA quick_check(3)")]
        if problems != ["ok"]:
            raise sqlite3.DatabaseError("database disk image is malformed: "
                                        + "; ".join(problems)[:200])
    except BaseException:
        db.close()
        raise
    return db

