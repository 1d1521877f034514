"""A fleet: the same plan on many hosts through Ray, one benchmark per host at a time.

Each benchmark host is a Ray node (`vmtax fleet join`) that advertises one unit of the
custom resource `vmtax-host:NAME` and no CPUs, so nothing but vmtax's own tasks, which
ask for that unit, is scheduled there, and never two at once. The head (`vmtax fleet
start`) has neither, so it never runs a workload. A host's task runs vmtax's own Runner on
that host, against the host's local store (VMTAX_RESULTS of its `fleet join`), and streams
every event of it (run, target, repetition) to the driver, the `vmtax run --fleet` process,
which writes each repetition to its own store (the head's) the moment it arrives.

--spread hosts: the whole plan on every chosen host, one head run per host (its
fingerprint, with "fleet": {"host": NAME, "id": FLEET_ID}, is the run's host; the id links
the runs of one invocation). --spread cells: one head
run; each cell (one workload configuration, all targets) goes to whichever chosen host is
free, and the hosts must be identical. A host that leaves mid-plan: its cell is re-queued
on another host, skipping what was stored (cells), or its run is marked failed with the
reason (hosts); `vmtax run --resume RUN --fleet HEAD` finishes what is missing. Which host
ran each repetition, and why a host's part failed, is kept beside the results database
in fleet.sqlite.

Ray's plumbing (command lines, the cluster's key-value entries, its nodes) is in
vmtax.studies.fleet_ray; the spread of ratios across hosts in vmtax.analysis.spread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import sqlite3
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, Sequence

from vmtax import __version__
from vmtax.analysis import summary as analysis
from vmtax.core import hints
from vmtax.results.store import Rep, Run, Store
from vmtax.studies.fleet_ray import (RESOURCE, FleetError, Host, connected, hosts, identity,
                                     kv_del, kv_put, node_hosts)
from vmtax.studies.plan import Plan
from vmtax.studies.repetitions import RepKey, params_key, rep_key
from vmtax.studies.runner import QuietReporter, Reporter, Runner, schedule
from vmtax.studies.session import guarded_journal

SPREADS = ("hosts", "cells")
# How often the driver checks that the hosts it waits on are still there.
_POLL = 2.0


# What a host's task sends the driver: ("run" | "target" | "rep" | "warn" | "end" | "error",
# its data).
Event = tuple[str, Any]


# -- on a host -------------------------------------------------------------------------------
class _BusyReporter(QuietReporter):
    """What the host is doing, for `vmtax fleet status`; warnings go to the driver."""

    def __init__(self, name: str, label: str, events: queue.Queue[Event]):
        self.name, self.label, self.events = name, label, events
        self.since = time.time()

    def step(self, text: str) -> None:
        kv_put(f"busy:{self.name}", {"cell": self.label, "step": text, "since": self.since})

    def warn(self, text: str) -> None:
        self.events.put(("warn", text))


def host_task(plan: dict[str, Any], skip: list[Sequence[Any]], label: str,
              name: str) -> Iterator[Event]:
    """The Ray task on a host: vmtax's Runner on the plan, as a local `vmtax run` would
    (journal, guardian), yielding its events as they happen; the last is ("end", ...) or
    ("error", why). The Runner has a thread of its own: only the task's thread may yield."""
    events: queue.Queue[Event] = queue.Queue()

    def work() -> None:
        try:
            store = Store(os.environ.get("VMTAX_RESULTS", "results"))
            try:
                with guarded_journal(lambda line: events.put(("warn", f"recovered: {line}"))
                                     ) as own:
                    runner = Runner(Plan.from_dict(plan), store,
                                    _BusyReporter(name, label, events), journal=own,
                                    events=lambda kind, record: events.put((kind, record)),
                                    skip={tuple(k) for k in skip})
                    run_id = runner.execute()
            finally:
                store.close()    # Ray reuses the worker process for later tasks
            events.put(("end", {"local_run": run_id}))
        except BaseException as exc:   # the driver decides; the task itself ends cleanly
            events.put(("error", str(exc) or type(exc).__name__))

    worker = threading.Thread(target=work, name="vmtax-runner", daemon=True)
    worker.start()
    try:
        while True:
            event = events.get()
            yield event
            if event[0] in ("end", "error"):
                break
        worker.join()
    finally:
        with contextlib.suppress(Exception):
            kv_del(f"busy:{name}")


# -- the driver ------------------------------------------------------------------------------
class FleetLog:
    """fleet.sqlite beside the results database: which host ran each repetition of a
    fleet run, and each host's outcome (why it failed)."""

    def __init__(self, results_dir: Path):
        self.db = sqlite3.connect(results_dir / "fleet.sqlite", timeout=30)
        with self.db:
            # A repetition by its identity in the run (vmtax.studies.runner's skip key): the store
            # may keep it in a side file first, without an id.
            self.db.execute("CREATE TABLE IF NOT EXISTS rep_hosts (run_id TEXT NOT NULL,"
                            " rep TEXT NOT NULL, host TEXT NOT NULL, local_run TEXT,"
                            " PRIMARY KEY (run_id, rep))")
            self.db.execute("CREATE TABLE IF NOT EXISTS host_parts (run_id TEXT NOT NULL,"
                            " host TEXT NOT NULL, cell TEXT NOT NULL, status TEXT NOT NULL,"
                            " reason TEXT, at REAL NOT NULL)")

    def rep(self, run_id: str, key: RepKey, host_name: str, local_run: str | None) -> None:
        with self.db:
            self.db.execute("INSERT INTO rep_hosts VALUES (?,?,?,?)",
                            (run_id, json.dumps(key), host_name, local_run))

    def part(self, run_id: str, host_name: str, cell: str, status: str,
             reason: str | None) -> None:
        with self.db:
            self.db.execute("INSERT INTO host_parts VALUES (?,?,?,?,?,?)",
                            (run_id, host_name, cell, status, reason, time.time()))

    def rep_hosts(self, run_id: str) -> dict[RepKey, str]:
        """The host of each repetition of run_id, by its identity (`rep_key`)."""
        return {tuple(json.loads(k)): h for k, h in self.db.execute(
            "SELECT rep, host FROM rep_hosts WHERE run_id = ?", (run_id,))}

    def parts(self, run_id: str) -> list[tuple[str, str, str, str | None]]:
        return list(self.db.execute("SELECT host, cell, status, reason FROM host_parts WHERE"
                                    " run_id = ? ORDER BY at", (run_id,)))


@dataclass
class _HeadRun:
    """One run in the head's store: a host's (--spread hosts) or the fleet's (cells)."""
    plan: dict[str, Any]
    fleet: dict[str, Any]
    id: str | None = None
    keys: set[RepKey] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)


@dataclass
class _Job:
    plan: dict[str, Any]
    label: str
    head: _HeadRun
    host: str | None       # pinned (--spread hosts), or any free host (cells)
    local_run: str | None = None


def _complete(plan: Plan, keys: set[RepKey]) -> bool:
    """Whether every warm-up and measured repetition of the plan is stored."""
    return all((u.target, w.name, params_key(w.make(plan.time).params), u.phase, u.idx)
               in keys for w in plan.workloads for u in schedule(plan))


def _cells(plan: Plan) -> list[tuple[str, dict[str, Any]]]:
    whole = plan.to_dict()
    return [(f"{w.name} {json.dumps(w.params, sort_keys=True)}" if w.params else w.name,
             {**whole, "workloads": [{"name": w.name, "params": w.params}]})
            for w in plan.workloads]


def _choose(ray: ModuleType, names: list[str] | None, spread: str) -> dict[str, Host]:
    known = {h.name: h for h in hosts(ray)}
    alive = {n: h for n, h in known.items() if h.alive}
    if not alive:
        raise FleetError("no host has joined the fleet; on each benchmark host run "
                         "`vmtax fleet join HEAD --name NAME`")
    if names is None or names == ["all"]:
        chosen = alive
    else:
        missing = [n for n in names if n not in alive]
        if missing:
            raise FleetError(f"--hosts: no live host named {', '.join(missing)} in the fleet;"
                             f" it has: {', '.join(sorted(alive))}")
        chosen = {n: alive[n] for n in names}
    if spread == "cells":
        first_name, first = next(iter(chosen.items()))
        for name, h in chosen.items():
            diff = sorted(k for k in set(identity(first.fingerprint)) | set(
                identity(h.fingerprint)) if first.fingerprint.get(k) != h.fingerprint.get(k))
            if diff:
                raise FleetError(f"--spread cells needs identical hosts, but {name} and "
                                 f"{first_name} differ in {', '.join(diff)}; use --spread "
                                 "hosts, or --hosts to pick identical ones")
    return chosen


# Each task running: Ray's generator of its events (Ray has no type hints) -> its job and
# host.
_Active = dict[Any, tuple[_Job, str]]


class _Driver:
    def __init__(self, ray: ModuleType, store: Store, log: FleetLog, reporter: Reporter):
        self.ray, self.store, self.log, self.reporter = ray, store, log, reporter
        # No retries: a host that left is handled here (re-queue or fail), never twice.
        self.task = ray.remote(num_cpus=0, max_retries=0, num_returns="streaming")(host_task)

    def _head_event(self, job: _Job, host_name: str, kind: str, data: Any) -> None:
        head = job.head
        if kind == "run":
            job.local_run = data["local_run"]
            if head.id is None:
                fingerprint = {**data["fingerprint"], "fleet": head.fleet}
                head.id = self.store.new_run(head.plan, fingerprint, __version__)
        elif kind == "target" and head.id is not None:
            self.store.set_target(head.id, data["name"], data["kind"], data["fingerprint"])
        elif kind == "rep" and head.id is not None:
            key = rep_key(data)
            if key in head.keys:      # re-sent after a re-queue: never stored twice
                return
            self.store.add_rep(head.id, **data)
            head.keys.add(key)
            self.log.rep(head.id, key, host_name, job.local_run)
            if data["phase"] in ("warmup", "measure"):
                self.reporter.advance()
        elif kind == "warn":
            self.reporter.warn(f"{host_name}: {data}")

    def run(self, jobs: list[_Job], pool: set[str], spread: str) -> None:
        waiting = deque(jobs)
        free = set(pool)
        active: _Active = {}
        checked = time.monotonic()
        try:
            while waiting or active:
                self._dispatch(waiting, free, active)
                if not active:
                    for job in waiting:
                        self._failed(job, job.host or "fleet", "no host left to run it")
                    return
                ready, _ = self.ray.wait(list(active), num_returns=1, timeout=_POLL)
                for gen in ready:
                    self._next(gen, active, free, waiting, pool, spread)
                if time.monotonic() - checked >= _POLL:
                    self._check_alive(active, free, waiting, pool, spread)
                    checked = time.monotonic()
        except BaseException:
            for gen in active:
                with contextlib.suppress(Exception):
                    self.ray.cancel(gen, force=True)
            raise

    def _dispatch(self, waiting: deque[_Job], free: set[str], active: _Active) -> None:
        for job in list(waiting):
            host_name = job.host if job.host in free else (
                sorted(free)[0] if job.host is None and free else None)
            if host_name is None:
                continue
            waiting.remove(job)
            free.discard(host_name)
            self.reporter.step(f"{host_name} · {job.label}")
            gen = self.task.options(resources={RESOURCE + host_name: 1}).remote(
                job.plan, sorted(job.head.keys), job.label, host_name)
            active[gen] = (job, host_name)

    def _next(self, gen: Any, active: _Active, free: set[str], waiting: deque[_Job],
              pool: set[str], spread: str) -> None:
        job, host_name = active[gen]
        try:
            kind, data = self.ray.get(next(gen))
        except StopIteration:
            active.pop(gen)
            free.add(host_name)
            return
        except self.ray.exceptions.RayTaskError as exc:   # the task broke, not the host
            active.pop(gen)
            free.add(host_name)
            self._failed(job, host_name, str(exc).splitlines()[-1][:300])
            return
        except self.ray.exceptions.RayError as exc:
            active.pop(gen)
            # Ray's first sentence says what happened; the rest is how to debug Ray.
            first = str(exc).split(". ")[0].splitlines()[0]
            self._lost(job, host_name, f"{type(exc).__name__}: {first}",
                       waiting, pool, spread)
            return
        if kind == "end":
            self.log.part(job.head.id or "", host_name, job.label, "done", None)
        elif kind == "error":
            self._failed(job, host_name, data)
        else:
            self._head_event(job, host_name, kind, data)

    def _check_alive(self, active: _Active, free: set[str], waiting: deque[_Job],
                     pool: set[str], spread: str) -> None:
        alive = {n for n, flags in node_hosts(self.ray).items() if any(flags)}
        for name in sorted(pool - alive):
            pool.discard(name)
            free.discard(name)
            for gen, (job, host_name) in list(active.items()):
                if host_name == name:
                    active.pop(gen)
                    with contextlib.suppress(Exception):
                        self.ray.cancel(gen, force=True)
                    self._lost(job, name, "its Ray node is gone", waiting, pool, spread)

    def _lost(self, job: _Job, host_name: str, why: str, waiting: deque[_Job],
              pool: set[str], spread: str) -> None:
        """The host left mid-job: re-queue the cell elsewhere (cells), or fail the host's
        run with the reason (hosts)."""
        pool.discard(host_name)
        with contextlib.suppress(Exception):
            kv_del(f"busy:{host_name}")
        reason = f"host {host_name} left the fleet mid-plan ({why})"
        if spread == "cells" and pool:
            self.reporter.warn(f"{reason}; {job.label} re-queued on another host")
            self.log.part(job.head.id or "", host_name, job.label, "requeued", reason)
            waiting.appendleft(_Job(job.plan, job.label, job.head, None))
        else:
            self._failed(job, host_name, reason)

    def _failed(self, job: _Job, host_name: str, why: str) -> None:
        self.reporter.warn(f"{host_name} · {job.label}: {why}")
        job.head.failures.append(f"{host_name} · {job.label}: {why}")
        self.log.part(job.head.id or "", host_name, job.label, "failed", why)

    def finish(self, heads: list[_HeadRun], status: str) -> None:
        for head in heads:
            if head.id is None:
                continue
            self.store.finish_run(head.id, "failed" if head.failures and status == "done"
                                  else status)
            summary = analysis.summarize_run(self.store.load_run(head.id))
            self.store.set_flags(head.id, [
                (target, row.workload, row.params, row.key, flag)
                for row in summary.rows for target, cell in row.cells.items()
                for flag in cell.flags])


@dataclass
class Outcome:
    runs: list[tuple[str, str]]      # (head run id, whose: "host a" or "cells on a, b")
    failures: list[str]              # why parts of the plan did not run


def run(plan: Plan, store: Store, address: str, names: list[str] | None, spread: str | None,
        reporter: Reporter | None = None, resume: str | None = None) -> Outcome:
    """Run plan on the fleet at address (`vmtax run PLAN --fleet HEAD`), each repetition
    stored in store as it finishes; or, with resume, finish the stored fleet run."""
    reporter = reporter or QuietReporter()
    log = FleetLog(store.dir)
    prior = store.load_run(resume) if resume else None
    fleet_info = (prior.host.get("fleet") or {}) if prior else {}
    if prior and not fleet_info:
        raise FleetError(f"run {prior.id} was not run on a fleet; resume it without --fleet")
    spread = spread or fleet_info.get("spread") or "hosts"
    if spread not in SPREADS:
        raise FleetError(f"--spread: expected hosts or cells, got {spread!r}")
    if prior and fleet_info.get("spread") != spread:
        raise FleetError(f"run {prior.id} was run with --spread {fleet_info.get('spread')}")
    if prior and spread == "hosts":
        names = [fleet_info["host"]]
    with connected(address) as ray:
        chosen = _choose(ray, names, spread)
        whole = plan.to_dict()
        # Links the runs of this invocation (one per host with --spread hosts).
        fleet_id = uuid.uuid4().hex[:12]
        if spread == "hosts" and prior is None:
            heads = [_HeadRun(whole, {"spread": spread, "host": n, "id": fleet_id})
                     for n in chosen]
            jobs = [_Job(whole, "whole plan", head, n) for head, n in zip(heads, chosen)]
        else:
            heads = [_HeadRun(whole, fleet_info or {"spread": spread, "hosts": sorted(chosen),
                                                    "id": fleet_id})]
            cells = [("whole plan", whole)] if spread == "hosts" else _cells(plan)
            jobs = [_Job(p, label, heads[0], names[0] if spread == "hosts" and names else None)
                    for label, p in cells]
        if prior is not None:
            store.claim_run(prior.id)
            store.reopen_run(prior.id)
            heads[0].id = prior.id
            heads[0].keys = {rep_key(vars(r)) for r in prior.reps}
            jobs = [j for j in jobs if not _complete(Plan.from_dict(j.plan), heads[0].keys)]
        reporter.start(sum(len(schedule(Plan.from_dict(j.plan))) * len(j.plan["workloads"])
                           for j in jobs))
        driver = _Driver(ray, store, log, reporter)
        status = "failed"
        try:
            driver.run(jobs, set(chosen), spread)
            status = "done"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            driver.finish(heads, status)
    return Outcome([(h.id, f"host {h.fleet['host']}" if "host" in h.fleet
                     else f"cells on {', '.join(h.fleet['hosts'])}") for h in heads if h.id],
                   [f for h in heads for f in h.failures])


# -- results across hosts ----------------------------------------------------------------------
def host_runs(store: Store, run: Run) -> dict[str, Run]:
    """The fleet run set run belongs to, per host: with --spread hosts the runs of the same
    `vmtax run --fleet` invocation (its fleet id), with --spread cells run itself split by
    the host that ran each repetition (fleet.sqlite)."""
    info = run.host.get("fleet")
    if not info:
        raise FleetError(f"run {run.id} was not run on a fleet; "
                         f"`{hints.command('show', run.id, results=store.dir)}` shows it")
    if "host" in info:
        ids = [r[0] for r in store.db.execute(
            "SELECT id FROM runs WHERE json_extract(host, '$.fleet.id') = ? ORDER BY created",
            (info["id"],))] if info.get("id") else [run.id]
        found = [run if i == run.id else store.load_run(i) for i in ids]
        return {r.host["fleet"]["host"]: r for r in sorted(found,
                                                            key=lambda r: r.host["fleet"]["host"])}
    log_path = store.dir / "fleet.sqlite"
    ran_on = FleetLog(store.dir).rep_hosts(run.id) if log_path.exists() else {}
    split: dict[str, list[Rep]] = {}
    for rep in run.reps:
        split.setdefault(ran_on.get(rep_key(vars(rep)), "unknown"), []).append(rep)
    return {name: dataclasses.replace(run, reps=reps) for name, reps in sorted(split.items())}


def host_run(store: Store, run: Run, name: str) -> Run:
    """Host name's run in run's fleet run set (`vmtax compare RUN@HOST ...`)."""
    found = host_runs(store, run)
    if name not in found:
        raise FleetError(f"host {name!r} has no results in the fleet run of {run.id}; it has: "
                         + ", ".join(found))
    return found[name]
