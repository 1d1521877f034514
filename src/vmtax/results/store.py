"""Results in SQLite: one database per results directory, one row per repetition.

Each repetition is committed the moment it finishes, so an interrupted plan loses nothing.
A database that cannot take it (damaged, made immutable, deleted or on a filesystem gone
read-only while a run goes on) does not lose it either: from then on the run's records go
to one side file beside it (PENDING_NAME, JSON Lines, the run's own record first; from the
moment the results directory cannot take them either, a full disk, to one in the runtime
directory, which a line of PENDING_NAME names), which the next writer that opens the
directory, where it was or copied elsewhere, imports once. A writer opens a database only
after a quick integrity check; every SQLite error reaches the user as one line
(StoreError).
Nothing secret is stored (a job's secrets are kept as SECRET_SHOWN), so the database and
its side files get the umask's mode, readable by whom the user shares results with.

The schema is versioned by SQLite's `PRAGMA user_version`: a new database is created at
the newest schema (SCHEMA), an older one is brought to it by MIGRATIONS, one transaction
per step, when it is opened.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import secrets
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.core.types import Metric
from vmtax.host.proc import process_start_time, running

DB_NAME = "vmtax.sqlite"
PENDING_NAME = "vmtax.pending.jsonl"
# A line of PENDING_NAME that names the runtime side file a run's later records went to.
ELSEWHERE = "elsewhere"
_RUNTIME_SIDE_FILE = re.compile(r"pending-[0-9a-f]{16}\.jsonl")


class StoreError(VmtaxError):
    """The results database cannot be read or written."""


# A run's name (`vmtax run --name`) and an imported report's label start with a letter, so
# they never read as a run id (ids start with the date) or a prefix of one, and hold no ':'
# (RUN:TARGET), '@' (RUN@HOST) or space.
RUN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9._-]{0,63}")

# A report recorded elsewhere and imported (`vmtax exits import`) is stored as a run whose
# plan keeps the file it came from under this key, with one target named by its label.
IMPORTED = "imported"


def check_run_name(name: str, option: str = "--name") -> str:
    if not RUN_NAME.fullmatch(name) or name == "last":
        raise VmtaxError(f"{option}: expected a letter then letters, digits, '.', '_' or '-' "
                         f"(at most 64, not 'last'), got {name!r}")
    return name


# The newest schema, one statement each: it is created inside one transaction, which
# executescript() would commit first. Change it only together with a new MIGRATIONS step.
SCHEMA = (
    """CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        created REAL NOT NULL,
        finished REAL,
        status TEXT NOT NULL,            -- running | done | interrupted | failed
        plan TEXT NOT NULL,              -- JSON: the plan as run
        host TEXT NOT NULL,              -- JSON: host fingerprint
        version TEXT NOT NULL,
        pid INTEGER,                     -- the process running it, while it runs,
        pid_start INTEGER                -- and that process's start time (pids are reused)
    )""",
    """CREATE TABLE targets (
        run_id TEXT NOT NULL REFERENCES runs(id),
        name TEXT NOT NULL,
        kind TEXT NOT NULL,
        fingerprint TEXT NOT NULL,       -- JSON; "bare_host": true for the bare host
        PRIMARY KEY (run_id, name)
    )""",
    """CREATE TABLE reps (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs(id),
        target TEXT NOT NULL,
        workload TEXT NOT NULL,
        params TEXT NOT NULL,            -- JSON: the workload's parameters
        phase TEXT NOT NULL,             -- prepare | warmup | measure
        idx INTEGER NOT NULL,
        status TEXT NOT NULL,            -- ok | failed | timeout
        error TEXT,
        exit_code INTEGER,
        host_elapsed REAL,
        guest_elapsed REAL,
        started REAL NOT NULL,
        argv TEXT NOT NULL,              -- JSON
        stdout TEXT,
        stderr TEXT
    )""",
    "CREATE INDEX reps_run ON reps(run_id)",
    """CREATE TABLE metrics (
        rep_id INTEGER NOT NULL REFERENCES reps(id),
        name TEXT NOT NULL,
        value REAL NOT NULL,
        unit TEXT NOT NULL,
        higher_is_better INTEGER NOT NULL,
        dimensions TEXT NOT NULL DEFAULT '{}'   -- JSON object: {"percentile": "99"}
    )""",
    "CREATE INDEX metrics_rep ON metrics(rep_id)",
    """CREATE TABLE flags (              -- sanity flags of a finished run, as last computed
        run_id TEXT NOT NULL REFERENCES runs(id),
        target TEXT NOT NULL,
        workload TEXT NOT NULL,
        params TEXT NOT NULL,            -- JSON: the parameters that vary within the run
        metric TEXT NOT NULL,
        flag TEXT NOT NULL
    )""",
)


def _v1_dimensions_and_bare_host(db: sqlite3.Connection) -> None:
    """Metrics gain dimensions; fingerprints say whether the target is the bare host, so
    that analysis need not know which target kinds are."""
    db.execute("ALTER TABLE metrics ADD COLUMN dimensions TEXT NOT NULL DEFAULT '{}'")
    targets = db.execute("SELECT run_id, name, kind, fingerprint FROM targets").fetchall()
    db.executemany("UPDATE targets SET fingerprint = ? WHERE run_id = ? AND name = ?",
                   [(json.dumps({**json.loads(fingerprint), "bare_host": kind == "native"}),
                     run_id, name) for run_id, name, kind, fingerprint in targets])


# MIGRATIONS[n] brings a database from version n to n + 1. Version 0 is the schema of
# vmtax before versioning (tests/fixtures/store/v0.sqlite). Append steps, never edit
# one: databases in the wild have run them.
MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (
    _v1_dimensions_and_bare_host,
)
LATEST = len(MIGRATIONS)


def _schema_version(db: sqlite3.Connection, path: Path) -> int | None:
    """The database's schema version; None for a new database, which has no tables yet."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > LATEST:
        raise VmtaxError(f"{path} has schema version {version}, but this vmtax understands "
                         f"versions up to {LATEST}; upgrade vmtax")
    if version == 0 and not db.execute("SELECT 1 FROM sqlite_master").fetchone():
        return None
    return version


def _bring_up_to_date(db: sqlite3.Connection, path: Path) -> None:
    """Create the newest schema in a new database, or migrate an older one, committing each
    step with its new version. BEGIN IMMEDIATE takes the write lock before the version is
    read, so two vmtax opening one old database at once do not both run a step."""
    while True:
        db.execute("BEGIN IMMEDIATE")
        try:
            version = _schema_version(db, path)
            if version == LATEST:
                db.rollback()
                return
            if version is None:
                for statement in SCHEMA:
                    db.execute(statement)
                version = LATEST
            else:
                MIGRATIONS[version](db)
                version += 1
            db.execute(f"PRAGMA user_version = {version}")
            db.commit()
        except BaseException:
            db.rollback()
            raise


def _problem(path: Path, exc: BaseException) -> str:
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


def _guarded(method: _F) -> _F:
    """SQLite's errors (and a filesystem's under it) as one StoreError line."""
    @functools.wraps(method)
    def guarded(self: "Store", *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(_problem(self.path, exc)) from None
    return guarded  # type: ignore[return-value]


def _connect(path: Path, uri: str | None = None) -> sqlite3.Connection:
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


# What a secret (Job.secrets) is stored as.
SECRET_SHOWN = "***"


def _masker(secrets: Iterable[str]) -> Callable[[str | None], str | None]:
    """A function that replaces each of secrets (longest first: one may hold another)
    in a text by SECRET_SHOWN."""
    found = sorted({s for s in secrets if s}, key=len, reverse=True)
    if not found:
        return lambda text: text
    pattern = re.compile("|".join(map(re.escape, found)))
    return lambda text: None if text is None else pattern.sub(SECRET_SHOWN, text)


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


_REP_COLUMNS = ("run_id", "target", "workload", "params", "phase", "idx", "status", "error",
                "exit_code", "host_elapsed", "guest_elapsed", "started", "argv", "stdout",
                "stderr")


@dataclass
class Rep:
    id: int
    run_id: str
    target: str
    workload: str
    params: dict[str, Any]
    phase: str
    idx: int
    status: str
    error: str | None
    exit_code: int | None
    host_elapsed: float | None
    guest_elapsed: float | None
    started: float
    argv: list[str]
    stdout: str | None = None
    stderr: str | None = None
    metrics: list[Metric] = field(default_factory=list)


@dataclass
class Run:
    id: str
    created: float
    finished: float | None
    status: str
    plan: dict[str, Any]
    host: dict[str, Any]
    version: str
    targets: dict[str, dict[str, Any]]      # name -> {"kind", "fingerprint"}
    reps: list[Rep]


class Store:
    """The results database of one directory.

    Writers (the default) create the directory and database if needed. readonly=True is
    for commands that only read: it creates nothing, refuses a missing database and opens
    it read-only. Its one write: a database from an older vmtax is first migrated, through
    a brief read-write connection, as every later reader would need it to be.
    """

    def __init__(self, results_dir: str | os.PathLike, *, readonly: bool = False):
        self.dir = Path(results_dir)
        self.path = self.dir / DB_NAME
        self.pending = self.dir / PENDING_NAME
        # Where records go when the results directory refuses them too (a read-only
        # filesystem): named after the database, which may be gone by then.
        digest = hashlib.sha256(str(self.path.resolve()).encode()).hexdigest()[:16]
        self.fallback = paths.runtime_dir(create=False) / f"pending-{digest}.jsonl"
        self.aside: Path | None = None   # the side file records go to
        # Per run, the repetitions each side file holds.
        self.kept: dict[str, dict[Path, int]] = {}
        # Whether the results directory's side file names the runtime one.
        self.named = False
        self.readonly = readonly
        # Runs this process writes: their own records, for a side file to start with.
        self._records: dict[str, dict[str, Any]] = {}
        # Why the database stopped taking this process's records (None: it takes them).
        self.diverted: str | None = None
        try:
            if readonly:
                self.db = self._open_readonly()
            else:
                self.db = self._open_for_writing()
            self.db.row_factory = sqlite3.Row
            self._reap_orphans()
            if not readonly:
                self._import_pending()
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(_problem(self.path, exc)) from None
        self._identity = self._file_identity()

    def _open_for_writing(self) -> sqlite3.Connection:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            probe = self.dir / f".write-test-{os.getpid()}"
            probe.touch()
            probe.unlink()
        except OSError as exc:
            raise VmtaxError(f"results directory {self.dir} is not writable ({exc.strerror}); "
                             "choose another with --results DIR") from None
        if self.path.exists() and not os.access(self.path, os.R_OK | os.W_OK):
            raise StoreError(_problem(self.path, PermissionError(
                "the file cannot be read and written; an immutable attribute, or its mode")))
        db = _connect(self.path)
        try:
            _bring_up_to_date(db, self.path)
        except BaseException:
            db.close()
            raise
        return db

    def _open_readonly(self) -> sqlite3.Connection:
        missing = VmtaxError(f"no results database at {self.path}; run `vmtax run` first "
                             "(or give --results DIR / VMTAX_RESULTS)")
        if not self.path.is_file():
            raise missing
        uri = self.path.resolve().as_uri() + "?mode=ro"
        db = _connect(self.path, uri)
        try:
            version = _schema_version(db, self.path)
            if version is None:     # left empty by a writer that died before its schema
                raise missing
            if version < LATEST:
                db.close()
                self._migrate_briefly()
                db = sqlite3.connect(uri, uri=True, timeout=30)
        except BaseException:
            db.close()
            raise
        return db

    def _migrate_briefly(self) -> None:
        db = sqlite3.connect(self.path, timeout=30)
        try:
            _bring_up_to_date(db, self.path)
        except sqlite3.OperationalError as exc:
            raise VmtaxError(f"{self.path} is from an older vmtax and must be upgraded, but "
                             f"cannot be written ({exc}); make it writable once") from None
        finally:
            db.close()

    def _reap_orphans(self) -> None:
        """Runs whose vmtax was killed (SIGKILL, power loss) never said so: say it for them.
        A read-only store only reports them as interrupted; the next writer records it."""
        self._orphans = {r["id"] for r in self.db.execute(
            "SELECT id, pid, pid_start FROM runs WHERE status = 'running'")
            if r["pid"] is None or not running(r["pid"], r["pid_start"])}
        if self.readonly:
            return
        with self.db:
            self.db.executemany("UPDATE runs SET status = 'interrupted' WHERE id = ?",
                                [(run_id,) for run_id in self._orphans])
        self._orphans.clear()

    def _status(self, row: sqlite3.Row) -> str:
        return "interrupted" if row["id"] in self._orphans else row["status"]

    def close(self) -> None:
        self.db.close()

    # -- the side file ---------------------------------------------------------------------
    def _file_identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _write(self, run_id: str, record: dict[str, Any], write: Callable[[], Any]) -> Any:
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
        """Import the side file at path and delete it; the runtime files it names."""
        try:
            f = open(path, "r", encoding="utf-8")
        except FileNotFoundError:
            return []
        with f:
            fcntl.flock(f, fcntl.LOCK_EX)
            if os.fstat(f.fileno()).st_ino != _inode(path):
                return []    # imported by another vmtax meanwhile
            named = self._import_lines(path, f.read().splitlines())
            path.unlink()
        return named

    def _import_lines(self, path: Path, lines: list[str]) -> list[Path]:
        records = []
        for number, line in enumerate(lines, 1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                if number < len(lines):   # only the last line may be cut short by a crash
                    raise StoreError(f"{path}:{number}: not a record of vmtax "
                                     f"({exc.msg}); move the file aside") from None
        named = []
        try:
            with self.db:
                for r in records:
                    if r.get("kind") == ELSEWHERE:
                        named.append(self._runtime_side_file(path, r["path"]))
                    else:
                        self._import_record(r)
        except (KeyError, TypeError, AttributeError) as exc:
            raise StoreError(f"{path}: a record lacks {exc} or is not an object; "
                             "move the file aside") from None
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
            tuple(r[c] for c in _REP_COLUMNS))
        rep_id = cur.lastrowid
        assert rep_id is not None    # set by the INSERT just done
        self.db.executemany(
            "INSERT INTO metrics (rep_id, name, value, unit, higher_is_better, dimensions)"
            " VALUES (?,?,?,?,?,?)", [(rep_id, *m) for m in r["metrics"]])
        return rep_id

    # -- writing ---------------------------------------------------------------------------
    @_guarded
    def new_run(self, plan: dict[str, Any], host: dict[str, Any], version: str) -> str:
        run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)
        record = {"id": run_id, "created": time.time(), "plan": json.dumps(plan),
                  "host": json.dumps(host), "version": version}
        with self.db:
            self.db.execute("INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?)",
                            (run_id, record["created"], None, "running", record["plan"],
                             record["host"], version, os.getpid(),
                             process_start_time(os.getpid())))
        self._records[run_id] = {"run": record, "targets": {}, "aside": set()}
        return run_id

    def set_target(self, run_id: str, name: str, kind: str, fingerprint: dict[str, Any]) -> None:
        record = {"run_id": run_id, "name": name, "target_kind": kind,
                  "fingerprint": json.dumps(fingerprint)}
        if run_id in self._records:
            self._records[run_id]["targets"][name] = record

        def write() -> None:
            with self.db:
                self.db.execute("INSERT OR REPLACE INTO targets VALUES (?,?,?,?)",
                                (run_id, name, kind, record["fingerprint"]))
        self._write(run_id, {"kind": "target", **record}, write)

    def add_rep(self, run_id: str, *, target: str, workload: str, params: dict[str, Any],
                phase: str, idx: int, status: str, argv: list[str], started: float,
                error: str | None = None, exit_code: int | None = None,
                host_elapsed: float | None = None, guest_elapsed: float | None = None,
                stdout: str | None = None, stderr: str | None = None,
                metrics: Iterable[Metric] = (), secrets: Iterable[str] = ()) -> int | None:
        """Store one finished repetition and its metrics in one transaction; its id, or
        None when the database could not take it and it went to the side file. Each of
        secrets (Job.secrets) is stored as SECRET_SHOWN wherever it appears."""
        hide = _masker(secrets)
        record = {"kind": "rep", "run_id": run_id, "target": target, "workload": workload,
                  "params": json.dumps(params, sort_keys=True), "phase": phase, "idx": idx,
                  "status": status, "error": hide(error), "exit_code": exit_code,
                  "host_elapsed": host_elapsed, "guest_elapsed": guest_elapsed,
                  "started": started, "argv": json.dumps([hide(a) for a in argv]),
                  "stdout": hide(stdout), "stderr": hide(stderr),
                  "metrics": [(m.name, m.value, m.unit, int(m.higher_is_better),
                               json.dumps(dict(m.dimensions), sort_keys=True))
                              for m in metrics]}

        def write() -> int:
            with self.db:
                return self._insert_rep(record)
        return self._write(run_id, record, write)

    def finish_run(self, run_id: str, status: str) -> None:
        finished = time.time()

        def write() -> None:
            with self.db:
                self.db.execute("UPDATE runs SET finished=?, status=?, pid=NULL,"
                                " pid_start=NULL WHERE id=?", (finished, status, run_id))
        self._write(run_id, {"kind": "finish", "run_id": run_id, "finished": finished,
                             "status": status}, write)

    @_guarded
    def import_runs(self, other_dir: str | os.PathLike) -> list[str]:
        """Copy in the runs of another results directory that this one lacks (a lab's,
        made in a guest): their targets, repetitions, metrics and flags, as ordinary runs.
        Their ids, oldest first. A run the other vmtax never finished is interrupted."""
        other = _connect(Path(other_dir) / DB_NAME)
        other.row_factory = sqlite3.Row
        try:
            _bring_up_to_date(other, Path(other_dir) / DB_NAME)
            ids = [r["id"] for r in other.execute("SELECT id FROM runs ORDER BY created")
                   if not self.db.execute("SELECT 1 FROM runs WHERE id = ?",
                                          (r["id"],)).fetchone()]
            with self.db:
                for run_id in ids:
                    self._copy_run(other, run_id)
        finally:
            other.close()
        return ids

    def _copy_run(self, other: sqlite3.Connection, run_id: str) -> None:
        run = other.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        self.db.execute("INSERT INTO runs VALUES (?,?,?,?,?,?,?,NULL,NULL)",
                        (run["id"], run["created"], run["finished"],
                         "interrupted" if run["status"] == "running" else run["status"],
                         run["plan"], run["host"], run["version"]))
        targets = other.execute("SELECT run_id, name, kind, fingerprint FROM targets"
                                " WHERE run_id = ?", (run_id,))
        self.db.executemany("INSERT INTO targets VALUES (?,?,?,?)", [tuple(t) for t in targets])
        for rep in other.execute("SELECT * FROM reps WHERE run_id = ? ORDER BY id", (run_id,)):
            metrics = other.execute("SELECT name, value, unit, higher_is_better, dimensions"
                                    " FROM metrics WHERE rep_id = ?", (rep["id"],))
            self._insert_rep({**{c: rep[c] for c in _REP_COLUMNS},
                              "metrics": [tuple(m) for m in metrics]})
        flags = other.execute("SELECT run_id, target, workload, params, metric, flag"
                              " FROM flags WHERE run_id = ?", (run_id,))
        self.db.executemany("INSERT INTO flags VALUES (?,?,?,?,?,?)", [tuple(f) for f in flags])

    @_guarded
    def set_flags(self, run_id: str, flags: Iterable[tuple[str, str, dict, str, str]]) -> None:
        """Replace the run's stored sanity flags: (target, workload, params, metric, flag)."""
        if self.diverted is not None:
            raise self._aside_error(run_id)
        with self.db:
            self.db.execute("DELETE FROM flags WHERE run_id = ?", (run_id,))
            self.db.executemany("INSERT INTO flags VALUES (?,?,?,?,?,?)",
                                [(run_id, t, w, json.dumps(p, sort_keys=True), m, f)
                                 for t, w, p, m, f in flags])

    @_guarded
    def set_host_quiet(self, run_id: str, before: dict[str, Any], after: dict[str, Any]) -> None:
        """Keep how quiet the host was before and after the run (vmtax.host.quiet
        snapshots) with its host facts: host.quiet.before / .after."""
        with self.db:
            self.db.execute("UPDATE runs SET host = json_set(host, '$.quiet', json(?))"
                            " WHERE id = ?", (json.dumps({"before": before, "after": after}),
                                              run_id))

    @_guarded
    def flags(self, run_id: str) -> list[tuple[str, str, dict, str, str]]:
        return [(r["target"], r["workload"], json.loads(r["params"]), r["metric"], r["flag"])
                for r in self.db.execute("SELECT * FROM flags WHERE run_id = ?", (run_id,))]

    @_guarded
    def claim_run(self, run_id: str) -> None:
        """Make this process the one executing run_id (to resume it), unless another live
        one is. BEGIN IMMEDIATE: of two processes claiming at once, the second sees the
        first's claim."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            pid, start = self.db.execute("SELECT pid, pid_start FROM runs WHERE id = ?",
                                         (run_id,)).fetchone()
            if pid is not None and pid != os.getpid() and running(pid, start):
                raise VmtaxError(f"run {run_id} is in progress (PID {pid})")
            self.db.execute("UPDATE runs SET pid = ?, pid_start = ? WHERE id = ?",
                            (os.getpid(), process_start_time(os.getpid()), run_id))
            self.db.commit()
        except BaseException:
            self.db.rollback()
            raise
        row = self.db.execute("SELECT id, created, plan, host, version FROM runs WHERE id = ?",
                              (run_id,)).fetchone()
        self._records[run_id] = {"run": dict(row), "targets": {}, "aside": set()}

    @_guarded
    def reopen_run(self, run_id: str) -> None:
        """A resumed run (claimed by this process) is running again."""
        with self.db:
            self.db.execute("UPDATE runs SET status='running' WHERE id=?", (run_id,))

    # -- reading ---------------------------------------------------------------------------
    @_guarded
    def list_runs(self, *, imported: bool = True) -> list[dict[str, Any]]:
        """The stored runs, oldest first; without imported reports unless imported."""
        recorded = "" if imported else f" WHERE json_extract(r.plan, '$.{IMPORTED}') IS NULL"
        rows = self.db.execute(
            "SELECT r.id, r.created, r.finished, r.status,"
            " (SELECT group_concat(name, ',') FROM targets t WHERE t.run_id = r.id) AS targets,"
            " (SELECT group_concat(DISTINCT workload) FROM reps p WHERE p.run_id = r.id)"
            " AS workloads,"
            " (SELECT count(*) FROM reps p WHERE p.run_id = r.id AND p.phase = 'measure') AS reps,"
            " (SELECT count(*) FROM reps p WHERE p.run_id = r.id AND p.phase = 'measure'"
            "  AND p.status != 'ok') AS failed"
            f" FROM runs r{recorded} ORDER BY r.created").fetchall()
        return [{"id": r["id"], "created": r["created"], "finished": r["finished"],
                 "status": self._status(r),
                 "targets": (r["targets"] or "").split(",") if r["targets"] else [],
                 "workloads": sorted((r["workloads"] or "").split(",")) if r["workloads"] else [],
                 "reps": r["reps"], "failed": r["failed"]} for r in rows]

    @_guarded
    def run_names(self) -> dict[str, str]:
        """Run id -> the name it was given (`vmtax run --name`), for runs that have one."""
        return {row[0]: row[1] for row in self.db.execute(
            "SELECT id, json_extract(plan, '$.name') FROM runs"
            " WHERE json_extract(plan, '$.name') IS NOT NULL")}

    @_guarded
    def resolve(self, spec: str, *, last_may_be_imported: bool = False) -> str:
        """The id of the run spec names, read in this order:
        - 'last': the latest run recorded here; an imported report only with
          last_may_be_imported (for `vmtax exits`, whose runs they are);
        - a run id;
        - a run's name or an imported report's label: the latest run that has it (of two
          imports of one label, or a run and an import of one name, the later);
        - a unique prefix of a run id.
        A name that is also a prefix of a run id is refused as ambiguous."""
        if spec == "last":
            return self._last(last_may_be_imported)
        if self.db.execute("SELECT 1 FROM runs WHERE id = ?", (spec,)).fetchone():
            return spec
        named = self.db.execute(
            "SELECT id FROM runs WHERE json_extract(plan, '$.name') = ?"
            f" OR (json_extract(plan, '$.{IMPORTED}') IS NOT NULL"
            "     AND EXISTS (SELECT 1 FROM targets t WHERE t.run_id = runs.id AND t.name = ?))"
            " ORDER BY created DESC LIMIT 1", (spec, spec)).fetchone()
        # LIKE would take '_' and '%' in spec as wildcards.
        prefixed = [row["id"] for row in self.db.execute(
            "SELECT id FROM runs WHERE substr(id, 1, ?) = ?", (len(spec), spec))]
        if named:
            others = [run_id for run_id in prefixed if run_id != named["id"]]
            if others:
                raise VmtaxError(f"{spec!r} is both the name of run {named['id']} and a "
                                 f"prefix of run id {others[0]}; give the whole run id")
            return named["id"]
        if len(prefixed) == 1:
            return prefixed[0]
        if not prefixed:
            raise VmtaxError(f"unknown run id {spec!r} in {self.path}: no run's id, name or "
                             "imported report's label matches it; `vmtax runs` lists them")
        raise VmtaxError(f"run id {spec!r} is ambiguous ({len(prefixed)} runs match); "
                         "give more of it")

    def _last(self, imported: bool) -> str:
        recorded = "" if imported else f" WHERE json_extract(plan, '$.{IMPORTED}') IS NULL"
        row = self.db.execute(f"SELECT id FROM runs{recorded} ORDER BY created DESC"
                              " LIMIT 1").fetchone()
        if row is not None:
            return row["id"]
        if self.db.execute("SELECT 1 FROM runs").fetchone():
            raise VmtaxError(f"no runs recorded in {self.path}, only imported perf kvm stat "
                             "reports, which `last` leaves out: `vmtax exits last` shows them")
        raise VmtaxError(f"no runs stored in {self.path}")

    @_guarded
    def load_run(self, spec: str, *, with_output: bool = False,
                 last_may_be_imported: bool = False) -> Run:
        """The run spec names (see resolve)."""
        run_id = self.resolve(spec, last_may_be_imported=last_may_be_imported)
        if self.diverted is not None and run_id in self._records:
            raise self._aside_error(run_id)
        r = self.db.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        targets = {t["name"]: {"kind": t["kind"], "fingerprint": json.loads(t["fingerprint"])}
                   for t in self.db.execute("SELECT * FROM targets WHERE run_id=?", (run_id,))}
        reps: dict[int, Rep] = {}
        for p in self.db.execute("SELECT * FROM reps WHERE run_id=? ORDER BY id", (run_id,)):
            reps[p["id"]] = Rep(
                id=p["id"], run_id=run_id, target=p["target"], workload=p["workload"],
                params=json.loads(p["params"]), phase=p["phase"], idx=p["idx"],
                status=p["status"], error=p["error"], exit_code=p["exit_code"],
                host_elapsed=p["host_elapsed"], guest_elapsed=p["guest_elapsed"],
                started=p["started"], argv=json.loads(p["argv"]),
                stdout=p["stdout"] if with_output else None,
                stderr=p["stderr"] if with_output else None)
        for m in self.db.execute(
                "SELECT m.* FROM metrics m JOIN reps p ON p.id = m.rep_id WHERE p.run_id=?",
                (run_id,)):
            reps[m["rep_id"]].metrics.append(
                Metric(m["name"], m["value"], m["unit"], bool(m["higher_is_better"]),
                       json.loads(m["dimensions"])))
        return Run(id=run_id, created=r["created"], finished=r["finished"], status=self._status(r),
                   plan=json.loads(r["plan"]), host=json.loads(r["host"]), version=r["version"],
                   targets=targets, reps=list(reps.values()))
