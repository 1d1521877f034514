"""Opening the results database and guarding its use: a connection whose first read already
checked the file, and SQLite's errors (and a filesystem's under it) as one line
(StoreError) saying what is wrong and what to do."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Any, Callable, TypeVar

from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.core.files import read_json


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
        stamp = _stamp(path)
        if stamp != _checked(path):
            # quick_check reads every page of the b-trees (not the indexes' contents): no
            # half-broken file is run into. It costs ~90 ms at 400 runs, so a file no write
            # has touched since it last passed is not read through again.
            problems = [row[0] for row in db.execute("PRAGMA quick_check(3)")]
            if problems != ["ok"]:
                raise sqlite3.DatabaseError("database disk image is malformed: "
                                            + "; ".join(problems)[:200])
            _remember(path, stamp)   # as it was checked: a write meanwhile checks again
    except BaseException:
        db.close()
        raise
    return db


def hot_journal(path: Path) -> Path | None:
    """The rollback journal beside the database at path, when it holds pages: a commit a
    killed vmtax left unfinished (a hot journal), or one a live writer is making."""
    journal = path.with_name(path.name + "-journal")
    try:
        return journal if os.stat(journal).st_size > 0 else None
    except OSError:
        return None


def roll_back(path: Path) -> bool:
    """Roll back a commit a killed vmtax left unfinished in the database at path (SQLite
    does on the first read of a connection that may write); whether one was. A read-only
    connection cannot, and fails on every read until then ("attempt to write a readonly
    database"): a StoreError says so, and how to recover, when this one cannot either."""
    journal = hot_journal(path)
    if journal is None:
        return False
    try:
        db = sqlite3.connect(path, timeout=30)
        try:
            db.execute("PRAGMA schema_version").fetchone()
        finally:
            db.close()
    except (sqlite3.Error, OSError) as exc:
        raise StoreError(
            f"{path} holds a commit a killed vmtax left unfinished (its hot journal "
            f"{journal.name}), which needs write access to {path.parent} to be rolled back "
            f"({' '.join(str(exc).split())}); as a user who can write there, run `vmtax "
            f"cleanup --results {path.parent}`") from None
    return hot_journal(path) is None   # a live writer's journal stays


def _stamp(path: Path) -> list[list[int] | None]:
    """What any write to the database or its write-ahead log changes (ctime included, which
    no user can set back)."""
    stamps: list[list[int] | None] = []
    for file in (path, path.with_name(path.name + "-wal")):
        try:
            st = os.stat(file)
        except FileNotFoundError:
            stamps.append(None)
            continue
        stamps.append([st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
    return stamps


def _record(path: Path) -> Path:
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24]
    return paths.cache_dir() / "checked" / f"{key}.json"


def _checked(path: Path) -> Any:
    """The stamp the database had when it last passed its check (None: never, or unknown,
    or garbled). A stamp vmtax did not write (a FIFO, another user's, vmtax.core.files) is
    refused in one line: it would skip the check."""
    with contextlib.suppress(FileNotFoundError, ValueError):
        return read_json(_record(path), "the stamp of a checked database", 4096)
    return None


def _remember(path: Path, stamp: list[list[int] | None]) -> None:
    with contextlib.suppress(OSError):   # a read-only cache only costs the next call time
        record = _record(path)
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_name(f"{record.name}.{os.getpid()}")
        tmp.write_text(json.dumps(stamp))
        tmp.replace(record)

