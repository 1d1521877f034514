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
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import os
import queue
import re
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from vmtax import __version__
from vmtax.analysis import summary as analysis
from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.host import guardian, journal, proc
from vmtax.host import machine as host
from vmtax.results.store import Run, Store
from vmtax.studies.plan import Plan
from vmtax.studies.runner import QuietReporter, Reporter, Runner, _params_key, schedule

RESOURCE = "vmtax-host:"
NAMESPACE = "vmtax"      # of the GCS key-value entries below
SPREADS = ("hosts", "cells")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# Fingerprint fields that differ between otherwise identical hosts.
_NOT_IDENTITY = {"hostname", "usable_cpus", "python", "vmtax", "memory_bytes", "fleet"}
# How often the driver checks that the hosts it waits on are still there.
_POLL = 2.0


class FleetError(VmtaxError):
    pass


def _ray():
    try:
        import ray
    except ImportError:
        raise FleetError("the fleet needs Ray: pip install 'vmtax[fleet]'") from None
    return ray


def _ray_exe() -> str:
    """The `ray` command installed beside this Python (the .venv's), else the one on PATH."""
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else "ray"


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise FleetError(f"--name: expected letters, digits, '.', '_' or '-' (at most 63, "
                         f"starting with a letter or digit), got {name!r}")
    return name


def head_argv(port: int, temp_dir: str | None) -> list[str]:
    return [_ray_exe(), "start", "--head", "--block", "--port", str(port), "--num-cpus", "0",
            "--num-gpus", "0", "--include-dashboard", "false", "--disable-usage-stats",
            *_temp_dir(temp_dir)]


def join_argv(address: str, name: str, temp_dir: str | None) -> list[str]:
    return [_ray_exe(), "start", "--address", address, "--block", "--num-cpus", "0",
            "--num-gpus", "0", "--resources", json.dumps({RESOURCE + name: 1}),
            "--disable-usage-stats", *_temp_dir(temp_dir)]


def _temp_dir(temp_dir: str | None) -> list[str]:
    """Ray's --temp-dir for --ray-temp-dir, made absolute ("../t" from where vmtax was
    started): the one directory whichever of Ray's processes, in whatever directory, reads
    it."""
    return ["--temp-dir", os.path.abspath(temp_dir)] if temp_dir else []


# A host name's labels (RFC 1123); its last is never all digits, which an IPv4 address is.
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
# How long `fleet join` waits for the head's port to answer before it starts Ray.
HEAD_CONNECT_TIMEOUT = 10.0


def _host_port(address: str) -> tuple[str, int]:
    """The host and port of HOST:PORT (an IPv6 address in brackets: [::1]:6379), checked
    as written, without a lookup."""
    host_name, _, port = address.rpartition(":")
    expected = (f"fleet address: expected HOST:PORT (the head's, e.g. 192.0.2.10:6379), "
                f"got {address!r}")
    if not host_name or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise FleetError(expected + (": the port is 1 to 65535" if port.isdigit() else ""))
    if host_name.startswith("[") and host_name.endswith("]"):
        host_name = host_name[1:-1]
    try:
        ipaddress.ip_address(host_name)
    except ValueError:
        labels = host_name.rstrip(".").split(".")
        if (not all(_LABEL.fullmatch(label) for label in labels) or labels[-1].isdigit()
                or len(host_name) > 253):
            raise FleetError(expected + f": {host_name!r} is neither an IP address nor a "
                             "host name") from None
    return host_name, int(port)


def check_head(address: str, timeout: float = HEAD_CONNECT_TIMEOUT) -> None:
    """Whether a head can be at address: a valid HOST:PORT whose host resolves and whose
    port accepts a TCP connection within timeout seconds (Ray itself retries for minutes,
    silently, before it gives up)."""
    host_name, port = _host_port(address)
    try:
        socket.getaddrinfo(host_name, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise FleetError(f"fleet address {address}: cannot resolve {host_name!r} "
                         f"({exc.args[-1] if exc.args else exc})") from None
    try:
        socket.create_connection((host_name, port), timeout=timeout).close()
    except TimeoutError:
        raise FleetError(f"no fleet head at {address}: no answer within {timeout:g} s; "
                         "check the address and that `vmtax fleet start` runs there") from None
    except OSError as exc:
        raise FleetError(f"no fleet head at {address}: {exc.strerror or exc}; check the "
                         "address and that `vmtax fleet start` runs there") from None


@contextlib.contextmanager
def connected(address: str, within: float = 0.0) -> Iterator[Any]:
    """Ray, connected as a driver to the cluster at address (retried for `within` seconds
    while a node is still coming up). vmtax's own Ctrl-C/SIGTERM handling is kept: ray.init
    installs handlers of its own."""
    ray = _ray()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    head = _host_port(address)
    deadline = time.monotonic() + within
    while True:
        try:
            # ray.init retries an absent head forever: ask its port first.
            socket.create_connection(head, timeout=5).close()
            ray.init(address=address, namespace=NAMESPACE, logging_level="ERROR",
                     log_to_driver=False)
            break
        except Exception as exc:   # Ray raises several kinds for a head that is not there
            if time.monotonic() >= deadline:
                raise FleetError(f"no fleet head at {address}: {str(exc).splitlines()[0]}; "
                                 "start one with `vmtax fleet start`") from None
            time.sleep(1)
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)
    try:
        yield ray
    finally:
        ray.shutdown()
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)


def _kv():
    from ray.experimental import internal_kv
    return internal_kv


def _kv_get(key: str) -> Any:
    raw = _kv()._internal_kv_get(key.encode(), namespace=NAMESPACE)
    return json.loads(raw) if raw else None


def _kv_put(key: str, value: Any) -> None:
    _kv()._internal_kv_put(key.encode(), json.dumps(value).encode(), namespace=NAMESPACE)


def _kv_del(key: str) -> None:
    _kv()._internal_kv_del(key.encode(), namespace=NAMESPACE)


# -- the nodes -----------------------------------------------------------------------------
@dataclass
class Host:
    name: str
    alive: bool
    fingerprint: dict[str, Any]
    results: str | None
    running: dict[str, Any] | None


def _node_hosts(ray) -> dict[str, list[bool]]:
    """Host name -> the alive flag of each Ray node advertising its resource."""
    found: dict[str, list[bool]] = {}
    for node in ray.nodes():
        for resource in node.get("Resources", {}):
            if resource.startswith(RESOURCE):
                found.setdefault(resource[len(RESOURCE):], []).append(bool(node["Alive"]))
    return found


def hosts(ray) -> list[Host]:
    """Every host that joined the fleet (alive or gone), with its fingerprint and what it
    runs now. A gone node no longer lists its resources: the ones that registered count."""
    nodes = _node_hosts(ray)
    for key in _kv()._internal_kv_list(b"host:", namespace=NAMESPACE):
        nodes.setdefault(key.decode()[len("host:"):], [])
    out = []
    for name, alive in sorted(nodes.items()):
        joined = _kv_get(f"host:{name}") or {}
        up = any(alive)
        out.append(Host(name, up, joined.get("fingerprint", {}), joined.get("results"),
                        _kv_get(f"busy:{name}") if up else None))
    return out


def identity(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """What must be equal for two hosts to be interchangeable (--spread cells)."""
    return {k: v for k, v in fingerprint.items() if k not in _NOT_IDENTITY}


def _log_tail(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def serve(argv: list[str], log: Path, address: str, name: str | None,
          env: dict[str, str] | None = None, on_up=None, within: float = 120.0) -> None:
    """Run `ray start --block` (argv) until Ctrl-C/SIGTERM, its whole process group journaled
    and killed on the way out (or by the guardian, should vmtax be killed). Once the node is
    up, on_up(ray) runs, connected as a driver. A worker node named name must
    be the only live one of that name."""
    own = journal.Journal()
    with guardian.guard(own.path):
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            ray_start = proc.spawn(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                   env=env)
        token = own.process(ray_start.pid)
        try:
            _wait_up(ray_start, log, address, name, on_up, within)
            code = ray_start.wait()
            raise FleetError(f"ray exited with status {code}: {_log_tail(log)} (log: {log})")
        except KeyboardInterrupt:
            log.unlink(missing_ok=True)   # stopped as asked: nothing to look into
            raise
        finally:
            # Ray stops its node on SIGTERM, slowly: a few seconds, then the whole group.
            proc.kill_group(ray_start, grace=3)
            _kill_session(ray_start.pid)
            own.undo(token)


def _kill_session(sid: int) -> None:
    """Kill what is left of the session `ray start` led: Ray's workers have process groups
    of their own, and one running a benchmark would go on until it noticed its node gone.
    (A task's guardian has a session of its own: it stays to undo the task's changes.)"""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def _wait_up(ray_start, log: Path, address: str, name: str | None, on_up, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        if ray_start.poll() is not None:
            raise FleetError(f"ray start failed (status {ray_start.returncode}): "
                             f"{_log_tail(log)} (log: {log})")
        with contextlib.suppress(FleetError):
            with connected(address) as ray:
                if name is not None:
                    alive = [a for a in _node_hosts(ray).get(name, []) if a]
                    if len(alive) > 1:
                        raise VmtaxError(f"a host named {name!r} is already in the fleet at "
                                         f"{address}; choose another --name")
                    if not alive:
                        time.sleep(1)
                        continue
                if on_up is not None:
                    on_up(ray)
                return
        if time.monotonic() > deadline:
            raise FleetError(f"the Ray node did not come up within {within:g} s (log: {log})")
        time.sleep(1)


def register(name: str, results: str) -> None:
    """Advertise this host's fingerprint and local store (connected as a driver)."""
    _kv_put(f"host:{name}", {"fingerprint": host.fingerprint(), "results": results,
                             "joined": time.time()})
    _kv_del(f"busy:{name}")


def ray_log(kind: str) -> Path:
    return paths.runtime_dir() / f"fleet-{kind}.log"


# -- on a host -------------------------------------------------------------------------------
class _StreamingStore(Store):
    """The host's local store, which also hands every run, target and repetition it stores
    to the task streaming them to the driver."""

    def __init__(self, results_dir: str, events: queue.Queue):
        super().__init__(results_dir)
        self.events = events

    def new_run(self, plan: dict[str, Any], host: dict[str, Any], version: str) -> str:
        run_id = super().new_run(plan, host, version)
        self.events.put(("run", {"local_run": run_id, "fingerprint": host}))
        return run_id

    def set_target(self, run_id: str, name: str, kind: str, fingerprint: dict[str, Any]) -> None:
        super().set_target(run_id, name, kind, fingerprint)
        self.events.put(("target", {"name": name, "kind": kind, "fingerprint": fingerprint}))

    def add_rep(self, run_id: str, **rep: Any) -> int | None:
        rep["metrics"] = list(rep.get("metrics", ()))
        rep_id = super().add_rep(run_id, **rep)
        self.events.put(("rep", rep))
        return rep_id


class _FleetRunner(Runner):
    """The Runner, skipping the repetitions the head already has (a re-queued cell)."""

    def __init__(self, *args: Any, skip: set[tuple], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.skip = skip

    def _already_done(self) -> set[tuple]:
        return set(self.skip)


class _BusyReporter(QuietReporter):
    """What the host is doing, for `vmtax fleet status`; warnings go to the driver."""

    def __init__(self, name: str, label: str, events: queue.Queue):
        self.name, self.label, self.events = name, label, events
        self.since = time.time()

    def step(self, text: str) -> None:
        _kv_put(f"busy:{self.name}", {"cell": self.label, "step": text, "since": self.since})

    def warn(self, text: str) -> None:
        self.events.put(("warn", text))


def host_task(plan: dict[str, Any], skip: list[tuple], label: str,
              name: str) -> Iterator[tuple]:
    """The Ray task on a host: vmtax's Runner on the plan, as a local `vmtax run` would
    (journal, guardian), yielding its events as they happen; the last is ("end", ...) or
    ("error", why). The Runner has a thread of its own: only the task's thread may yield."""
    events: queue.Queue = queue.Queue()

    def work() -> None:
        try:
            store = _StreamingStore(os.environ.get("VMTAX_RESULTS", "results"), events)
            for line in journal.recover():
                events.put(("warn", f"recovered: {line}"))
            own = journal.Journal()
            try:
                with guardian.guard(own.path):
                    runner = _FleetRunner(Plan.from_dict(plan), store,
                                          _BusyReporter(name, label, events), journal=own,
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
            _kv_del(f"busy:{name}")


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

    def rep(self, run_id: str, key: tuple, host_name: str, local_run: str | None) -> None:
        with self.db:
            self.db.execute("INSERT INTO rep_hosts VALUES (?,?,?,?)",
                            (run_id, json.dumps(key), host_name, local_run))

    def part(self, run_id: str, host_name: str, cell: str, status: str,
             reason: str | None) -> None:
        with self.db:
            self.db.execute("INSERT INTO host_parts VALUES (?,?,?,?,?,?)",
                            (run_id, host_name, cell, status, reason, time.time()))

    def rep_hosts(self, run_id: str) -> dict[tuple, str]:
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
    keys: set[tuple] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)


@dataclass
class _Job:
    plan: dict[str, Any]
    label: str
    head: _HeadRun
    host: str | None       # pinned (--spread hosts), or any free host (cells)
    local_run: str | None = None


def rep_key(rep: dict[str, Any]) -> tuple:
    """A repetition's identity within a run, as the Runner's skip set has it."""
    return (rep["target"], rep["workload"], _params_key(rep["params"]), rep["phase"],
            rep["idx"])


def _complete(plan: Plan, keys: set[tuple]) -> bool:
    """Whether every warm-up and measured repetition of the plan is stored."""
    return all((u.target, w.name, _params_key(w.make(plan.time).params), u.phase, u.idx)
               in keys for w in plan.workloads for u in schedule(plan))


def _cells(plan: Plan) -> list[tuple[str, dict[str, Any]]]:
    whole = plan.to_dict()
    return [(f"{w.name} {json.dumps(w.params, sort_keys=True)}" if w.params else w.name,
             {**whole, "workloads": [{"name": w.name, "params": w.params}]})
            for w in plan.workloads]


def _choose(ray, names: list[str] | None, spread: str) -> dict[str, Host]:
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


class _Driver:
    def __init__(self, ray, store: Store, log: FleetLog, reporter: Reporter):
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
        active: dict[Any, tuple[_Job, str]] = {}
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

    def _dispatch(self, waiting: deque, free: set[str], active: dict) -> None:
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

    def _next(self, gen, active: dict, free: set[str], waiting: deque, pool: set[str],
              spread: str) -> None:
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

    def _check_alive(self, active: dict, free: set[str], waiting: deque, pool: set[str],
                     spread: str) -> None:
        alive = {n for n, flags in _node_hosts(self.ray).items() if any(flags)}
        for name in sorted(pool - alive):
            pool.discard(name)
            free.discard(name)
            for gen, (job, host_name) in list(active.items()):
                if host_name == name:
                    active.pop(gen)
                    with contextlib.suppress(Exception):
                        self.ray.cancel(gen, force=True)
                    self._lost(job, name, "its Ray node is gone", waiting, pool, spread)

    def _lost(self, job: _Job, host_name: str, why: str, waiting: deque, pool: set[str],
              spread: str) -> None:
        """The host left mid-job: re-queue the cell elsewhere (cells), or fail the host's
        run with the reason (hosts)."""
        pool.discard(host_name)
        with contextlib.suppress(Exception):
            _kv_del(f"busy:{host_name}")
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
        raise FleetError(f"run {run.id} was not run on a fleet; `vmtax show {run.id}` shows it")
    if "host" in info:
        ids = [r[0] for r in store.db.execute(
            "SELECT id FROM runs WHERE json_extract(host, '$.fleet.id') = ? ORDER BY created",
            (info["id"],))] if info.get("id") else [run.id]
        found = [run if i == run.id else store.load_run(i) for i in ids]
        return {r.host["fleet"]["host"]: r for r in sorted(found,
                                                            key=lambda r: r.host["fleet"]["host"])}
    log_path = store.dir / "fleet.sqlite"
    ran_on = FleetLog(store.dir).rep_hosts(run.id) if log_path.exists() else {}
    split: dict[str, list] = {}
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


@dataclass
class SpreadRow:
    """A target's ratio to its host's baseline on each host, for one headline metric."""
    workload: str
    params: dict[str, Any]
    metric: str
    target: str
    ratios: dict[str, float | None]     # host -> ratio (None: no usable ratio there)

    @property
    def values(self) -> list[float]:
        return [v for v in self.ratios.values() if v is not None]

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    @property
    def low(self) -> float | None:
        return min(self.values, default=None)

    @property
    def high(self) -> float | None:
        return max(self.values, default=None)

    def to_json(self) -> dict[str, Any]:
        return {"workload": self.workload, "params": self.params, "metric": self.metric,
                "target": self.target, "ratios": self.ratios, "median": self.median,
                "min": self.low, "max": self.high}


def spread(per_host: dict[str, Run]) -> list[SpreadRow]:
    """Per headline metric and non-baseline target, its ratio on every host and their
    spread: each host's run summarized as `vmtax show` does (analysis.summarize_run)."""
    rows: dict[tuple, SpreadRow] = {}
    for name, run in per_host.items():
        summary = analysis.summarize_run(run)
        for row in analysis.headline(summary.rows):
            for target, cell in row.cells.items():
                if target == summary.baseline:
                    continue
                key = (row.workload, json.dumps(row.params, sort_keys=True), row.label, target)
                found = rows.setdefault(key, SpreadRow(row.workload, row.params, row.label,
                                                       target, {}))
                found.ratios[name] = cell.ratio.value if cell.ratio else None
    for found in rows.values():
        found.ratios = {name: found.ratios.get(name) for name in per_host}
    return list(rows.values())
