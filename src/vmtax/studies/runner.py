"""Runs a plan: prepares every target, runs each workload's repetitions in interleaved
order, commits every repetition the moment it finishes, and undoes every host change
on the way out (normal end, Ctrl-C, SIGTERM, or a crash recovered by the journal).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol

from vmtax.analysis import stats
from vmtax.analysis import summary as analysis
from vmtax.core import plugin
from vmtax.core.collector import Collector, HostClient, Subject
from vmtax.core.errors import TargetError, VmtaxError
from vmtax.core.target import Target
from vmtax.core.types import Endpoint, Job, JobResult, Metric
from vmtax.core.workload import Workload
from vmtax.host import packages, proc
from vmtax.host.journal import Journal
from vmtax.results.store import Store
from vmtax.studies import estimate
from vmtax.studies.plan import Plan, point_labels
from vmtax.studies.plan import packages as plan_packages
from vmtax.studies.repetitions import (Cell, Precision, RepetitionPolicy, RepKey, Unit,
                                       params_key, rep_key)
from vmtax.studies.session import Session, session


# The step text's last part for a repetition a resumed run already has: the reporter counts
# it into its cell (so a partly done cell still reports when it finishes) without running it.
STORED_BEFORE = "stored before"
# A client its server turned away before the test began is run again, this many times in
# all, each after this many seconds with the target running.
CLIENT_TRIES = 3
CLIENT_PAUSE = 0.5


class Reporter(Protocol):
    def start(self, total: int) -> None: ...
    def step(self, text: str) -> None: ...
    def advance(self) -> None: ...
    def warn(self, text: str) -> None: ...


class QuietReporter:
    def start(self, total: int) -> None: pass
    def step(self, text: str) -> None: pass
    def advance(self) -> None: pass
    def warn(self, text: str) -> None: pass


def schedule(plan: Plan) -> list[Unit]:
    """Repetition order for one workload: interleaved across targets (or blocked), the first
    `warmup` repetitions of each target being warm-ups whose results are discarded."""
    names = [t.name for t in plan.targets]
    per_target = plan.warmup + plan.runs
    order = (stats.interleave(names, per_target) if plan.interleave and len(names) > 1
             else [n for n in names for _ in range(per_target)])
    seen: Counter[str] = Counter()
    units = []
    for name in order:
        i = seen[name]
        seen[name] += 1
        units.append(Unit(name, "warmup" if i < plan.warmup else "measure", i))
    return units


# Run in a target by the plan's drop_caches: a fixed script, no user input in it.
DROP_CACHES = Job(["busybox", "sh", "-c", "sync && echo 3 > /proc/sys/vm/drop_caches"],
                  timeout=120)


def _failure(result: JobResult, job: Job) -> str:
    if result.timed_out:
        return f"timed out after {job.timeout:g} s"
    tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or ["no output"]
    return f"exit status {result.exit_code}: {tail[0][:300]}"


def _wait_listening(endpoint: Endpoint, timeout: float, poll: float = 0.05) -> None:
    """Until the server accepts a TCP connection (from where the client will run)."""
    code = ("import socket, sys, time\n"
            "end = time.monotonic() + float(sys.argv[3])\n"
            "while True:\n"
            "    try:\n"
            "        socket.create_connection((sys.argv[1], int(sys.argv[2])), 1).close(); break\n"
            "    except OSError:\n"
            "        if time.monotonic() > end: sys.exit(1)\n"
            f"        time.sleep({poll})\n")
    done = proc.run([sys.executable, "-c", code, endpoint.address, str(endpoint.port),
                     str(timeout)], timeout=timeout + 10, preexec=endpoint.client_preexec)
    if done.exit_code != 0:
        raise TargetError(f"nothing listens on {endpoint.address}:{endpoint.port} after "
                          f"{timeout:g} s")


def _primary(workload: Workload, metrics: list[Metric]) -> list[float]:
    """The primary metric's value of one repetition (its first, when it has dimensions)."""
    name = workload.primary_metric()
    return [m.value for m in metrics if m.name == name][:1]


# The Runner's event sink: each record of the run, the moment the store took it (or set it
# aside): ("run", {"local_run", "fingerprint"}), ("target", {"name", "kind", "fingerprint"})
# and ("rep", the repetition as Store.add_rep took it, without its run id).
EventSink = Callable[[str, dict[str, Any]], None]


class Runner:
    """Runs one plan into one stored run. Its extension points, for the studies built on
    it: `events` (an EventSink: the fleet streams every record to its driver), `skip`
    (repetitions stored elsewhere that this run must not repeat, by `rep_key`: the fleet's
    head has them) and `repetitions` (a RepetitionPolicy: tune races; default: the plan's
    `--runs auto` precision rule when it has max_runs), beside `resume` (go on with a run
    of this store)."""

    def __init__(self, plan: Plan, store: Store, reporter: Reporter | None = None,
                 resume: str | None = None, journal: Journal | None = None, *,
                 events: EventSink | None = None, skip: Iterable[RepKey] = (),
                 repetitions: RepetitionPolicy | None = None):
        self.plan = plan
        self.store = store
        self.reporter = reporter or QuietReporter()
        self.resume_id = resume
        self.journal = journal or Journal()
        self.events = events
        self.skip = set(skip)
        self.repetitions = repetitions or (
            Precision(plan, plan.max_runs) if plan.max_runs is not None else None)
        self.targets: dict[str, Target] = {}
        self.broken: dict[str, str] = {}   # target -> why it can no longer run jobs
        # The current cell of a client-server workload: each target's server, or why not.
        self.endpoints: dict[str, Endpoint] = {}
        # The workload configuration being run, as progress names it (plan.point_labels).
        self.point = ""
        # CPU time of each target's client on the host during the cell (collectors read it)
        self.clients: dict[str, HostClient] = {}
        self.cell_errors: dict[str, str] = {}
        self.warned_shared_cpus: set[str] = set()
        self.warned_collectors: set[str] = set()   # why one could not record, targets aside
        self.cannot_drop: set[str] = set()   # "host" and targets whose caches stay
        self.run_id: str | None = None
        # The finished run's summary, whose flags were stored (the study's analysis reuses it).
        self.summary: analysis.RunSummary | None = None

    # -- the plan --------------------------------------------------------------------------
    def execute(self) -> str:
        done = self._already_done()
        if self.resume_id:
            self.store.claim_run(self.resume_id)   # before anything runs
        # A plugin's Debian packages (what it runs, what it builds with) on its first use:
        # `make run` installs only the default plan's.
        packages.install(packages.missing(plan_packages(self.plan)), self.journal,
                         lambda line: print(f"vmtax: {line}", file=sys.stderr), "this plan")
        made = [w.make(self.plan.time) for w in self.plan.workloads]
        for workload in made:
            workload.build_on_host()
        try:
            with session(self.store, self.journal,
                         binaries=tuple(sorted({b for w in made for b in w.binaries})),
                         trees=tuple(sorted({t for w in made for t in w.trees()})),
                         serves=any(w.server_job() is not None for w in made),
                         on_stored=self.events) as s:
                self.targets, self.work_dir = s.targets, s.work_dir
                try:
                    self._prepare_and_run(s, made, done)
                finally:
                    if s.run_id:   # what changed while it ran: a hung guest booted again
                        s.store_fingerprints()
        finally:
            if self.run_id:   # once the run is finished
                self._store_flags()
        return self._stored_run

    def _prepare_and_run(self, s: Session, made: list[Workload], done: set[RepKey]) -> None:
        units = schedule(self.plan)
        self.reporter.start(len(self.plan.workloads) * len(units))
        lost: list[TargetError] = []
        for spec in self.plan.targets:
            self.reporter.step(f"preparing {spec.name}")
            target = s.create(spec)
            try:
                target.prepare()
                target.pause()
            except TargetError as exc:   # a guest not booted even after its retry (a lab's
                lost.append(exc)         # nested KVM, a busy host): its cells fail, why
                self.broken[spec.name] = f"could not be prepared: {exc}"
                with contextlib.suppress(Exception):
                    target.cleanup()
            for warning in target.warnings:
                self.reporter.warn(f"{spec.name}: {warning}")
        if len(lost) == len(self.plan.targets):   # nothing to measure: no run of failures,
            raise lost[0]                         # and its error said once, not warned first
        for name, why in self.broken.items():
            self.reporter.warn(f"{name} {why}; its runs are skipped")
        # Stored only once every target is up: bad input leaves no empty run behind.
        if self.resume_id:
            s.reopen_run(self.resume_id)
        else:
            s.new_run(self.plan.to_dict())
        self.run_id = s.run_id
        s.store_fingerprints()
        for workload, label in zip(made, point_labels(self.plan.workloads)):
            self.point = label
            self._run_workload(workload, units, done)

    @property
    def _stored_run(self) -> str:
        """The id of the run being stored, set once every target is up."""
        if self.run_id is None:
            raise VmtaxError("no run is stored yet")
        return self.run_id

    def _store_flags(self) -> None:
        summary = analysis.summarize_run(self.store.load_run(self._stored_run))
        self.summary = summary
        self.store.set_flags(self._stored_run, [
            (target, row.workload, row.params, row.key, flag)
            for row in summary.rows for target, cell in row.cells.items() for flag in cell.flags])

    def _already_done(self) -> set[RepKey]:
        if self.resume_id is None:
            return set(self.skip)
        run = self.store.load_run(self.resume_id)
        self.resume_id = run.id
        return self.skip | {rep_key(vars(r)) for r in run.reps}

    def _add_rep(self, **rep: Any) -> None:
        """Store a repetition of the run, and tell the event sink."""
        rep["metrics"] = list(rep.get("metrics", ()))
        self.store.add_rep(self._stored_run, **rep)
        if self.events is not None:
            self.events("rep", rep)

    def _run_workload(self, workload: Workload, units: list[Unit], done: set[RepKey]) -> None:
        key = (workload.name, params_key(workload.params))
        todo = [u for u in units if (u.target, *key, u.phase, u.idx) not in done]
        for unit in units:
            if (unit.target, *key, unit.phase, unit.idx) in done:
                self.reporter.step(f"{unit.target} · {self.point} · {STORED_BEFORE}")
                self.reporter.advance()
        if not todo and self.resume_id is not None and self.repetitions is not None:
            todo = self.repetitions.resumed(self._cell(workload, [], done, {}))
        if not todo:
            return
        active = [t for t in self.targets if any(u.target == t for u in todo)]
        for name in active:
            for i, job in enumerate(workload.prepare_jobs()):
                self.reporter.step(f"{name} · {self.point} · prepare")
                stored = (name, *key, "prepare", i) in done
                self._measure(name, workload, job, "prepare", i, workload.parse_prepare,
                              store=not stored)
        self.endpoints = {}
        recording: dict[str, list[tuple[str, Collector]]] = {}
        measured = {u.target for u in todo if u.phase == "measure"}
        try:
            self._start_servers(workload, active)
            for unit in todo:
                self.reporter.step(f"{unit.target} · {self.point} · "
                                   f"{'warm-up' if unit.phase == 'warmup' else 'run'} "
                                   f"{unit.idx + 1}")
                self._drop_caches(unit.target)
                job, on_host = self._measured_job(unit.target, workload)
                if unit.phase != "measure":
                    self._measure(unit.target, workload, job, unit.phase, unit.idx,
                                  workload.parse, on_host=on_host)
                else:
                    with self._recorded(unit.target, workload, done, recording):
                        self._measure(unit.target, workload, job, unit.phase, unit.idx,
                                      workload.parse, on_host=on_host)
                self.reporter.advance()
            if self.repetitions is not None:
                self.repetitions.more(self._cell(workload, active, done, recording))
            for name in measured:
                self._stop_collectors(name, workload, recording.pop(name, []))
        finally:
            for started in recording.values():   # interrupted: nothing is kept of them
                for _, collector in started:
                    collector.abort()
            self._stop_servers()
        for name in active:
            for job in workload.cleanup_jobs():
                self._run_job(name, job)

    # -- client-server workloads -----------------------------------------------------------
    def _start_servers(self, workload: Workload, active: list[str]) -> None:
        """Each target's server of a client-server workload, up for the whole cell; a
        target that cannot serve gets its repetitions failed with the reason."""
        server = workload.server_job()
        if server is None:
            return
        port = workload.server_port or 0
        for name in (n for n in active if n not in self.broken):   # broken: failed, why
            try:
                with self._awake(name) as target:
                    endpoint = target.start_server(server, port)
                    if not endpoint.listening:
                        _wait_listening(endpoint, server.timeout)
                self.endpoints[name] = endpoint
            except VmtaxError as exc:
                self.cell_errors[name] = f"its {workload.name} server did not start: {exc}"
                self.reporter.warn(f"{name} · {workload.name}: {self.cell_errors[name]}")

    @contextlib.contextmanager
    def _awake(self, name: str) -> Iterator[Target]:
        """Target name running for what is done inside (a paused guest answers nothing),
        paused again after, so it costs no host CPU while others are measured."""
        target = self.targets[name]
        target.resume()
        try:
            yield target
        finally:
            if target.alive():
                target.pause()

    # -- collectors ---------------------------------------------------------------------
    @contextlib.contextmanager
    def _recorded(self, name: str, workload: Workload, done: set[RepKey],
                  recording: dict[str, list[tuple[str, Collector]]]) -> Iterator[None]:
        """Target name's collectors recording one of its measured repetitions, and only
        it: started before its first, resumed before each next, paused right after each,
        so neither the other targets' repetitions in between (A B B A order) nor warm-ups
        and cache drops count in its figures."""
        if name in recording:
            for _, collector in recording[name]:
                collector.resume()
        else:
            recording[name] = ([] if name in self.broken
                               else self._start_collectors(name, workload, done))
        try:
            yield
        finally:
            for _, collector in recording[name]:
                collector.pause()
    def _subject(self, name: str) -> Subject:
        target = self.targets[name]
        endpoint = self.endpoints.get(name)
        return Subject(kind=target.kind, name=name, vmm_process=target.vmm_process,
                       pids=[*target.host_pids(), *(endpoint.pids if endpoint else [])],
                       vcpu_threads=target.vcpu_threads() if target.alive() else [],
                       cgroup=target.cgroup(),
                       host_client=(self.clients.setdefault(name, HostClient())
                                    if endpoint else None))

    def _start_collectors(self, name: str, workload: Workload,
                          done: set[RepKey]) -> list[tuple[str, Collector]]:
        """The plan's collectors on target name, right before its first measured
        repetition of the cell; one that cannot record is stored as unavailable, why."""
        key = (workload.name, params_key(workload.params))
        started: list[tuple[str, Collector]] = []
        if not self.plan.collect:
            return started
        subject = self._subject(name)
        for index, collector_name in enumerate(self.plan.collect):
            if (name, *key, "collect", index) in done:
                continue
            cls: type[Collector] = plugin.get("collector", collector_name)  # type: ignore[assignment]
            why = cls.unavailable(subject)
            if why is None:
                scratch = Path(tempfile.mkdtemp(prefix=f"collect-{collector_name}-",
                                                dir=self.work_dir))
                collector = cls(plugin.build(cls.Options, {}, collector_name),
                                journal=self.journal, scratch=scratch)
                try:
                    collector.start(subject)
                    started.append((collector_name, collector))
                    continue
                except VmtaxError as exc:
                    collector.abort()
                    why = str(exc)
            self._store_collected(name, workload, index, collector_name, [],
                                  f"{collector_name}: unavailable — {why}")
        return started

    def _stop_collectors(self, name: str, workload: Workload,
                         started: list[tuple[str, Collector]]) -> None:
        for collector_name, collector in started:
            index = self.plan.collect.index(collector_name)
            try:
                metrics, error = collector.stop(), None
            except VmtaxError as exc:
                metrics, error = [], f"{collector_name}: {exc}"
            notes = "; ".join(collector.warnings)
            self._store_collected(name, workload, index, collector_name, metrics,
                                  error or (f"{collector_name}: {notes}" if notes else None))

    def _store_collected(self, name: str, workload: Workload, index: int, collector: str,
                         metrics: list[Metric], error: str | None) -> None:
        # Said once: every TCG guest of a plan has the same four lines of why not.
        if error and not metrics and (said := error.replace(name, "\0")) not in \
                self.warned_collectors:
            self.warned_collectors.add(said)
            self.reporter.warn(f"{name} · {workload.name} · {error}")
        self._add_rep(
            target=name, workload=workload.name, params=workload.params,
            phase="collect", idx=index, status="ok" if metrics else "unavailable",
            argv=[collector], started=time.time(), error=error, metrics=metrics)

    def _stop_servers(self) -> None:
        for name, endpoint in self.endpoints.items():
            with self._awake(name) as target:
                target.stop_server(endpoint)
        self.endpoints = {}
        self.clients = {}
        self.cell_errors = {}

    def _measured_job(self, name: str, workload: Workload) -> tuple[Job, bool]:
        """The measured command of one repetition, and whether it runs on the host."""
        if workload.server_job() is None:
            return workload.run_job(), False
        endpoint = self.endpoints.get(name)
        # Without a server _run_job reports the cell's error and never runs the job.
        return (workload.client_job(endpoint) if endpoint else Job(["true"])), True

    def _client_cpus(self, name: str) -> set[int] | None:
        """Host CPUs for a client on the host: those the target does not use; None (and a
        warning, once) when they cannot be kept apart."""
        if self.targets[name].remote:
            return None
        usable = os.sched_getaffinity(0)
        taken = self.targets[name].cpus() or set()
        free = usable - taken
        if taken and free:
            return free
        if name not in self.warned_shared_cpus:
            self.warned_shared_cpus.add(name)
            self.reporter.warn(f"{name}: the client on the host and the target share host "
                               "CPUs (pin the target: a VM's pin, a container's cpus)")
        return None

    def _run_client(self, name: str, job: Job, endpoint: Endpoint) -> JobResult:
        cpus = self._client_cpus(name)
        steps: list[Callable[[], None]] = [
            s for s in ((lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
                        endpoint.client_preexec) if s is not None]

        def preexec() -> None:
            for step in steps:
                step()
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), **job.env}
        # The client's CPU time, with what it waited for (a killed one's children are
        # not counted): nothing else of vmtax's is reaped meanwhile.
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = proc.run(job.argv, timeout=job.timeout, env=env, preexec=preexec)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if name in self.clients:
            self.clients[name].add(after.ru_utime - before.ru_utime,
                                   after.ru_stime - before.ru_stime, done.elapsed)
        return JobResult(done.exit_code, done.stdout, done.stderr, done.elapsed,
                         timed_out=done.timed_out)

    def _cell(self, workload: Workload, active: list[str], done: set[RepKey],
              recording: dict[str, list[tuple[str, Collector]]]) -> Cell:
        """The cell of workload for the repetition policy: what is stored of it so far, and
        its `measure`."""
        values: dict[str, list[float]] = {t: [] for t in self.targets}
        attempts: dict[str, int] = dict.fromkeys(self.targets, 0)
        for r in self.store.load_run(self._stored_run).reps:
            if (r.target in values and r.phase == "measure" and r.workload == workload.name
                    and r.params == workload.params):
                attempts[r.target] += 1
                values[r.target] += _primary(workload, r.metrics)

        def measure(name: str, why: str) -> float | None:
            if name in self.broken:
                return None
            idx = self.plan.warmup + attempts[name]
            self.reporter.step(f"{name} · {self.point} · run {idx + 1} ({why})")
            self._drop_caches(name)
            job, on_host = self._measured_job(name, workload)
            with self._recorded(name, workload, done, recording):
                metrics = self._measure(name, workload, job, "measure", idx, workload.parse,
                                        on_host=on_host)
            attempts[name] += 1
            value = _primary(workload, metrics)
            values[name] += value
            return value[0] if value else None

        return Cell(workload, active, values, attempts, self.broken, measure)

    def _drop_caches(self, name: str) -> None:
        """The plan's drop_caches, before a repetition on target name and outside its
        measured time: sync and drop the host's page cache, then the target's own kernel's
        (a guest, a remote machine) with a job in it. What cannot be dropped is said once
        and the run goes on."""
        if not self.plan.drop_caches:
            return
        if "host" not in self.cannot_drop:
            try:
                os.sync()
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("3")
            except OSError as exc:
                self.cannot_drop.add("host")
                self.reporter.warn(f"drop_caches: cannot drop the host's page cache "
                                   f"({exc.strerror}); the run goes on without")
        target = self.targets[name]
        if target.bare_host or name in self.cannot_drop:
            return
        result = self._run_job(name, DROP_CACHES)
        if result is not None and not result.ok:
            self.cannot_drop.add(name)
            shared = (f" (a local {target.kind}'s page cache is the host's)"
                      if target.shares_host_page_cache else "")
            self.reporter.warn(f"drop_caches: {name} cannot drop its page cache: "
                               f"{_failure(result, DROP_CACHES)}; the run goes on{shared}")

    # -- one job ---------------------------------------------------------------------------
    def _run_job(self, name: str, job: Job, on_host: bool = False) -> JobResult | None:
        """Run job on target name (or, on_host, a client on the host against the target's
        server); reboot a target that died. None if the target is broken or its server
        did not start."""
        proc.check_stop()
        target = self.targets[name]
        if name not in self.broken:
            target.resume()
            if not target.alive():
                self._restart(name, "it could not be resumed")
        if name in self.broken or name in self.cell_errors:
            return None
        try:
            # A client-server workload's measured command runs on the host.
            result = (self._run_client(name, job, self.endpoints[name]) if on_host
                      else target.run(job))
        finally:
            if target.alive():
                target.pause()
        if not target.alive():
            self._restart(name, f"it stopped responding ({_failure(result, job)})")
            if name not in self.broken:
                target.pause()
        return result

    def _restart(self, name: str, why: str) -> None:
        """A fresh target (running) in place of one that died; or mark it broken."""
        target = self.targets[name]
        self.reporter.warn(f"{name}: {why}; restarting it")
        target.cleanup()
        try:
            target.prepare()
        except VmtaxError as exc:
            self.broken[name] = f"could not be restarted: {exc}"
            self.reporter.warn(f"{name} {self.broken[name]}; its remaining runs are skipped")

    def _measure(self, name: str, workload: Workload, job: Job, phase: str, idx: int,
                 parse: Callable[[str], list[Metric]], store: bool = True,
                 on_host: bool = False) -> list[Metric]:
        job = dataclasses.replace(job, timeout=estimate.job_timeout(workload, job, phase,
                                                                    self.plan.timeout))
        started = time.time()
        result = self._run_job(name, job, on_host)
        for _ in range(CLIENT_TRIES - 1):
            why = on_host and result is not None and workload.turned_away(result)
            if not why:
                break
            self.reporter.warn(f"{name} · {self.point} · {phase} {idx + 1}: its server turned "
                               f"the client away ({why}); trying again")
            with self._awake(name):
                time.sleep(CLIENT_PAUSE)   # for the server to listen anew
            result = self._run_job(name, job, on_host)
        metrics: list[Metric] = []
        error = None
        if result is None:
            status, error = "failed", (f"target {name} {self.broken[name]}" if name in self.broken
                                       else f"target {name}: {self.cell_errors[name]}")
        elif not result.ok:
            status, error = ("timeout" if result.timed_out else "failed"), _failure(result, job)
        else:
            try:
                metrics = parse(workload.report(result))
                status = "ok"
            except Exception as exc:   # any parser failure fails this repetition, not the plan
                status, error = "failed", f"unparseable output: {str(exc)[:300]}"
        if error:
            self.reporter.warn(f"{name} · {self.point} · {phase} {idx + 1}: {error}")
        if store:
            # A guest time is kept only from a target with a clock of its own to check.
            own_clock = self.targets[name].guest_clock
            self._add_rep(
                target=name, workload=workload.name, params=workload.params,
                phase=phase, idx=idx, status=status, argv=job.argv, secrets=job.secrets,
                started=started, error=error,
                exit_code=result.exit_code if result else None,
                host_elapsed=result.host_elapsed if result else None,
                guest_elapsed=result.guest_elapsed if result and own_clock else None,
                stdout=result.stdout if result else None,
                stderr=result.stderr if result else None, metrics=metrics)
        return metrics
