"""The results database's schema: the newest one (SCHEMA), created in a new database, and
the MIGRATIONS that bring an older one to it, one transaction per step, versioned by
SQLite's `PRAGMA user_version`."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Callable

from vmtax.core.errors import VmtaxError

# Changes of a series that someone accepted (`vmtax trend NAME --accept RUN`).
_ACCEPTED = """CREATE TABLE accepted (
        name TEXT NOT NULL,              -- the series: the runs of this name,
        host TEXT NOT NULL,              -- on this host,
        run_id TEXT NOT NULL REFERENCES runs(id),   -- are accepted as they are from this run on
        who TEXT NOT NULL,
        at REAL NOT NULL
    )"""

# A run's repetitions by phase and status, with their workload: what listing runs counts
# and names (`vmtax runs`, `compare`) and a series' workloads (`trend`), read from the index
# alone. The repetitions' rows hold their output, most of a store's bytes, which reading
# them for these took (a store of 400 runs: 24 ms for the list, 7 from the index).
_REPS_BY_RUN = "CREATE INDEX reps_run_phase ON reps(run_id, phase, status, workload)"

# Each metric of each target × workload configuration of a run (a point of a series), with
# the values of its successful measured repetitions: what `trend` reads, one row a run and
# metric, not one a repetition. Kept by add_point_value with every repetition stored.
_POINTS = """CREATE TABLE points (
        run_id TEXT NOT NULL REFERENCES runs(id),
        target TEXT NOT NULL,
        workload TEXT NOT NULL,
        params TEXT NOT NULL,            -- JSON, as the repetitions' params
        metric TEXT NOT NULL,
        unit TEXT NOT NULL,
        higher_is_better INTEGER NOT NULL,
        dimensions TEXT NOT NULL,        -- JSON, as the metrics' dimensions
        first_rep INTEGER NOT NULL REFERENCES reps(id),   -- points in the order stored
        vals TEXT NOT NULL               -- the values in the order stored, each Python's
    )"""                                 # repr of the float (exact), comma-separated
_POINTS_BY_RUN = "CREATE INDEX points_run ON points(run_id)"
_POINT_KEY = ("run_id = ? AND target = ? AND workload = ? AND params = ? AND metric = ?"
              " AND unit = ? AND higher_is_better = ? AND dimensions = ?")


# A point's identity: (run_id, target, workload, params, metric, unit, higher_is_better,
# dimensions), params and dimensions as JSON.
PointKey = tuple[str, str, str, str, str, str, int, str]


def add_point_value(db: sqlite3.Connection, rep_id: int, key: PointKey,
                    value: float) -> None:
    """Add a successful measured repetition's value of one metric to its point; key:
    (run_id, target, workload, params, metric, unit, higher_is_better, dimensions)."""
    row = db.execute(f"SELECT rowid FROM points WHERE {_POINT_KEY}", key).fetchone()
    if row is None:
        db.execute("INSERT INTO points VALUES (?,?,?,?,?,?,?,?,?,?)",
                   (*key, rep_id, repr(float(value))))
    else:
        db.execute("UPDATE points SET vals = vals || ',' || ? WHERE rowid = ?",
                   (repr(float(value)), row[0]))


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
    _REPS_BY_RUN,
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
    _ACCEPTED,
    _POINTS,
    _POINTS_BY_RUN,
)


def _v1_dimensions_and_bare_host(db: sqlite3.Connection) -> None:
    """Metrics gain dimensions; fingerprints say whether the target is the bare host, so
    that analysis need not know which target kinds are. A stored kind is the bare host if
    its plugin declares it (Target.bare_host); a kind no longer registered is not."""
    from vmtax.core import target as target_kinds   # the registry: only an old database needs it

    kinds = target_kinds.kinds()
    db.execute("ALTER TABLE metrics ADD COLUMN dimensions TEXT NOT NULL DEFAULT '{}'")
    targets = db.execute("SELECT run_id, name, kind, fingerprint FROM targets").fetchall()
    db.executemany("UPDATE targets SET fingerprint = ? WHERE run_id = ? AND name = ?",
                   [(json.dumps({**json.loads(fingerprint),
                                 "bare_host": kind in kinds and kinds[kind].bare_host}),
                     run_id, name) for run_id, name, kind, fingerprint in targets])


def _v2_accepted(db: sqlite3.Connection) -> None:
    """Series (runs of one name) gain accepted changes: `vmtax trend NAME --accept RUN`."""
    db.execute(_ACCEPTED)


def _v3_reps_by_run_and_phase_and_points(db: sqlite3.Connection) -> None:
    """Repetitions indexed by run, phase, status and workload (_REPS_BY_RUN), which
    serves every use of the index by run alone it replaces; the points of every run
    (_POINTS), from its repetitions in the order stored."""
    db.execute(_REPS_BY_RUN)
    db.execute("DROP INDEX reps_run")
    db.execute(_POINTS)
    db.execute(_POINTS_BY_RUN)
    points: dict[PointKey, tuple[int, list[str]]] = {}
    for rep_id, *key, value in db.execute(
            "SELECT p.id, p.run_id, p.target, p.workload, p.params, m.name, m.unit,"
            " m.higher_is_better, m.dimensions, m.value FROM reps p"
            " JOIN metrics m ON m.rep_id = p.id WHERE p.phase = 'measure' AND p.status = 'ok'"
            " ORDER BY p.id, m.rowid"):
        points.setdefault(tuple(key), (rep_id, []))[1].append(repr(float(value)))
    db.executemany("INSERT INTO points VALUES (?,?,?,?,?,?,?,?,?,?)",
                   [(*key, first, ",".join(vals)) for key, (first, vals) in points.items()])


# MIGRATIONS[n] brings a database from version n to n + 1. Version 0 is the schema of
# vmtax before versioning (tests/fixtures/store/v0.sqlite). Append steps, never edit
# one: databases in the wild have run them.
MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (
    _v1_dimensions_and_bare_host,
    _v2_accepted,
    _v3_reps_by_run_and_phase_and_points,
)
LATEST = len(MIGRATIONS)


def schema_version(db: sqlite3.Connection, path: Path) -> int | None:
    """The database's schema version; None for a new database, which has no tables yet."""
    version: int = db.execute("PRAGMA user_version").fetchone()[0]
    if version > LATEST:
        raise VmtaxError(f"{path} has schema version {version}, but this vmtax understands "
                         f"versions up to {LATEST}; upgrade vmtax")
    if version == 0 and not db.execute("SELECT 1 FROM sqlite_master").fetchone():
        return None
    return version


def bring_up_to_date(db: sqlite3.Connection, path: Path) -> None:
    """Create the newest schema in a new database, or migrate an older one, committing each
    step with its new version. BEGIN IMMEDIATE takes the write lock before the version is
    read, so two vmtax opening one old database at once do not both run a step."""
    while True:
        db.execute("BEGIN IMMEDIATE")
        try:
            version = schema_version(db, path)
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
