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

This module is the store's API (runs, their lifecycle, and resolving a run spec); the
schema and its migrations are in vmtax.results.schema, opening and guarding the database
in vmtax.results.connection, the side file in vmtax.results.pending and the masking of
secrets in vmtax.results.masking.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Iterable, Iterator

from vmtax.core import hints, paths
from vmtax.core.errors import VmtaxError
from vmtax.core.types import Metric
from vmtax.host.proc import process_start_time, running
from vmtax.results.connection import StoreError as StoreError  # the store's API
from vmtax.results.connection import connect, guarded, problem, roll_back
from vmtax.results.masking import masker
from vmtax.results.names import RUN_NAME
from vmtax.results.names import check_run_name as check_run_name  # the store's API
from vmtax.results.pending import ELSEWHERE as ELSEWHERE
from vmtax.results.pending import PENDING_NAME as PENDING_NAME
from vmtax.results.pending import REP_COLUMNS, PendingSideFile
from vmtax.results.run_progress import RunProgress
from vmtax.results.schema import LATEST as LATEST
from vmtax.results.schema import PointKey, bring_up_to_date, schema_version

DB_NAME = "vmtax.sqlite"

# NAME~N or last~N: the Nth run before (run names and ids hold no '~').
_BACK = re.compile(r"(.+)~(\d{1,9})")

# A report recorded elsewhere and imported (`vmtax exits import`) is stored as a run whose
# plan keeps the file it came from under this key, with one target named by its label.
IMPORTED = "imported"


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


class Store(PendingSideFile, RunProgress):
    """The results database of one directory.

    Writers (the default) create the directory and database if needed. readonly=True is
    for commands that only read: it creates nothing, refuses a missing database and opens
    it read-only. Its one write: a database from an older vmtax is first migrated, through
    a brief read-write connection, as every later reader would need it to be.
    """

    def __init__(self, results_dir: str | os.PathLike[str], *, readonly: bool = False):
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
            raise StoreError(problem(self.path, exc)) from None
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
            raise StoreError(problem(self.path, PermissionError(
                "the file cannot be read and written; an immutable attribute, or its mode")))
        db = connect(self.path)
        try:
            bring_up_to_date(db, self.path)
        except BaseException:
            db.close()
            raise
        return db

    def _open_readonly(self) -> sqlite3.Connection:
        missing = VmtaxError(f"no results database at {self.path}; run `vmtax run` first "
                             "(or give --results DIR / VMTAX_RESULTS)")
        if not self.path.is_file():
            raise missing
        # A kill -9 at a commit leaves a hot journal, which only a connection that may
        # write rolls back: without that, every read would fail.
        roll_back(self.path)
        uri = self.path.resolve().as_uri() + "?mode=ro"
        db = connect(self.path, uri)
        try:
            version = schema_version(db, self.path)
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
            bring_up_to_date(db, self.path)
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
    @guarded
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
        hide = masker(secrets)
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

    @guarded
    def import_runs(self, other_dir: str | os.PathLike[str], only: str | None = None) -> list[str]:
        """Copy in the runs of another results directory (a lab's, made in a guest; only
        the run `only`, when given), as ordinary runs: their targets, repetitions, metrics
        and flags. A run held here unfinished (a lab's, resumed in another) gets what it
        lacks. The ids of the runs that changed, oldest first. A run the other vmtax never
        finished is interrupted."""
        other = connect(Path(other_dir) / DB_NAME)
        other.row_factory = sqlite3.Row
        try:
            bring_up_to_date(other, Path(other_dir) / DB_NAME)
            changed = []
            with self.db:
                for run in other.execute("SELECT * FROM runs ORDER BY created"):
                    if only in (None, run["id"]) and self._copy_run(other, run):
                        changed.append(run["id"])
        finally:
            other.close()
        return changed

    def _copy_run(self, other: sqlite3.Connection, run: sqlite3.Row) -> bool:
        """Copy run in, or what this store's unfinished copy of it lacks: whether it did."""
        run_id = run["id"]
        status = "interrupted" if run["status"] == "running" else run["status"]
        here = self.db.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
        if here is not None and here["status"] == "done":
            return False
        have = {(r["target"], r["workload"], r["params"], r["phase"], r["idx"])
                for r in self.db.execute("SELECT * FROM reps WHERE run_id = ?", (run_id,))}
        reps = [r for r in other.execute("SELECT * FROM reps WHERE run_id = ? ORDER BY id",
                                         (run_id,))
                if (r["target"], r["workload"], r["params"], r["phase"], r["idx"]) not in have]
        if here is not None and not reps and here["status"] == status:
            return False
        self.db.execute("DELETE FROM runs WHERE id = ? AND status != 'done'", (run_id,))
        self.db.execute("INSERT INTO runs VALUES (?,?,?,?,?,?,?,NULL,NULL)",
                        (run_id, run["created"], run["finished"], status, run["plan"],
                         run["host"], run["version"]))
        for table, width in (("targets", 4), ("flags", 6)):   # as the other has them now
            self.db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            self.db.executemany(f"INSERT INTO {table} VALUES ({','.join('?' * width)})", [
                tuple(row) for row in other.execute(f"SELECT * FROM {table} WHERE run_id = ?",
                                                    (run_id,))])
        for rep in reps:
            metrics = other.execute("SELECT name, value, unit, higher_is_better, dimensions"
                                    " FROM metrics WHERE rep_id = ?", (rep["id"],))
            self._insert_rep({**{c: rep[c] for c in REP_COLUMNS},
                              "metrics": [tuple(m) for m in metrics]})
        return True

    @guarded
    def set_flags(self, run_id: str,
                  flags: Iterable[tuple[str, str, dict[str, Any], str, str]]) -> None:
        """Replace the run's stored sanity flags: (target, workload, params, metric, flag)."""
        if self.diverted is not None:
            raise self._aside_error(run_id)
        with self.db:
            self.db.execute("DELETE FROM flags WHERE run_id = ?", (run_id,))
            self.db.executemany("INSERT INTO flags VALUES (?,?,?,?,?,?)",
                                [(run_id, t, w, json.dumps(p, sort_keys=True), m, f)
                                 for t, w, p, m, f in flags])

    @guarded
    def set_host_quiet(self, run_id: str, before: dict[str, Any], after: dict[str, Any]) -> None:
        """Keep how quiet the host was before and after the run (vmtax.host.quiet
        snapshots) with its host facts: host.quiet.before / .after."""
        with self.db:
            self.db.execute("UPDATE runs SET host = json_set(host, '$.quiet', json(?))"
                            " WHERE id = ?", (json.dumps({"before": before, "after": after}),
                                              run_id))

    @guarded
    def flags(self, run_id: str) -> list[tuple[str, str, dict[str, Any], str, str]]:
        return [(r["target"], r["workload"], json.loads(r["params"]), r["metric"], r["flag"])
                for r in self.db.execute("SELECT * FROM flags WHERE run_id = ?", (run_id,))]

    @guarded
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

    @guarded
    def reopen_run(self, run_id: str) -> None:
        """A resumed run (claimed by this process) is running again."""
        with self.db:
            self.db.execute("UPDATE runs SET status='running' WHERE id=?", (run_id,))

    # -- reading ---------------------------------------------------------------------------
    @guarded
    def list_runs(self, *, imported: bool = True) -> list[dict[str, Any]]:
        """The stored runs, oldest first; without imported reports unless imported."""
        recorded = "" if imported else f" WHERE json_extract(r.plan, '$.{IMPORTED}') IS NULL"
        rows = self.db.execute(
            "SELECT r.id, r.created, r.finished, r.status,"
            # Names as JSON arrays: a target's name may hold a comma ("a,b" in a plan).
            " (SELECT json_group_array(name) FROM targets t WHERE t.run_id = r.id) AS targets,"
            " (SELECT json_group_array(workload) FROM (SELECT DISTINCT workload FROM reps p"
            "  WHERE p.run_id = r.id)) AS workloads,"
            " (SELECT count(*) FROM reps p WHERE p.run_id = r.id AND p.phase = 'measure') AS reps,"
            " (SELECT count(*) FROM reps p WHERE p.run_id = r.id AND p.phase = 'measure'"
            "  AND p.status != 'ok') AS failed"
            f" FROM runs r{recorded} ORDER BY r.created").fetchall()
        return [{"id": r["id"], "created": r["created"], "finished": r["finished"],
                 "status": self._status(r),
                 "targets": json.loads(r["targets"]),
                 "workloads": sorted(json.loads(r["workloads"])),
                 "reps": r["reps"], "failed": r["failed"]} for r in rows]

    @guarded
    def run_names(self) -> dict[str, str]:
        """Run id -> the name it was given (`vmtax run --name`), for runs that have one."""
        return {row[0]: row[1] for row in self.db.execute(
            "SELECT id, json_extract(plan, '$.name') FROM runs"
            " WHERE json_extract(plan, '$.name') IS NOT NULL")}

    @guarded
    def resolve(self, spec: str, *, last_may_be_imported: bool = False) -> str:
        """The id of the run spec names, read in this order:
        - 'last': the latest run recorded here; an imported report only with
          last_may_be_imported (for `vmtax exits`, whose runs they are);
        - a run id;
        - a run's name or an imported report's label: the latest run that has it (of two
          imports of one label, or a run and an import of one name, the later);
        - a unique prefix of a run id;
        - NAME~N or last~N: the Nth run before the one NAME or 'last' names, of that name
          (nightly~1: the run of nightly before its latest; last~1: the run before the
          latest).
        A name that is also a prefix of a run id is refused as ambiguous."""
        back = _BACK.fullmatch(spec)
        if back:
            return self._before(back.group(1), int(back.group(2)), last_may_be_imported)
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
            return str(named["id"])
        if len(prefixed) == 1:
            return str(prefixed[0])
        if not prefixed:
            raise VmtaxError(f"unknown run id {spec!r} in {self.path}: no run's id, name or "
                             "imported report's label matches it; "
                             f"`{hints.command('runs', results=self.dir)}` lists them")
        raise VmtaxError(f"run id {spec!r} is ambiguous ({len(prefixed)} runs match); "
                         "give more of it")

    def _before(self, spec: str, steps: int, imported: bool) -> str:
        """The run `steps` before the latest one of spec ('last' or a run's name)."""
        if spec == "last":
            where = "" if imported else f" WHERE json_extract(plan, '$.{IMPORTED}') IS NULL"
            args: tuple[str, ...] = ()
        elif RUN_NAME.fullmatch(spec):
            where, args = " WHERE json_extract(plan, '$.name') = ?", (spec,)
        else:
            raise VmtaxError(f"{spec}~{steps}: ~N follows a run's name or 'last' "
                             "(nightly~1: the run of nightly before its latest)")
        rows = self.db.execute(f"SELECT id FROM runs{where} ORDER BY created DESC LIMIT 1"
                               " OFFSET ?", (*args, steps)).fetchall()
        if rows:
            return str(rows[0]["id"])
        count = self.db.execute(f"SELECT count(*) FROM runs{where}", args).fetchone()[0]
        raise VmtaxError(f"{spec}~{steps}: {spec!r} names {count} run"
                         f"{'s' * (count != 1)} in {self.path}; ~N goes back at most "
                         f"{max(count - 1, 0)}")

    def _last(self, imported: bool) -> str:
        recorded = "" if imported else f" WHERE json_extract(plan, '$.{IMPORTED}') IS NULL"
        row = self.db.execute(f"SELECT id FROM runs{recorded} ORDER BY created DESC"
                              " LIMIT 1").fetchone()
        if row is not None:
            return str(row["id"])
        if self.db.execute("SELECT 1 FROM runs").fetchone():
            raise VmtaxError(f"no runs recorded in {self.path}, only imported perf kvm stat "
                             "reports, which `last` leaves out: "
                             f"`{hints.command('exits', 'last', results=self.dir)}` shows them")
        raise VmtaxError(f"no runs stored in {self.path}")

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[None]:
        """The block's reads in one read transaction: they see the database as one moment
        had it, not a repetition a writer committed between two of them (its metrics
        without it, say). A writer's commit waits for the block's end (busy timeout)."""
        if self.db.in_transaction:   # a caller's transaction is one moment already
            yield
            return
        self.db.execute("BEGIN")
        try:
            yield
        finally:
            self.db.rollback()   # it wrote nothing: ends the read, releases the lock

    @guarded
    def load_run(self, spec: str, *, with_output: bool = False,
                 last_may_be_imported: bool = False) -> Run:
        """The run spec names (see resolve), as one moment of the database had it."""
        with self._snapshot():
            return self._load_run(spec, with_output, last_may_be_imported)

    def _load_run(self, spec: str, with_output: bool, last_may_be_imported: bool) -> Run:
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

    # -- series: the runs of one name (vmtax trend) ----------------------------------------
    @guarded
    def named_runs(self, name: str) -> list[dict[str, Any]]:
        """The runs of one name, oldest first, each with its targets' fingerprints; runs
        still in progress left out (their numbers are not complete)."""
        rows = self.db.execute(
            "SELECT id, created, status, plan, host, version FROM runs"
            " WHERE json_extract(plan, '$.name') = ? ORDER BY created", (name,)).fetchall()
        targets: dict[str, dict[str, Any]] = {}
        for t in self.db.execute(
                "SELECT t.run_id, t.name, t.kind, t.fingerprint FROM targets t JOIN runs r"
                " ON r.id = t.run_id WHERE json_extract(r.plan, '$.name') = ?", (name,)):
            targets.setdefault(t["run_id"], {})[t["name"]] = {
                "kind": t["kind"], "fingerprint": json.loads(t["fingerprint"])}
        return [{"id": r["id"], "created": r["created"], "status": self._status(r),
                 "plan": json.loads(r["plan"]), "host": json.loads(r["host"]),
                 "version": r["version"], "targets": targets.get(r["id"], {})}
                for r in rows if self._status(r) != "running"]

    @guarded
    def named_workloads(self, name: str) -> list[str]:
        """The workloads one name's runs measured."""
        # The runs first, then their repetitions by the index: a join reads every
        # repetition and its run's plan (14 ms against 4 at 400 runs).
        return [row[0] for row in self.db.execute(
            "SELECT DISTINCT p.workload FROM reps p WHERE p.run_id IN"
            " (SELECT id FROM runs WHERE json_extract(plan, '$.name') = ?)", (name,))]

    @guarded
    def named_values(self, name: str, metrics: Collection[str] | None = None,
                     pairs: Collection[tuple[str, str]] | None = None,
                     runs: Collection[str] | None = None) -> dict[PointKey, list[float]]:
        """The metrics (those named, or those of these (workload, metric) pairs, or all) of
        the successful measured repetitions of one name's runs (those of `runs` only, when
        given: read through the points' index by run), per point: (run_id, target,
        workload, params (JSON), metric, unit, higher_is_better, dimensions (JSON)) -> its
        values in the order they were stored; the points in the order of their first
        value. Read from the points table: one row a point, not one a repetition."""
        only = f" AND q.metric IN ({','.join('?' * len(metrics))})" if metrics is not None else ""
        if pairs is not None:
            only += (" AND (q.workload, q.metric) IN (VALUES "
                     f"{','.join(['(?,?)'] * len(pairs))})" if pairs else " AND 0")
        if runs is not None:
            only += f" AND q.run_id IN ({','.join('?' * len(runs))})"
        cursor = self.db.cursor()
        cursor.row_factory = None
        rows = cursor.execute(
            "SELECT json_array(q.run_id, q.target, q.workload, q.params, q.metric, q.unit,"
            " q.higher_is_better, q.dimensions), q.vals FROM runs r"
            " JOIN points q ON q.run_id = r.id WHERE json_extract(r.plan, '$.name') = ?"
            f"{only} ORDER BY q.first_rep, q.rowid",
            (name, *(metrics or ()), *(v for pair in pairs or () for v in pair),
             *(runs or ()))).fetchall()
        keys = json.loads(f"[{','.join(key for key, _ in rows)}]")   # one decoding
        return {tuple(key): [float(value) for value in vals.split(",")]
                for key, (_, vals) in zip(keys, rows)}

    @guarded
    def accept(self, name: str, host: str, run_id: str, who: str) -> None:
        """Record that `who` accepts the series name on host as it is from run_id on."""
        with self.db:
            self.db.execute("INSERT INTO accepted VALUES (?,?,?,?,?)",
                            (name, host, run_id, who, time.time()))

    @guarded
    def accepted(self, name: str) -> list[dict[str, Any]]:
        """The acceptances of the series name, oldest first: host, run_id, who, at, and
        created (the run's)."""
        return [dict(r) for r in self.db.execute(
            "SELECT a.host, a.run_id, a.who, a.at, r.created FROM accepted a"
            " JOIN runs r ON r.id = a.run_id WHERE a.name = ? ORDER BY a.at", (name,))]
