"""The fleet's Ray plumbing: the `ray start` command lines of the head and of a benchmark
host, checking the head's address before Ray would retry it for minutes, connecting to the
cluster, the GCS key-value entries the hosts and the driver share, and the nodes (hosts)
with their fingerprints. vmtax.studies.fleet runs plans on them.

Each benchmark host is a Ray node (`vmtax fleet join`) that advertises one unit of the
custom resource `vmtax-host:NAME` (RESOURCE) and no CPUs, so nothing but vmtax's own tasks,
which ask for that unit, is scheduled there, and never two at once.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.host import guardian, journal, proc
from vmtax.host import machine as host

RESOURCE = "vmtax-host:"
NAMESPACE = "vmtax"      # of the GCS key-value entries below
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# Fingerprint fields that differ between otherwise identical hosts.
_NOT_IDENTITY = {"hostname", "usable_cpus", "python", "vmtax", "memory_bytes", "fleet"}


class FleetError(VmtaxError):
    pass


# What runs once a node is up, given Ray (a module without type hints) connected as a driver.
OnUp = Callable[[ModuleType], None]


def _ray() -> ModuleType:
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
def connected(address: str, within: float = 0.0) -> Iterator[ModuleType]:
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


def _kv() -> ModuleType:
    from ray.experimental import internal_kv
    return internal_kv


def kv_get(key: str) -> Any:
    raw = _kv()._internal_kv_get(key.encode(), namespace=NAMESPACE)
    return json.loads(raw) if raw else None


def kv_put(key: str, value: Any) -> None:
    _kv()._internal_kv_put(key.encode(), json.dumps(value).encode(), namespace=NAMESPACE)


def kv_del(key: str) -> None:
    _kv()._internal_kv_del(key.encode(), namespace=NAMESPACE)


# -- the nodes -----------------------------------------------------------------------------
@dataclass
class Host:
    name: str
    alive: bool
    fingerprint: dict[str, Any]
    results: str | None
    running: dict[str, Any] | None


def node_hosts(ray: ModuleType) -> dict[str, list[bool]]:
    """Host name -> the alive flag of each Ray node advertising its resource."""
    found: dict[str, list[bool]] = {}
    for node in ray.nodes():
        for resource in node.get("Resources", {}):
            if resource.startswith(RESOURCE):
                found.setdefault(resource[len(RESOURCE):], []).append(bool(node["Alive"]))
    return found


def hosts(ray: ModuleType) -> list[Host]:
    """Every host that joined the fleet (alive or gone), with its fingerprint and what it
    runs now. A gone node no longer lists its resources: the ones that registered count."""
    nodes = node_hosts(ray)
    for key in _kv()._internal_kv_list(b"host:", namespace=NAMESPACE):
        nodes.setdefault(key.decode()[len("host:"):], [])
    out = []
    for name, alive in sorted(nodes.items()):
        joined = kv_get(f"host:{name}") or {}
        up = any(alive)
        out.append(Host(name, up, joined.get("fingerprint", {}), joined.get("results"),
                        kv_get(f"busy:{name}") if up else None))
    return out


def identity(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """What must be equal for two hosts to be interchangeable (--spread cells)."""
    return {k: v for k, v in fingerprint.items() if k not in _NOT_IDENTITY}


def _log_tail(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def serve(argv: list[str], log: Path, address: str, name: str | None,
          env: dict[str, str] | None = None, on_up: OnUp | None = None,
          within: float = 120.0) -> None:
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


def _wait_up(ray_start: subprocess.Popen[bytes], log: Path, address: str, name: str | None,
             on_up: OnUp | None, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        if ray_start.poll() is not None:
            raise FleetError(f"ray start failed (status {ray_start.returncode}): "
                             f"{_log_tail(log)} (log: {log})")
        with contextlib.suppress(FleetError):
            with connected(address) as ray:
                if name is not None:
                    alive = [a for a in node_hosts(ray).get(name, []) if a]
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
    kv_put(f"host:{name}", {"fingerprint": host.fingerprint(), "results": results,
                             "joined": time.time()})
    kv_del(f"busy:{name}")


def ray_log(kind: str) -> Path:
    return paths.runtime_dir() / f"fleet-{kind}.log"
