"""The host half of the guest agent's protocol (the guest half is src/vmtax/guest/agent).

The host sends one line per job over the virtio-serial channel:

    JOB <id> <timeout> <in_scratch> <n_env> <env tokens> <argv tokens>

where each token is `p:TEXT` (plain: no character the guest shell would split or expand) or
`b:BASE64`. The agent answers `RESULT <id> <status> <timed_out> <elapsed_ns> <n_out> <n_err>`
followed by exactly n_out bytes of stdout and n_err of stderr. An answer to an older job
(one the host gave up on) is skipped whole, so a late answer never passes for a new one.
"""

from __future__ import annotations

import base64
import re
import select
import socket
import time
from dataclasses import dataclass
from typing import Callable

from vmtax.core.errors import TargetError, VmtaxError
from vmtax.core.types import Job

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Tokens made only of these characters reach the guest shell unencoded: it never splits
# them (no whitespace) or expands them (no quotes, $, globs, backslashes).
_PLAIN = re.compile(r"[A-Za-z0-9_./=:,+-]+")


def encode_token(text: str) -> str:
    if _PLAIN.fullmatch(text):
        return "p:" + text
    return "b:" + base64.b64encode(text.encode()).decode()


def encode_job(job_id: int, job: Job) -> bytes:
    """One line: JOB <id> <timeout> <scratch> <n_env> <env tokens> <argv tokens>."""
    if not job.argv:
        raise VmtaxError("a job needs a command")
    for name in job.env:
        if not _ENV_NAME.fullmatch(name):
            raise VmtaxError(f"bad environment variable name {name!r}")
    tokens = [encode_token(f"{k}={v}") for k, v in job.env.items()]
    tokens += [encode_token(a) for a in job.argv]
    timeout = max(job.timeout, 0.001)
    return (f"JOB {job_id} {timeout:.3f} {int(job.in_scratch)} {len(job.env)} "
            + " ".join(tokens) + "\n").encode()


@dataclass
class AgentResult:
    exit_code: int
    timed_out: bool
    elapsed_ns: int
    stdout: bytes
    stderr: bytes


class Channel:
    """Buffered, deadline-bound reads from the agent socket. `check` is called while
    waiting, to give up early when QEMU is gone."""

    def __init__(self, sock: socket.socket, check: Callable[[], None] | None = None):
        self.sock = sock
        self.check = check
        self.buf = bytearray()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> None:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no answer from the guest agent")
            ready, _, _ = select.select([self.sock], [], [], min(remaining, 0.2))
            if ready:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise EOFError("the guest agent closed its channel")
                self.buf += data
                return
            if self.check is not None:
                self.check()

    def readline(self, deadline: float) -> bytes:
        while (end := self.buf.find(b"\n")) < 0:
            self._fill(deadline)
        line = bytes(self.buf[:end])
        del self.buf[:end + 1]
        return line

    def read_exact(self, n: int, deadline: float) -> bytes:
        while len(self.buf) < n:
            self._fill(deadline)
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data


def read_result(channel: Channel, job_id: int, deadline: float) -> AgentResult:
    """The agent's answer to job_id: a RESULT header, then exactly the announced bytes."""
    while True:
        line = channel.readline(deadline).decode(errors="replace")
        fields = line.split()
        if len(fields) != 7 or fields[0] != "RESULT":
            raise TargetError(f"guest agent protocol error: unexpected line {line[:200]!r}")
        rid, status, timed_out, elapsed, n_out, n_err = (int(f) for f in fields[1:])
        stdout = channel.read_exact(n_out, deadline)
        stderr = channel.read_exact(n_err, deadline)
        if rid == job_id:   # an older job's late answer is skipped whole
            return AgentResult(status, timed_out == 1, elapsed, stdout, stderr)
