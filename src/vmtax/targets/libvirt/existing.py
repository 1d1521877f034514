"""A running domain of the user's (`libvirt:NAME`), measured as it is: its definition read,
jobs run through the QEMU guest agent (guest-exec) or over SSH, in a scratch directory
vmtax makes in the guest and removes after (journaled: the undo removes it through the
agent, also after kill -9), with the host's own programs shipped into it; the domain is
never defined, started, suspended or changed.
"""

from __future__ import annotations

import base64
import json
import os
import posixpath
import secrets
import time
from typing import Any

from vmtax.core.errors import TargetError, VmtaxError
from vmtax.core.types import Job, JobResult
from vmtax.guest import remote_bundle
from vmtax.host import ssh_session
from vmtax.host.journal import Journal
from vmtax.targets.libvirt.virsh import (
    RUN_DIR,
    Virsh,
    journal_guest_dir,
    journal_guest_file,
    one_line,
)

GUEST_AGENT_PORT = "org.qemu.guest_agent.0"
GUEST_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# How often a running job's status is asked for: its end is seen this late at most.
POLL_SECONDS = 0.05
# Bytes of the programs' archive per guest-file-write: its base64 rides in one argv word of virsh,
# which Linux caps at 128 KiB (MAX_ARG_STRLEN).
FILE_CHUNK = 64 << 10
# $0 the working directory, then the job's argv.
_IN_DIR = 'cd "$0" && exec "$@"'


class ExistingDomain:
    """A running domain of the user's, measured as it is: vmtax reads its definition and
    runs jobs through the QEMU guest agent (guest-exec), or over SSH when `ssh` says how to
    reach the guest, in a scratch directory it makes under `workdir` in the guest and
    removes after, with the host's own programs shipped into it either way (the same bundle
    as the ssh target's); it never defines, starts, suspends or changes the domain."""

    def __init__(self, name: str, domain: str, virsh: Virsh, journal: Journal,
                 workdir: str, ssh: ssh_session.SshConfig | None = None):
        self.name = name
        self.domain = domain
        self.virsh = virsh
        self.journal = journal
        self.workdir = workdir
        self.xml: str | None = None
        self.pid: int | None = None
        self.scratch: str | None = None
        self._token: int | None = None
        # The host's programs in the guest (the guest agent's path; SshJobs keeps its own).
        self.bundle: remote_bundle.Bundle | None = None
        self.bundle_dir = ""
        self.ssh = SshJobs(name, ssh, journal, workdir) if ssh is not None else None

    @property
    def transport(self) -> str:
        return "ssh" if self.ssh is not None else "qemu-guest-agent"

    # -- setup --

    def open(self, programs: tuple[str, ...]) -> None:
        state = self.virsh.call("domstate", self.domain)
        if state.timed_out:
            raise VmtaxError(f"{self.name}: libvirt at {self.virsh.uri} did not answer within "
                             f"{self.virsh.timeout:g} s")
        if state.exit_code != 0:
            raise VmtaxError(f"{self.name}: no domain {self.domain!r} at {self.virsh.uri} "
                             f"(`virsh -c {self.virsh.uri} list --all` lists them): "
                             + one_line(state.stderr))
        if state.stdout.strip() != "running":
            raise VmtaxError(f"{self.name}: domain {self.domain!r} is {state.stdout.strip()}; "
                             f"start it first (virsh start {self.domain}): vmtax measures "
                             "a domain of yours as it finds it")
        self.xml = self.virsh.must("dumpxml", self.domain, what=self.name)
        self.pid = self._qemu_pid()
        if self.ssh is not None:
            self.ssh.open(programs)
            self.scratch = self.ssh.scratch
            return
        if f"name='{GUEST_AGENT_PORT}'" not in self.xml:
            raise VmtaxError(f"{self.name}: domain {self.domain!r} has no QEMU guest agent "
                             f"channel ({GUEST_AGENT_PORT}) and no ssh details: give its "
                             "guest's host (and identity) to reach it over SSH")
        try:
            self.agent("guest-ping")
        except VmtaxError as exc:
            raise VmtaxError(f"{self.name}: the QEMU guest agent of {self.domain!r} does not "
                             f"answer (is qemu-guest-agent running in the guest?): {exc}") \
                from None
        bundle = remote_bundle.make(programs)
        remote_bundle.check_arch(self._must(["uname", "-m"], "asking its machine type"),
                                 f"{self.name} (domain {self.domain!r})")
        scratch = f"{self.workdir.rstrip('/')}/.vmtax-{secrets.token_hex(6)}"
        self._token = journal_guest_dir(self.journal, self.virsh.uri, self.domain,
                                                scratch)
        self._must(["mkdir", "-p", "--", scratch], f"making {scratch}")
        self.scratch = scratch
        self._ship(bundle, posixpath.join(scratch, "bundle"))

    def _must(self, argv: list[str], what: str) -> str:
        done = self.exec(argv, "/", 60)
        if not done.ok:
            raise TargetError(f"{self.name}: {what} in the guest of {self.domain!r} failed: "
                              f"{(done.stderr.strip() or done.stdout.strip())[-200:]}")
        return done.stdout

    def _ship(self, bundle: remote_bundle.Bundle, root: str) -> None:
        """The host's own programs into root (vmtax.guest.remote_bundle): one compressed
        archive written through guest-file-* (a fifth of the bytes or less; each write is a
        virsh call), unpacked by the guest's tar and checked by their sums there; removed
        with the scratch directory they are in."""
        archive = f"{root}.tgz"
        self._must(["mkdir", "-p", "--", root], f"making {root}")
        try:
            self._write(archive, remote_bundle.archive(bundle))
        except VmtaxError as exc:
            raise TargetError(f"{self.name}: copying the host's programs into the guest of "
                              f"{self.domain!r} through its guest agent failed (does its "
                              f"qemu-ga allow guest-file-*? else give ssh details): {exc}") \
                from None
        self._must(["sh", "-c", 'tar -xzf "$0" -C "$1" && rm -f -- "$0"', archive, root],
                   "unpacking the host's programs (tar with gzip)")
        if not self.exec(remote_bundle.check_argv(bundle, root), "/", 120).ok:
            raise TargetError(f"{self.name}: the programs copied into {root} in the guest of "
                              f"{self.domain!r} do not match their checksums")
        self.bundle, self.bundle_dir = bundle, root

    def _write(self, path: str, data: bytes) -> None:
        handle = self.agent("guest-file-open", path=path, mode="w")
        token = journal_guest_file(self.journal, self.virsh.uri, self.domain, handle)
        try:
            for at in range(0, len(data), FILE_CHUNK):
                chunk = data[at:at + FILE_CHUNK]
                arguments: dict[str, Any] = {"buf-b64": base64.b64encode(chunk).decode()}
                wrote = self.agent("guest-file-write", handle=handle, **arguments)
                if wrote.get("count") != len(chunk):
                    raise VmtaxError(f"{path}: {wrote.get('count')} of {len(chunk)} "
                                     "bytes written")
        finally:
            self.agent("guest-file-close", handle=handle)
            self.journal.forget(token)

    def _qemu_pid(self) -> int | None:
        try:
            return int((RUN_DIR / "qemu" / f"{self.domain}.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None   # a remote URI's, or a session daemon's

    # -- the guest agent --

    def agent(self, command: str, timeout: float = 30.0, **arguments: Any) -> Any:
        """One guest agent command's "return" value; VmtaxError in one line if it fails."""
        request: dict[str, Any] = {"execute": command}
        if arguments:
            request["arguments"] = arguments
        out = self.virsh.must("qemu-agent-command", self.domain, json.dumps(request),
                              what=f"{self.name}: {command}", timeout=timeout)
        return json.loads(out)["return"]

    def exec(self, argv: list[str], cwd: str, timeout: float,
             env: dict[str, str] | None = None) -> JobResult:
        """argv in the guest (guest-exec) in cwd, to its end or its timeout (then killed)."""
        start = time.perf_counter()
        pid = self.agent("guest-exec", path="/bin/sh", arg=["-c", _IN_DIR, cwd, *argv],
                         env=[GUEST_PATH, *(f"{k}={v}" for k, v in (env or {}).items())],
                         **{"capture-output": True})["pid"]
        deadline = time.monotonic() + timeout
        while not (status := self.agent("guest-exec-status", pid=pid)).get("exited"):
            if time.monotonic() > deadline:
                self.agent("guest-exec", path="kill", arg=["-9", str(pid)])
                return JobResult(None, "", f"killed at its timeout ({timeout:g} s)",
                                 time.perf_counter() - start, timed_out=True)
            time.sleep(POLL_SECONDS)
        elapsed = time.perf_counter() - start

        def text(key: str) -> str:
            return base64.b64decode(status.get(key, "")).decode(errors="replace")
        code = status.get("exitcode")
        if code is None and "signal" in status:
            code = 128 + int(status["signal"])
        return JobResult(code, text("out-data"), text("err-data"), elapsed)

    def run(self, job: Job) -> JobResult:
        if self.scratch is None:
            raise TargetError(f"{self.name}: not prepared")
        short = self._short_of_space(job)
        if short:
            return JobResult(None, "", short, 0.0)
        if self.ssh is not None:
            return self.ssh.run(job)
        try:
            argv = self.bundle.argv(self.bundle_dir, job.argv) if self.bundle else job.argv
            return self.exec(argv, self.scratch if job.in_scratch else "/", job.timeout,
                             job.env)
        except VmtaxError as exc:   # the agent went away mid-job
            return JobResult(None, "", str(exc), 0.0)

    def _short_of_space(self, job: Job) -> str | None:
        """Why the guest's workdir cannot take what the job writes there (None: it can)."""
        if not job.scratch_bytes or not job.in_scratch:
            return None
        df = Job(["df", "-Pk", "--", str(self.scratch)], timeout=30)
        done = self.ssh.run(df) if self.ssh is not None else self.exec(df.argv, "/", 30)
        lines = done.stdout.strip().splitlines()
        fields = lines[-1].split() if done.ok and len(lines) > 1 else []
        if len(fields) < 4 or not fields[3].isdigit():
            return None   # no df to ask: the job finds out itself
        free = int(fields[3]) << 10
        if free >= job.scratch_bytes:
            return None
        return (f"{self.name}: {job.scratch_bytes / (1 << 30):.1f} GiB must be free in "
                f"workdir = {self.workdir!r} in the guest of {self.domain!r}, which has "
                f"{free / (1 << 30):.1f} GiB; free some, or give workdir a directory with room")

    # -- state --

    def alive(self) -> bool:
        if self.pid is None:
            return self.scratch is not None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def host_pids(self) -> list[int]:
        return [self.pid] if self.pid is not None and self.alive() else []

    def close(self) -> None:
        if self.ssh is not None:
            self.ssh.close()
        if self._token is not None:
            self.journal.undo(self._token)   # rm -rf of the scratch directory, in the guest
        self._token = self.scratch = self.bundle = None


class SshJobs:
    """Jobs in an existing domain's guest over SSH (vmtax.host.ssh_session), as the ssh
    target runs them: the host's own programs shipped as a bundle (vmtax.guest.remote_bundle),
    each job in a scratch directory under `workdir`, both journaled and removed after."""

    def __init__(self, name: str, config: ssh_session.SshConfig, journal: Journal,
                 workdir: str):
        self.name = name
        self.config = config
        self.journal = journal
        self.workdir = workdir
        self.session = ssh_session.Session(config)
        self.bundle: remote_bundle.Bundle | None = None
        self.bundle_dir: str | None = None
        self.scratch: str | None = None
        self._token: int | None = None

    def open(self, programs: tuple[str, ...]) -> None:
        self.bundle = remote_bundle.make(programs)
        self.session.connect()
        machine = self.session.check(["uname", "-m"], "asking the guest's machine type")
        remote_bundle.check_arch(machine, f"{self.name} (ssh {self.config.where})")
        scratch = f"{self.workdir.rstrip('/')}/.vmtax-{secrets.token_hex(6)}"
        self._token = self.journal.add(**ssh_session.journal_entry(self.config, scratch, True))
        self.session.check(["mkdir", "-p", "--", scratch], f"making {scratch}")
        self.scratch = scratch
        self.bundle_dir = remote_bundle.install(self.session, self.bundle, self.workdir,
                                                self.journal)

    def run(self, job: Job) -> JobResult:
        if self.scratch is None or self.bundle is None:
            return JobResult(None, "", f"{self.name}: not prepared", 0.0)
        argv, stdin = self.session.job_argv(self.bundle.argv(str(self.bundle_dir), job.argv),
                                            job.env, self.scratch if job.in_scratch else "/",
                                            f"{self.scratch}/job.pid")
        try:
            done = self.session.run(argv, timeout=job.timeout,
                                    on_timeout=self.session.kill_argv(self.scratch), stdin=stdin)
        except ssh_session.ConnectionLost as exc:
            return JobResult(None, "", str(exc), 0.0)
        return JobResult(done.exit_code, done.stdout, done.stderr, done.elapsed,
                         timed_out=done.timed_out)

    def close(self) -> None:
        try:
            if self.scratch is not None and self._token is not None:
                if not self.session.connected:
                    self.session.connect()
                ssh_session.remove(self.session, self.scratch, jobs=True)
                self.journal.forget(self._token)
        except TargetError:
            pass   # left in the journal, whose undo tries again over a new connection
        finally:
            if self.bundle is not None and self.bundle_dir is not None:
                remote_bundle.release(self.session, self.bundle, self.workdir, self.journal)
            self.scratch = self.bundle_dir = None
            self._token = None
            self.session.close()
