"""The job code of a target whose jobs are processes of this host (native, and targets like
it: the host's programs under `nice`, `taskset`, a wrapper of the user's): a scratch
directory on the host's disk, each job a process (`command(job)`: its argv, as run), and
servers for host-side clients on loopback. A kind subclasses LocalProcessTarget and says
only what differs; it is no plugin itself (it sets no `name`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import cast

from vmtax.core import plugin
from vmtax.core.errors import TargetError
from vmtax.core.target import LISTEN_ENV, MEMORY_DIR_ENV, Target, TargetContext
from vmtax.core.types import Endpoint, Job, JobResult
from vmtax.host import machine, network, proc

# Where a server on the host keeps its scratch files in memory: the first of these that is
# a tmpfs (or ramfs), as the server itself would pick.
MEMORY_DIRS = ("/dev/shm", "/tmp")


class LocalProcessTarget(Target):
    def __init__(self, name: str, options: plugin.Options, ctx: TargetContext):
        super().__init__(name, options, ctx)
        self.scratch: str | None = None
        self._token: int | None = None

    def command(self, job: Job) -> list[str]:
        """The argv that runs job here. Default: its own."""
        return job.argv

    def prepare(self) -> None:
        # fileio needs a directory on the host's disk (not tmpfs): under the work dir.
        self.scratch = tempfile.mkdtemp(prefix=f"{self.kind}-scratch-", dir=self.ctx.work_dir)
        self._token = self.ctx.journal.add(type="rmtree", path=self.scratch)

    def run(self, job: Job) -> JobResult:
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), **job.env}
        done = proc.run(self.command(job), timeout=job.timeout, env=env,
                        cwd=self.scratch if job.in_scratch else "/")
        return JobResult(done.exit_code, done.stdout, done.stderr, done.elapsed,
                         guest_elapsed=None, timed_out=done.timed_out)

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
        # The client is on this host: a server of the host listens on loopback only.
        memory, tokens = self._memory_dir()
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), **job.env,
               LISTEN_ENV: "127.0.0.1", **memory}
        cpus = self.cpus()
        try:
            with open(os.path.join(self.scratch or "/tmp", f"server-{port}.log"), "wb") as log:
                server = proc.spawn(self.command(job), env=env,
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
