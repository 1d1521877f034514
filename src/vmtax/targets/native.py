"""The bare host: the baseline every other target is compared with."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, cast

from vmtax.core import plugin
from vmtax.core.errors import TargetError
from vmtax.core.target import LISTEN_ENV, MEMORY_DIR_ENV, Target, TargetContext
from vmtax.core.types import Endpoint, Job, JobResult
from vmtax.host import machine, network, proc

# Where a server on the host keeps its scratch files in memory: the first of these that is
# a tmpfs (or ramfs), as the server itself would pick.
MEMORY_DIRS = ("/dev/shm", "/tmp")


class NativeTarget(Target):
    name = "native"
    description = "The bare host: the baseline every other target is compared with"
    bare_host = True
    shares_host_page_cache = True

    def __init__(self, name: str, options: plugin.Options, ctx: TargetContext):
        super().__init__(name, options, ctx)
        self.scratch: str | None = None
        self._token: int | None = None

    def prepare(self) -> None:
        # fileio needs a directory on the host's disk (not tmpfs): under the work dir.
        self.scratch = tempfile.mkdtemp(prefix="native-scratch-", dir=self.ctx.work_dir)
        self._token = self.ctx.journal.add(type="rmtree", path=self.scratch)

    def run(self, job: Job) -> JobResult:
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), **job.env}
        done = proc.run(job.argv, timeout=job.timeout, env=env,
                        cwd=self.scratch if job.in_scratch else "/")
        return JobResult(done.exit_code, done.stdout, done.stderr, done.elapsed,
                         guest_elapsed=None, timed_out=done.timed_out)

    def cpus(self) -> set[int] | None:
        # A server on the host gets the last CPU, so a client on the host can have the
        # others (with 2 cores: server on CPU 1, client on CPU 0).
        usable = sorted(os.sched_getaffinity(0))
        return {usable[-1]} if len(usable) > 1 else None

    def _memory_dir(self) -> tuple[dict[str, str], list[int]]:
        """A directory of the server's own in the host's memory, journaled before it is
        made (a server killed with vmtax cannot remove its own): its environment variable
        and journal token; none where the host has no tmpfs to offer."""
        for parent in MEMORY_DIRS:
            if machine.fs_type(parent) in ("tmpfs", "ramfs"):
                path, token = self.ctx.journal.make_dir(Path(parent), "vmtax-serve-")
                return {MEMORY_DIR_ENV: str(path)}, [token]
        return {}, []

    def start_server(self, job: Job, port: int) -> Endpoint:
        # The client is on this host: a server of the bare host listens on loopback only.
        memory, tokens = self._memory_dir()
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), **job.env,
               LISTEN_ENV: "127.0.0.1", **memory}
        cpus = self.cpus()
        try:
            with open(os.path.join(self.scratch or "/tmp", f"server-{port}.log"), "wb") as log:
                server = proc.spawn(job.argv, env=env,
                                    cwd=self.scratch if job.in_scratch else "/",
                                    preexec=(lambda: os.sched_setaffinity(0, cpus))
                                    if cpus else None,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        except BaseException:
            for token in tokens:
                self.ctx.journal.undo(token)
            raise
        # Undone newest first: the server, then its directory.
        tokens.append(self.ctx.journal.process(server.pid))
        endpoint = Endpoint("127.0.0.1", port, [server.pid], handle=(server, tokens),
                            listening=True)
        if not network.wait_tcp_listening(lambda: [server.pid], port, job.timeout,
                                          lambda: server.poll() is None):
            self.stop_server(endpoint)
            raise TargetError(f"{self.name}: {job.argv[0]} does not listen on port {port} "
                              f"after {job.timeout:g} s")
        return endpoint

    def stop_server(self, endpoint: Endpoint) -> None:
        server, tokens = cast("tuple[subprocess.Popen[bytes], list[int]]", endpoint.handle)
        proc.kill_group(server, grace=2.0)
        self.ctx.journal.forget(tokens[-1])
        for token in tokens[:-1]:    # its memory directory, once it is gone
            self.ctx.journal.undo(token)

    def cleanup(self) -> None:
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None
        if self._token is not None:
            self.ctx.journal.forget(self._token)
            self._token = None

    def fingerprint(self) -> dict[str, Any]:
        return {"kind": self.kind, "bare_host": True, "kernel": platform.release()}
