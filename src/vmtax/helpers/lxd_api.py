"""LXD's REST API on its unix socket: the calls vmtax's lxd target makes, and the undo of
what it made there.

Plain HTTP (http.client over AF_UNIX) rather than the `lxc` client or pylxd:
- a job's environment goes in the request's body, so a secret it carries (oltp's password)
  never appears in a host process's argv, as it would with `lxc exec --env K=V`;
- a job runs with no client process on the host: LXD records its output to files that are
  read back once it ends, and a server runs detached for the container's lifetime, so the
  host's memory per instance (density) is the container's alone, not one `lxc` client's
  more, and a killed vmtax leaves no client behind;
- an exec costs one request and one wait (~10 ms here), no websocket; pylxd would add a
  dependency tree (ws4py, requests-unixsocket) for the same few calls.
Only the image import goes through `lxc image import` (a multipart upload of two tarballs).

Everything vmtax makes in LXD has a name starting with PREFIX and is journaled before it
is made, undone by a function of this module (`undone_by`): an instance, a profile, a
storage pool. The daemon itself, when vmtax starts it, is journaled first
(vmtax.host.daemon, by the lxd target), so it is stopped last.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from vmtax.core.errors import TargetError
from vmtax.host import daemon
from vmtax.host.unix_http import UnixConnection
from vmtax.host.journal import Journal, undone_by

# Debian's lxd (the socket its lxd.socket unit listens on); LXD_DIR is /var/lib/lxd.
SOCKET = Path("/var/lib/lxd/unix.socket")
# Where Debian's lxd keeps each instance's logs (lxc.conf, lxc.log, forkstart.log), in a
# directory named after it that deleting the instance leaves behind.
LOGS = Path("/var/log/lxd")
PREFIX = "vmtax-"
# The names vmtax gives what it makes in LXD: its pools and profiles, vmtax-<id>; its
# instances, vmtax-<id>-<n>. Nothing else is deleted by an undo.
NAME = re.compile(r"vmtax-[0-9a-f]+(-[0-9a-f]+)?")
REQUEST_TIMEOUT = 120.0     # creating an instance unpacks and shifts its rootfs
KILL_GRACE = 10.0           # a killed job's exec to end
BUSY_WAIT = 60.0            # an instance LXD is still stopping ("Instance is busy running a
                            # "stop" operation": ~6 s after a failed start here)


class LxdError(TargetError):
    """LXD refused a call: its own message, in one line."""


@dataclass
class ExecResult:
    exit_code: int | None        # None: killed at its timeout
    stdout: str
    stderr: str
    elapsed: float
    timed_out: bool = False


class Lxd:
    """A client of the LXD daemon answering on `socket`; one connection per call, so
    threads (a factory's starts) share it."""

    def __init__(self, path: Path = SOCKET):
        self.socket = path

    def _send(self, method: str, path: str, body: Any = None,
              timeout: float = REQUEST_TIMEOUT) -> tuple[int, bytes]:
        conn = UnixConnection(self.socket, timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        except OSError as exc:
            raise LxdError(f"LXD at {self.socket}: {method} {path} failed: "
                           f"{exc.strerror or exc}") from None
        finally:
            conn.close()

    def call(self, method: str, path: str, body: Any = None,
             timeout: float = REQUEST_TIMEOUT) -> dict[str, Any]:
        """One request; the response's envelope (metadata, operation). LxdError when LXD
        answers with an error."""
        status, raw = self._send(method, path, body, timeout)
        try:
            answer = json.loads(raw)
        except ValueError:
            raise LxdError(f"LXD: {method} {path}: not JSON (HTTP {status})") from None
        if answer.get("type") == "error" or status >= 400:
            raise LxdError(f"LXD: {method} {path}: {answer.get('error') or status}")
        return dict(answer)

    def do(self, method: str, path: str, body: Any = None,
           timeout: float = REQUEST_TIMEOUT) -> Any:
        """A request carried to its end: a background operation is waited for (up to
        timeout, else LxdError). Its metadata."""
        answer = self.call(method, path, body, timeout)
        if answer.get("type") != "async":
            return answer.get("metadata")
        done = self.wait(answer["operation"], timeout)
        if done is None:
            raise LxdError(f"LXD: {method} {path} did not finish within {timeout:.0f} s")
        return done

    def wait(self, operation: str, timeout: float) -> Any:
        """An operation's result metadata once it ends (LxdError if it failed), or None
        while it still runs after timeout seconds."""
        answer = self.call("GET", f"{operation}/wait?timeout={max(1, math.ceil(timeout))}",
                           timeout=timeout + 30)
        op = answer.get("metadata") or {}
        if op.get("status") == "Running":
            return None
        if op.get("status") != "Success":
            raise LxdError(f"LXD: {op.get('description', 'operation')}: "
                           f"{op.get('err') or op.get('status')}")
        return op.get("metadata") or {}

    def exists(self, path: str) -> bool:
        status, _ = self._send("GET", path)
        return status == 200

    def read(self, path: str) -> bytes:
        status, raw = self._send("GET", path)
        if status != 200:
            raise LxdError(f"LXD: GET {path}: HTTP {status}")
        return raw

    def server(self) -> dict[str, Any]:
        return dict(self.do("GET", "/1.0"))

    # -- instances --

    def state(self, name: str) -> dict[str, Any]:
        return dict(self.do("GET", f"/1.0/instances/{quote(name)}/state"))

    def init_pid(self, name: str) -> int:
        """The host pid of the container's init (0: not running)."""
        return int(self.state(name).get("pid") or 0)

    def remove(self, name: str) -> None:
        """Stop (forced) and delete an instance; one already gone is fine. An instance that
        failed to start is busy for seconds after (LXD's own stop of it, its hooks): LXD
        refuses to delete it meanwhile, so the delete is retried for up to BUSY_WAIT s."""
        path = f"/1.0/instances/{quote(name)}"
        if not self.exists(path):
            return
        if self.state(name).get("status") != "Stopped":
            with contextlib.suppress(LxdError):   # stopped meanwhile
                self.do("PUT", f"{path}/state", {"action": "stop", "force": True,
                                                 "timeout": 30})
        deadline = time.monotonic() + BUSY_WAIT
        while True:
            try:
                self.do("DELETE", path)
                return
            except LxdError as exc:
                if "is busy" not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def start(self, name: str) -> None:
        """Start an instance; LxdError with LXD's reason and, when it failed in LXC, the
        last errors of the instance's LXC log."""
        try:
            self.do("PUT", f"/1.0/instances/{quote(name)}/state",
                    {"action": "start", "timeout": 30})
        except LxdError as exc:   # LXC's first errors say why, the rest what followed
            errors = [line.rsplit(" - ", 1)[-1].strip() for line in self._log(name, "lxc.log")
                      if " ERROR " in line]
            raise LxdError(f"{exc}" + (f" (LXC: {'; '.join(errors[:2])})" if errors
                                       else "")) from None

    def _log(self, name: str, log: str) -> list[str]:
        """The lines of one of an instance's log files (none if it cannot be read)."""
        with contextlib.suppress(LxdError):
            return self.read(f"/1.0/instances/{quote(name)}/logs/{log}").decode(
                errors="replace").splitlines()
        return []

    def start_exec(self, name: str, argv: list[str], env: dict[str, str], cwd: str) -> str:
        """Start argv in the container without a client (stdin empty, output recorded);
        returns its operation."""
        answer = self.call("POST", f"/1.0/instances/{quote(name)}/exec", {
            "command": argv, "environment": env, "cwd": cwd, "interactive": False,
            "wait-for-websocket": False, "record-output": True})
        return str(answer["operation"])

    def exec(self, name: str, argv: list[str], env: dict[str, str], cwd: str,
             timeout: float) -> ExecResult:
        """Run argv in the container to its end or its timeout; at the timeout every
        process of the container but its init is killed (a target runs one job at a
        time, and no server runs meanwhile)."""
        start = time.perf_counter()
        operation = self.start_exec(name, argv, env, cwd)
        done = self.wait(operation, timeout)
        timed_out = done is None
        if done is None:
            self.kill_all(name)
            done = self.wait(operation, KILL_GRACE)
            if done is None:
                raise LxdError(f"{argv[0]} in LXD instance {name} survived being killed")
        elapsed = time.perf_counter() - start
        return ExecResult(None if timed_out else int(done.get("return", -1)),
                          *self.output(done), elapsed=elapsed, timed_out=timed_out)

    def output(self, done: dict[str, Any]) -> tuple[str, str]:
        """An ended exec's recorded stdout and stderr, its files deleted once read."""
        streams = []
        for fd in ("1", "2"):
            path = (done.get("output") or {}).get(fd)
            if path is None:
                streams.append("")
                continue
            streams.append(self.read(path).decode(errors="replace"))
            with contextlib.suppress(LxdError):
                self.call("DELETE", path)
        return streams[0], streams[1]

    def kill_all(self, name: str, signal: str = "KILL") -> None:
        """Signal every process of the container but its init (kill -1 spares the
        caller and pid 1)."""
        with contextlib.suppress(LxdError):
            self.do("POST", f"/1.0/instances/{quote(name)}/exec", {
                "command": ["kill", f"-{signal}", "-1"], "interactive": False,
                "wait-for-websocket": False, "record-output": False}, timeout=30)


# -- what vmtax made in LXD, and its undo --------------------------------------------------

COLLECTIONS = {"lxd instance": "instances", "lxd profile": "profiles",
               "lxd pool": "storage-pools"}


def journaled(journal: Journal, kind: str, name: str, client: Lxd) -> int:
    """Journal an LXD object about to be made (kind: a key of COLLECTIONS)."""
    return journal.add(type=kind, undo=undone_by(undo), name=name, socket=str(client.socket))


def undo(journal: Journal, entry: dict[str, Any]) -> None:
    """Delete an instance, profile or pool vmtax made. LXD keeps them in its database while
    it is stopped, so with no daemon answering the entry stays journaled (LxdError) until
    one does (the daemon vmtax starts is stopped only after them: vmtax.host.daemon)."""
    kind, name = entry.get("type"), entry.get("name")
    if kind not in COLLECTIONS or not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"{kind} {name!r} is not something vmtax makes in LXD")
    client = Lxd(Path(entry.get("socket") or SOCKET))
    if not daemon.answers(client.socket):
        raise LxdError(f"LXD does not answer on {client.socket}: its {kind.split()[1]} "
                       f"{name} stays in its database until LXD runs and `vmtax cleanup` "
                       "removes it")
    if kind == "lxd instance":
        client.remove(name)
        # Its logs, which LXD leaves (and writes until its stop of the instance is over).
        shutil.rmtree(LOGS / name, ignore_errors=True)
        return
    path = f"/1.0/{COLLECTIONS[str(kind)]}/{quote(name)}"
    if client.exists(path):
        client.do("DELETE", path)
