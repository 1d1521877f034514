"""The pending side file: where a run's records go once the results database cannot take
them (damaged, made immutable, deleted or on a filesystem gone read-only while a run goes
on), and how the next writer that opens the directory imports them, once.

The records go to one side file beside the database (PENDING_NAME, JSON Lines, the run's
own record first); from the moment the results directory cannot take them either (a full
disk), to one in the runtime directory, which a line of PENDING_NAME names (ELSEWHERE).
PendingSideFile is the part of vmtax.results.store.Store that does this.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import sqlite3
from pathlib import Path
from typing import Any, Callable, TypeVar

from vmtax.core.errors import VmtaxError
from vmtax.core.files import open_back, read_fd, too_large
from vmtax.results import side_records
from vmtax.results.connection import StoreError
from vmtax.results.schema import add_point_value

PENDING_NAME = "vmtax.pending.jsonl"
# A line of PENDING_NAME that names the runtime side file a run's later records went to.
ELSEWHERE = "elsewhere"
# What one write of the database gives back (a repetition's id, say).
Written = TypeVar("Written")
_RUNTIME_SIDE_FILE = re.compile(r"pending-[0-9a-f]{16}\.jsonl")
# A side file holds a run's repetitions (their output too) while its database is away.
MAX_SIDE_FILE = 256 << 20

REP_COLUMNS = ("run_id", "target", "workload", "params", "phase", "idx", "status", "error",
                "exit_code", "host_elapsed", "guest_elapsed", "started", "argv", "stdout",
                "stderr")


def _owner(directory: Path) -> int:
    """The store's owner: who owns its directory (and could replace what is in it)."""
    try:
        return os.stat(directory).st_uid
    except OSError:
        return os.geteuid()


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


class PendingSideFile:
    """Writes that go aside once the database stops taking them, and their import."""

    db: sqlite3.Connection
    dir: Path
    path: Path
    pending: Path
    fallback: Path
    aside: Path | None
    kept: dict[str, dict[Path, int]]
    named: bool
    diverted: str | None
    _records: dict[str, dict[str, Any]]
    _identity: tuple[int, int] | None

    def _file_identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _write(self, run_id: str, record: dict[str, Any],
               write: Callable[[], Written]) -> Written | None:
        """Do one write of run_id's, or once the database cannot take it, append record to
        the side file; returns write's result, or None when the record went aside."""
        if self.diverted is None:
            # A file deleted or replaced under the open connection takes writes that
            # nobody will ever read: those go aside too.
            if self._identity is not None and self._file_identity() != self._identity:
                self.diverted = "the file was deleted or replaced while vmtax ran"
            else:
                try:
                    return write()
                except (sqlite3.Error, OSError) as exc:
                    self.diverted = str(exc) or type(exc).__name__
        self._append_pending(run_id, record)
        return None

    def _append_pending(self, run_id: str, record: dict[str, Any]) -> None:
        """Append record to the run's one side file: beside the database while that
        directory takes it, else (a full disk) the runtime one for good, which a line in
        the results directory's side file names, so a copy of the directory finds it. A
        run's records never go back, so its last record (`finish`) follows all others."""
        failures = []
        for path in ([self.fallback] if self.aside == self.fallback
                     else [self.pending, self.fallback]):
            if path == self.fallback and self.aside != self.fallback and not self.named:
                self.named = self._name_fallback()
            # The first lines beside the database name the runtime file ahead: once the
            # disk is full, even that small line may not fit.
            lines = ([{"kind": ELSEWHERE, "path": str(self.fallback)}]
                     if path == self.pending and not self.named else [])
            header = self._records.get(run_id)
            if header is not None and path not in header["aside"]:
                lines += [{"kind": "run", **header["run"]},
                          *({"kind": "target", **t} for t in header["targets"].values())]
            lines.append(record)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._append(path, "".join(json.dumps(line, sort_keys=True) + "\n"
                                           for line in lines))
            except OSError as exc:
                failures.append(f"{path}: {exc.strerror}")
                continue
            if header is not None:
                header["aside"].add(path)
            self.aside = path
            self.named = self.named or path == self.pending
            kept = self.kept.setdefault(run_id, {})
            kept[path] = kept.get(path, 0) + (record["kind"] == "rep")
            return
        raise StoreError(f"{self.path} cannot take results ({self.diverted}) and neither can "
                         f"a side file ({'; '.join(failures)}); the run stops here")

    def _name_fallback(self) -> bool:
        """Write into the results directory's side file where the rest goes; whether it
        could be written (a small append may fit where a repetition did not)."""
        try:
            self._append(self.pending, json.dumps({"kind": ELSEWHERE,
                                                   "path": str(self.fallback)}) + "\n")
        except OSError:
            return False
        return True

    @staticmethod
    def _append(path: Path, text: str) -> None:
        """Append all of text to path or nothing: a write cut short by a full disk is
        taken back, so a later record never follows half a line."""
        data = text.encode()
        while True:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                # An importer may have taken the file meanwhile: append to the new one.
                if os.fstat(fd).st_ino != _inode(path):
                    continue
                size = os.fstat(fd).st_size
                try:
                    written = 0
                    while written < len(data):
                        written += os.write(fd, data[written:])
                    os.fsync(fd)
                except OSError:
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, size)
                    raise
                return
            finally:
                os.close(fd)

    def _aside_error(self, run_id: str) -> StoreError:
        kept = self.kept.get(run_id, {})
        total = sum(kept.values())
        if len(kept) == 1:
            where = f"are kept in {next(iter(kept))}"
        else:
            where = "are kept aside: " + ", ".join(f"{n} in {path}" for path, n in kept.items())
        if self.fallback in kept:
            where += (f" (named in {self.pending}, so a copy of {self.dir} finds it on this "
                      "host)" if self.named else
                      f" (which nothing in {self.dir} names: the disk is full)")
        return StoreError(
            f"{self.path} stopped taking results ({self.diverted}); {total} repetitions of "
            f"run {run_id} {where}, imported by the next vmtax run that opens {self.dir}" + (
                "" if self._file_identity() is None else
                " (move the damaged database aside first if it stays unusable)"))

    def _import_pending(self) -> None:
        """Bring what an earlier vmtax kept aside into the database, once: a repetition
        already stored (same run, target, configuration, phase and index) is skipped. The
        side file beside the database comes first, then the runtime files it names (a
        directory copied or moved finds them too), then this directory's own runtime file.
        A file's lock keeps a vmtax still appending to it, or another importing it, out."""
        named = self._import_file(self.pending)
        for path in [*named, self.fallback]:
            self._import_file(path)

    def _import_file(self, path: Path) -> list[Path]:
        """Import the side file at path and delete it; the runtime files it names. Only a
        file as vmtax writes it is read (vmtax.core.files: a bounded regular file, of the
        store's owner, writable by no one else), and only records that pass the rules of
        a first write are imported (side_records), all or none."""
        try:
            fd = open_back(path, "the side file", owners={_owner(self.dir)})
        except FileNotFoundError:
            return []
        except VmtaxError as exc:
            raise StoreError(f"{exc}; it holds results not yet stored, if vmtax wrote it: "
                             "move it aside") from None
        with open(fd, "rb") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            if os.fstat(f.fileno()).st_ino != _inode(path):
                return []    # imported by another vmtax meanwhile
            data = read_fd(f.fileno(), MAX_SIDE_FILE)
            if data is None:
                raise StoreError(f"{too_large(path, 'the side file', MAX_SIDE_FILE)}")
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise StoreError(f"{path}: not a side file of vmtax (not UTF-8 text at byte "
                                 f"{exc.start}); move the file aside") from None
            named = self._import_lines(path, text.splitlines())
            path.unlink()
        return named

    def _import_lines(self, path: Path, lines: list[str]) -> list[Path]:
        records = []
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                if number < len(lines):   # only the last line may be cut short by a crash
                    raise StoreError(f"{path}:{number}: not a record of vmtax "
                                     f"({exc.msg}); move the file aside") from None
                continue
            problem = side_records.problem(record)
            if problem:
                raise StoreError(f"{path}:{number}: {problem}; nothing of it was imported: "
                                 "move the file aside")
            records.append(record)
        named = []
        with self.db:
            for r in records:
                if r["kind"] == ELSEWHERE:
                    named.append(self._runtime_side_file(path, r["path"]))
                else:
                    self._import_record(r)
        return named

    def _runtime_side_file(self, source: Path, named: str) -> Path:
        """The runtime side file a results directory's side file names: only one of
        vmtax's own, which importing deletes."""
        path = Path(named)
        if path.parent != self.fallback.parent or not _RUNTIME_SIDE_FILE.fullmatch(path.name):
            raise StoreError(f"{source}: names {named!r}, which is not a side file of vmtax "
                             f"in {self.fallback.parent}; move the file aside")
        return path

    def _import_record(self, r: dict[str, Any]) -> None:
        kind = r.get("kind")
        if kind == "run":
            self.db.execute("INSERT OR IGNORE INTO runs VALUES (?,?,?,?,?,?,?,?,?)",
                            (r["id"], r["created"], None, "interrupted", r["plan"], r["host"],
                             r["version"], None, None))
        elif kind == "target":
            self.db.execute("INSERT OR REPLACE INTO targets VALUES (?,?,?,?)",
                            (r["run_id"], r["name"], r["target_kind"], r["fingerprint"]))
        elif kind == "rep" and not self.db.execute(
                "SELECT 1 FROM reps WHERE run_id=? AND target=? AND workload=? AND params=?"
                " AND phase=? AND idx=?", (r["run_id"], r["target"], r["workload"],
                                           r["params"], r["phase"], r["idx"])).fetchone():
            self._insert_rep(r)
        elif kind == "finish":
            self.db.execute("UPDATE runs SET finished=?, status=?, pid=NULL, pid_start=NULL"
                            " WHERE id=?", (r["finished"], r["status"], r["run_id"]))

    def _insert_rep(self, r: dict[str, Any]) -> int:
        cur = self.db.execute(
            "INSERT INTO reps (run_id, target, workload, params, phase, idx, status, error,"
            " exit_code, host_elapsed, guest_elapsed, started, argv, stdout, stderr)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            tuple(r[c] for c in REP_COLUMNS))
        rep_id = cur.lastrowid
        assert rep_id is not None    # set by the INSERT just done
        self.db.executemany(
            "INSERT INTO metrics (rep_id, name, value, unit, higher_is_better, dimensions)"
            " VALUES (?,?,?,?,?,?)", [(rep_id, *m) for m in r["metrics"]])
        if r["phase"] == "measure" and r["status"] == "ok":
            for name, value, unit, higher_is_better, dimensions in r["metrics"]:
                add_point_value(self.db, rep_id, (r["run_id"], r["target"], r["workload"],
                                                  r["params"], name, unit, higher_is_better,
                                                  dimensions), value)
        return rep_id
