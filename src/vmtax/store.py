"""Results in SQLite: one database per results directory, one row per repetition.

Each repetition is committed the moment it finishes, so an interrupted plan loses nothing.

The schema is versioned by SQLite's `PRAGMA user_version`: a new database is created at
the newest schema (SCHEMA), an older one is brought to it by MIGRATIONS, one transaction
per step, when it is opened.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from vmtax.errors import VmtaxError
from vmtax.proc import process_start_time, running
from vmtax.types import Metric

DB_NAME = "vmtax.sqlite"

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
        self.readonly = readonly
        if readonly:
            self.db = self._open_readonly()
        else:
            self.db = self._open_for_writing()
        self.db.row_factory = sqlite3.Row
        self._reap_orphans()

    def _open_for_writing(self) -> sqlite3.Connection:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            probe = self.dir / f".write-test-{os.getpid()}"
            probe.touch()
            probe.unlink()
        except OSError as exc:
            raise VmtaxError(f"results directory {self.dir} is not writable ({exc.strerror}); "
                             "choose another with --results DIR") from None
        db = sqlite3.connect(self.path, timeout=30)
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
        db = sqlite3.connect(uri, uri=True, timeout=30)
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

    # -- writing ---------------------------------------------------------------------------
    def new_run(self, plan: dict[str, Any], host: dict[str, Any], version: str) -> str:
        run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)
        with self.db:
            self.db.execute("INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?)",
                            (run_id, time.time(), None, "running", json.dumps(plan),
                             json.dumps(host), version, os.getpid(),
                             process_start_time(os.getpid())))
        return run_id

    def set_target(self, run_id: str, name: str, kind: str, fingerprint: dict[str, Any]) -> None:
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO targets VALUES (?,?,?,?)",
                            (run_id, name, kind, json.dumps(fingerprint)))

    def add_rep(self, run_id: str, *, target: str, workload: str, params: dict[str, Any],
                phase: str, idx: int, status: str, argv: list[str], started: float,
                error: str | None = None, exit_code: int | None = None,
                host_elapsed: float | None = None, guest_elapsed: float | None = None,
                stdout: str | None = None, stderr: str | None = None,
                metrics: Iterable[Metric] = ()) -> int:
        """Store one finished repetition and its metrics in one transaction."""
        with self.db:
            cur = self.db.execute(
                "INSERT INTO reps (run_id, target, workload, params, phase, idx, status, error,"
                " exit_code, host_elapsed, guest_elapsed, started, argv, stdout, stderr)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (run_id, target, workload, json.dumps(params, sort_keys=True), phase, idx, status,
                 error, exit_code, host_elapsed, guest_elapsed, started, json.dumps(argv),
                 stdout, stderr))
            rep_id = cur.lastrowid
            assert rep_id is not None    # set by the INSERT just done
            self.db.executemany(
                "INSERT INTO metrics (rep_id, name, value, unit, higher_is_better, dimensions)"
                " VALUES (?,?,?,?,?,?)",
                [(rep_id, m.name, m.value, m.unit, int(m.higher_is_better),
                  json.dumps(dict(m.dimensions), sort_keys=True)) for m in metrics])
        return rep_id

    def finish_run(self, run_id: str, status: str) -> None:
        with self.db:
            self.db.execute("UPDATE runs SET finished=?, status=?, pid=NULL, pid_start=NULL"
                            " WHERE id=?",
                            (time.time(), status, run_id))

    def set_flags(self, run_id: str, flags: Iterable[tuple[str, str, dict, str, str]]) -> None:
        """Replace the run's stored sanity flags: (target, workload, params, metric, flag)."""
        with self.db:
            self.db.execute("DELETE FROM flags WHERE run_id = ?", (run_id,))
            self.db.executemany("INSERT INTO flags VALUES (?,?,?,?,?,?)",
                                [(run_id, t, w, json.dumps(p, sort_keys=True), m, f)
                                 for t, w, p, m, f in flags])

    def flags(self, run_id: str) -> list[tuple[str, str, dict, str, str]]:
        return [(r["target"], r["workload"], json.loads(r["params"]), r["metric"], r["flag"])
                for r in self.db.execute("SELECT * FROM flags WHERE run_id = ?", (run_id,))]

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

    def reopen_run(self, run_id: str) -> None:
        """A resumed run (claimed by this process) is running again."""
        with self.db:
            self.db.execute("UPDATE runs SET status='running' WHERE id=?", (run_id,))

    # -- reading ---------------------------------------------------------------------------
    def list_runs(self) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT r.id, r.created, r.finished, r.status,"
            " (SELECT group_concat(name, ',') FROM targets t WHERE t.run_id = r.id) AS targets,"
            " (SELECT group_concat(DISTINCT workload) FROM reps p WHERE p.run_id = r.id)"
            " AS workloads,"
            " (SELECT count(*) FROM reps p WHERE p.run_id = r.id AND p.phase = 'measure') AS reps,"
            " (SELECT count(*) FROM reps p WHERE p.run_id = r.id AND p.phase = 'measure'"
            "  AND p.status != 'ok') AS failed"
            " FROM runs r ORDER BY r.created").fetchall()
        return [{"id": r["id"], "created": r["created"], "finished": r["finished"],
                 "status": self._status(r),
                 "targets": (r["targets"] or "").split(",") if r["targets"] else [],
                 "workloads": sorted((r["workloads"] or "").split(",")) if r["workloads"] else [],
                 "reps": r["reps"], "failed": r["failed"]} for r in rows]

    def resolve(self, run_id: str) -> str:
        """A run id, or a unique prefix of one, or 'last'."""
        if run_id == "last":
            row = self.db.execute("SELECT id FROM runs ORDER BY created DESC LIMIT 1").fetchone()
            if row is None:
                raise VmtaxError(f"no runs stored in {self.path}")
            return row["id"]
        rows = self.db.execute("SELECT id FROM runs WHERE id LIKE ? || '%'", (run_id,)).fetchall()
        if len(rows) == 1:
            return rows[0]["id"]
        if not rows:
            raise VmtaxError(f"unknown run id {run_id!r} in {self.path}; `vmtax runs` lists them")
        raise VmtaxError(f"run id {run_id!r} is ambiguous ({len(rows)} runs match); "
                         "give more of it")

    def load_run(self, run_id: str, *, with_output: bool = False) -> Run:
        run_id = self.resolve(run_id)
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
