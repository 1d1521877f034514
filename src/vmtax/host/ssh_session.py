"""One SSH connection to a remote machine, used synchronously (asyncssh under the hood).

vmtax is synchronous; asyncssh is not. Every connection of the process shares one event
loop in a daemon thread, and each call waits for its coroutine there. Commands are argv
lists: the remote side is a shell, so each element is quoted (shlex.join) and no user
string is ever interpreted by it.

Every job runs under a small wrapper that writes its pid and start time to a pid file
in the target's remote scratch directory before it execs the program, so that a timeout,
a lost connection, Ctrl-C or (through the journal's "remote" entries) a crash of vmtax
can kill the job's whole process group on the remote: sshd starts each command in a
session of its own, and a job left running without its connection would go on.

A job's environment can hold secrets (Job.secrets), and a remote command line is visible
to every user of the remote (ps, /proc/PID/cmdline): only the variables' names go on the
wrapper's command line, their values come on its stdin, which it reads with shell builtins
and `cat` alone, so that no value is ever an argument of any process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import shlex
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Coroutine, Literal, TypeVar

from vmtax.core.errors import TargetError
from vmtax.host.journal import Journal, undone_by

if TYPE_CHECKING:
    import asyncssh

T = TypeVar("T")

CONNECT_TIMEOUT = 20.0
# A dead link is noticed within ~15 s even while a job prints nothing.
KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 5, 3
# Reconnection after a lost connection: waits before each attempt (about a minute in all).
BACKOFF = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
# Commands of vmtax's own (mkdir, kill, rm, the fingerprint) finish in well under this.
HOUSEKEEPING_TIMEOUT = 60.0

# $1 pid file, $2 working directory, $3 a delimiter found in no value, $4 the variables'
# names (space-separated), then PROGRAM ARGS. Stdin: each variable's value followed by the
# delimiter, in the order of the names; split with parameter expansions (POSIX sh, busybox
# ash) and exported by the builtin, never passed to a program. The job's stdin is /dev/null.
# The pid's start time (field 22 of /proc/PID/stat) tells it from a reused pid later.
JOB_WRAPPER = ('echo "$$ $(cut -d" " -f22 /proc/$$/stat)" > "$1" && cd "$2" && d=$3 '
               '&& names=$4 && shift 4 && all=$(cat) '
               '&& for k in $names; do v=${all%%"$d"*}; all=${all#*"$d"}; export "$k=$v" '
               '|| exit 125; done && exec "$@" < /dev/null')
# A job's environment variable name: the wrapper splits the names on spaces and exports them.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# $1 a pid file, or a directory of them: SIGKILL the process group (and the process) of
# each one's job that still runs, then remove the pid file. A pgid below 2 is never killed.
KILL_JOBS = (
    'k() { read -r p s < "$1"; '
    'if [ -n "$p" ] && [ "$(cut -d" " -f22 /proc/"$p"/stat 2>/dev/null)" = "$s" ]; '
    'then g=$(cut -d" " -f5 /proc/"$p"/stat); '
    'if [ "$g" -gt 1 ]; then kill -s KILL -- -"$g" 2>/dev/null; fi; '
    'kill -s KILL "$p" 2>/dev/null; fi; rm -f "$1"; }; '
    'if [ -d "$1" ]; then for f in "$1"/*.pid; do [ -e "$f" ] && k "$f"; done; '
    'elif [ -e "$1" ]; then k "$1"; fi; true')


@dataclass(frozen=True)
class SshConfig:
    """Where and as whom to connect, and which host keys to trust (stored in the journal,
    so a later vmtax can clean up in this one's stead)."""
    host: str
    port: int = 22
    user: str | None = None
    identity: str | None = None           # private key file; None: agent and ~/.ssh keys
    known_hosts: str = "~/.ssh/known_hosts"
    host_key_check: Literal["strict", "accept-new"] = "strict"
    jump: str | None = None               # [USER@]HOST[:PORT], same key and known_hosts
    sudo: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def where(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.host}:{self.port}"


def parse_spec(spec: str) -> tuple[str | None, str, int | None]:
    """"bench@10.0.0.2:2222" -> ("bench", "10.0.0.2", 2222); user and port optional."""
    user, _, rest = spec.rpartition("@")
    host, sep, port = rest.partition(":")
    return user or None, host, int(port) if sep else None


# -- the shared event loop ------------------------------------------------------------------

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _event_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="vmtax-ssh", daemon=True).start()
        return _loop


def call(coro: Coroutine[Any, Any, T]) -> T:
    """Run coro on the shared loop and wait for it; Ctrl-C cancels it."""
    future = asyncio.run_coroutine_threadsafe(coro, _event_loop())
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise


# -- errors in one line ---------------------------------------------------------------------

class ConnectionLost(TargetError):
    """The connection broke while a command ran."""


def _known_hosts_path(config: SshConfig) -> Path:
    return Path(config.known_hosts).expanduser()


def _is_known(config: SshConfig, host: str, port: int) -> bool:
    import asyncssh  # 0.2 s to import: only where a connection is made
    path = _known_hosts_path(config)
    if not path.exists():
        return False
    found = asyncssh.read_known_hosts(str(path)).match(host, "", port)
    return any(found[:2])   # trusted host keys or CA keys for it


def _explain(exc: BaseException, config: SshConfig, host: str, port: int) -> str:
    import asyncssh
    where = f"ssh {host}:{port}"
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        if not _is_known(config, host, port):
            return (f"{where}: host key unknown: it is not in {config.known_hosts}; add it "
                    "(ssh-keyscan) or set host_key_check = \"accept-new\" in the plan")
        return (f"{where}: host key verification failed: the key the server offers does not "
                f"match {config.known_hosts} (a different machine, or its key changed)")
    if isinstance(exc, asyncssh.PermissionDenied):
        who = config.user or "the current user"
        key = f"key {config.identity}" if config.identity else "the agent and ~/.ssh keys"
        return f"{where}: authentication failed for {who} with {key}"
    if isinstance(exc, ConnectionRefusedError):
        return f"{where}: connection refused (no sshd listening there?)"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return f"{where}: no answer within {CONNECT_TIMEOUT:.0f} s"
    if isinstance(exc, asyncssh.KeyImportError):
        return f"{where}: cannot read private key {config.identity}: {exc}"
    if isinstance(exc, OSError):
        return f"{where}: " + (f"{exc.filename}: " if exc.filename else "") + \
            str(exc.strerror or exc)
    return f"{where}: {exc}"


@dataclass
class Done:
    exit_code: int | None     # None: killed at the timeout, or the connection was lost
    stdout: str
    stderr: str
    elapsed: float
    timed_out: bool = False


class Session:
    """A connection to config's host, made on connect() and again after a loss."""

    def __init__(self, config: SshConfig):
        self.config = config
        self.conn: asyncssh.SSHClientConnection | None = None
        self._jump: asyncssh.SSHClientConnection | None = None

    # -- connecting -----------------------------------------------------------------------

    async def _open(self, host: str, port: int, user: str | None,
                    tunnel: asyncssh.SSHClientConnection | None) -> asyncssh.SSHClientConnection:
        import asyncssh
        config = self.config
        accept_new = config.host_key_check == "accept-new" and not _is_known(config, host, port)
        known: Any = None if accept_new else str(_known_hosts_path(config))
        if known is not None and not os.path.exists(known):
            raise TargetError(f"ssh {host}:{port}: the known hosts file {config.known_hosts} "
                              f"does not exist ({known}): add the host's key to it "
                              "(ssh-keyscan), name another (known_hosts) or set "
                              "host_key_check = \"accept-new\" in the plan")
        keys: dict[str, Any] = ({"client_keys": [os.path.expanduser(config.identity)],
                                 "agent_path": None} if config.identity else {})
        try:
            conn = await asyncio.wait_for(asyncssh.connect(
                host, port, username=user, known_hosts=known, tunnel=tunnel, config=None,
                keepalive_interval=KEEPALIVE_INTERVAL, keepalive_count_max=KEEPALIVE_COUNT,
                **keys), CONNECT_TIMEOUT)
        except (OSError, asyncssh.Error, asyncio.TimeoutError, ValueError) as exc:
            raise TargetError(_explain(exc, config, host, port)) from None
        if accept_new:
            # As OpenSSH's StrictHostKeyChecking=accept-new: trusted from now on, here too.
            key = conn.get_server_host_key()
            if key is not None:
                path = _known_hosts_path(config)
                name = host if port == 22 else f"[{host}]:{port}"
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "a") as f:
                    f.write(f"{name} {key.export_public_key('openssh').decode().strip()}\n")
        return conn

    async def _connect(self) -> None:
        config = self.config
        tunnel = None
        if config.jump:
            user, host, port = parse_spec(config.jump)
            tunnel = self._jump = await self._open(host, port or 22, user or config.user, None)
        self.conn = await self._open(config.host, config.port, config.user, tunnel)

    def connect(self) -> None:
        self.close()
        call(self._connect())

    def reconnect(self) -> None:
        """Connect again after a loss, waiting longer between attempts; raises the last
        attempt's TargetError when every attempt failed."""
        for i, wait in enumerate(BACKOFF):
            time.sleep(wait)
            try:
                self.connect()
                return
            except TargetError:
                if i == len(BACKOFF) - 1:
                    raise

    @property
    def connected(self) -> bool:
        return self.conn is not None and not self.conn.is_closed()

    def close(self) -> None:
        for conn in (self.conn, self._jump):
            if conn is not None:
                conn.close()
                with contextlib.suppress(Exception):
                    call(asyncio.wait_for(conn.wait_closed(), 5))
        self.conn = self._jump = None

    # -- commands -------------------------------------------------------------------------

    def command(self, argv: list[str]) -> str:
        """The remote command line: every element quoted, under sudo if configured."""
        return shlex.join((["sudo", "-n", "--"] if self.config.sudo else []) + argv)

    async def _run(self, argv: list[str], timeout: float | None,
                   on_timeout: list[str] | None, stdin: str | None) -> Done:
        import asyncssh
        if self.conn is None or self.conn.is_closed():
            raise ConnectionLost(f"ssh {self.config.where}: not connected")
        start = time.perf_counter()
        try:
            process = await self.conn.create_process(
                self.command(argv), stdin=asyncssh.DEVNULL if stdin is None else asyncssh.PIPE,
                encoding="utf-8", errors="replace")
            if stdin is not None:
                process.stdin.write(stdin)
                process.stdin.write_eof()
            waiting: Awaitable[asyncssh.SSHCompletedProcess] = process.wait(check=False)
            try:
                done = await asyncio.wait_for(waiting, timeout)
            except asyncio.TimeoutError:
                if on_timeout is not None:
                    await self._run(on_timeout, HOUSEKEEPING_TIMEOUT, None, None)
                process.close()
                return Done(None, "", "", time.perf_counter() - start, timed_out=True)
        except (OSError, asyncssh.Error) as exc:
            raise ConnectionLost(f"ssh {self.config.where}: connection lost: {exc}") from None
        elapsed = time.perf_counter() - start
        if done.exit_status is None and done.exit_signal is None:
            # The channel closed without an exit status: sshd or the link went away.
            raise ConnectionLost(f"ssh {self.config.where}: connection lost mid-command")
        code = done.exit_status if done.exit_status is not None else -1
        return Done(code, str(done.stdout or ""), str(done.stderr or ""), elapsed)

    def run(self, argv: list[str], timeout: float | None = HOUSEKEEPING_TIMEOUT,
            on_timeout: list[str] | None = None, stdin: str | None = None) -> Done:
        """Run argv on the remote to completion or the timeout (then run on_timeout, which
        kills it), stdin on its stdin (None: /dev/null). Raises ConnectionLost when the
        connection breaks."""
        return call(self._run(argv, timeout, on_timeout, stdin))

    def check(self, argv: list[str], what: str, stdin: str | None = None) -> str:
        """Run a command of vmtax's own; its stdout, or TargetError naming what failed."""
        done = self.run(argv, stdin=stdin)
        if done.exit_code != 0:
            detail = (done.stderr.strip() or done.stdout.strip()).splitlines()
            raise TargetError(f"ssh {self.config.where}: {what} failed"
                              + (f": {detail[-1]}" if detail else ""))
        return done.stdout

    @staticmethod
    def job_argv(argv: list[str], env: dict[str, str], cwd: str,
                 pid_file: str) -> tuple[list[str], str]:
        """argv as a job under the wrapper that records it for kill_jobs, and what to give
        it on stdin (run's stdin): env's values, which must never be in an argv."""
        bad = [k for k in env if not ENV_NAME.fullmatch(k)]
        if bad:
            raise TargetError(f"environment variable name {bad[0]!r}: expected letters, "
                              "digits and _ (not starting with a digit)")
        # Its first character once only: no occurrence of it can begin inside a value and
        # run on into the delimiter after it, so the first occurrence ends the value.
        delimiter = "@" + secrets.token_hex(8)
        while any(delimiter in v for v in env.values()):
            delimiter = "@" + secrets.token_hex(8)
        return (["sh", "-c", JOB_WRAPPER, "vmtax-job", pid_file, cwd, delimiter, " ".join(env),
                 *argv], "".join(v + delimiter for v in env.values()))

    @staticmethod
    def kill_argv(path: str) -> list[str]:
        """Kill the job of the pid file at path, or of every pid file in directory path."""
        return ["sh", "-c", KILL_JOBS, "vmtax-kill", path]

    def put(self, files: dict[str, Path]) -> None:
        """Copy host files to remote paths (absolute), making directories as needed."""
        call(self._put(files))

    async def _put(self, files: dict[str, Path]) -> None:
        import asyncssh
        assert self.conn is not None
        doing = "files"
        try:
            try:
                sftp = await self.conn.start_sftp_client()
            except asyncssh.ChannelOpenError:
                # No SFTP subsystem (dropbear, a minimal sshd): "Session request failed".
                await self._put_over_exec(files)
                return
            async with sftp:
                for remote in sorted({os.path.dirname(p) for p in files}):
                    await sftp.makedirs(remote, exist_ok=True)
                for remote, local in files.items():
                    doing = f"{local} to {remote}"
                    await sftp.put(str(local), remote, follow_symlinks=True)
                    await sftp.chmod(remote, 0o755)
        except (OSError, asyncssh.Error) as exc:
            raise TargetError(f"ssh {self.config.where}: copying {doing} failed: {exc}") from None

    async def _put_over_exec(self, files: dict[str, Path]) -> None:
        """put() where the server has no SFTP: each file on the stdin of `cat > PATH` in an
        exec channel, as the login user as SFTP would (no sudo). Paths are arguments of a
        fixed script, quoted, never part of it."""
        import asyncssh
        assert self.conn is not None
        directories = sorted({os.path.dirname(p) for p in files})
        steps: list[tuple[str, list[str], str | None]] = [
            (f"making {', '.join(directories)}", ["mkdir", "-p", "--", *directories], None)]
        steps += [(f"copying {local} to {remote}",
                   ["sh", "-c", 'cat > "$1" && chmod 755 "$1"', "vmtax-put", remote], str(local))
                  for remote, local in files.items()]
        for doing, argv, local in steps:
            done = await self.conn.run(shlex.join(argv), encoding=None, check=False,
                                       stdin=asyncssh.DEVNULL if local is None else local)
            if done.exit_status != 0:
                stderr = done.stderr or b""
                detail = (stderr.decode(errors="replace") if isinstance(stderr, bytes)
                          else stderr).strip().splitlines()
                raise TargetError(f"ssh {self.config.where}: {doing} over an exec channel "
                                  "(no SFTP subsystem) failed"
                                  + (f": {detail[-1]}" if detail else
                                     f" (exit status {done.exit_status})"))


# -- the journal's "remote" entries ---------------------------------------------------------

def journal_entry(config: SshConfig, path: str, jobs: bool) -> dict[str, Any]:
    """A journal entry undoing a remote directory vmtax made (and, jobs, the jobs whose pid
    files are in it)."""
    return {"type": "remote", "undo": undone_by(undo), "ssh": config.to_json(), "path": path,
            "jobs": jobs}


def remove(session: Session, path: str, jobs: bool) -> None:
    if jobs:
        session.check(session.kill_argv(path), "killing remote jobs")
    session.check(["rm", "-rf", "--", path], f"removing {path}")


def undo(_journal: Journal, entry: dict[str, Any]) -> None:
    """Undo a "remote" journal entry from another vmtax process (its owner died), over a
    new connection."""
    session = Session(SshConfig(**entry["ssh"]))
    try:
        session.connect()
        remove(session, entry["path"], entry["jobs"])
    finally:
        session.close()
