"""The bare host: the baseline every other target is compared with."""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from typing import Any

from vmtax import plugin, proc
from vmtax.targets.base import Target, TargetContext
from vmtax.types import Job, JobResult


class NativeTarget(Target):
    name = "native"
    description = "The bare host: the baseline every other target is compared with"
    bare_host = True

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

    def cleanup(self) -> None:
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None
        if self._token is not None:
            self.ctx.journal.forget(self._token)
            self._token = None

    def fingerprint(self) -> dict[str, Any]:
        return {"kind": self.kind, "bare_host": True, "kernel": platform.release()}
