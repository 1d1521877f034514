"""One long-lived container on a vmtax network, and everything it owns.

A `ContainerInstance` runs one command (a server, or an idle process that holds the
instance) in a container of its own, in a network namespace vmtax makes and joins to a
vmtax network (vmtax.host.network) by a veth pair, at the address that network assigns. It owns
the namespace, the veth, the container (the runtime's state and cgroups) and the process,
each journaled before it exists; `stop()` undoes them. The container target uses one per
server for host-side clients; the factory (vmtax.studies.factory) makes many.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from pathlib import Path

from vmtax.core.errors import TargetError
from vmtax.core.instance import Instance
from vmtax.core.runtime import Launch, Runtime
from vmtax.core.types import Job
from vmtax.host import proc
from vmtax.host.journal import Journal
from vmtax.host.network import Endpoint as NetEndpoint
from vmtax.host.network import Network

# How long a container may take from the runtime's start to its first process in the
# namespace (runc under load: well below a second).
START_TIMEOUT = 30.0


def pids_in_netns(path: str) -> list[int]:
    """The host's processes whose network namespace is the one at path."""
    try:
        inode = os.stat(path).st_ino
    except OSError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}/ns/net").st_ino == inode:
                    pids.append(int(entry))
    return pids


class ContainerInstance(Instance):
    """`job` in a container of its own, reachable at `address` on `net`."""

    def __init__(self, name: str, runtime: Runtime, job: Job, journal: Journal,
                 net: Network, log: Path):
        super().__init__(name)
        self.runtime = runtime
        self.job = job
        self.journal = journal
        self.net = net
        self.log = log
        self.netns: str | None = None         # the namespace's path
        self._netns_token: int | None = None
        self._veth: NetEndpoint | None = None
        self._launch: Launch | None = None
        self._container_tokens: tuple[int, int] | None = None   # (its cgroups, delete it)
        self._proc: subprocess.Popen[bytes] | None = None
        self._proc_token: int | None = None

    def _start(self) -> None:
        started = time.monotonic()
        name = f"{self.net.name}-c{uuid.uuid4().hex[:6]}"
        self._netns_token = self.journal.add(type="argv", argv=["ip", "netns", "delete", name])
        made = proc.run(["ip", "netns", "add", name], timeout=30)
        if made.exit_code != 0:
            raise TargetError(f"{self.name}: ip netns add failed: {made.stderr.strip()[:200]}")
        self.netns = f"/run/netns/{name}"
        self._veth = self.net.attach_veth(self.netns)
        self.address = self._veth.address
        self.client_preexec = self.net.client_preexec()
        # The runtime reads its launch's files (an OCI bundle) after it starts: the next
        # launch of the same runtime waits until this container runs.
        with self.runtime.launch_lock:
            self.runtime.netns = self.netns
            try:
                launch = self._launch = self.runtime.launch(self.job)
            finally:
                self.runtime.netns = None
            if launch.container is not None and launch.undo is not None:
                self._container_tokens = (
                    self.journal.add(type="rmdir", paths=launch.cgroups or []),
                    self.journal.add(type="argv", argv=launch.undo))
            with open(self.log, "wb") as log:
                self._proc = proc.spawn(launch.argv, preexec=launch.preexec, env=launch.env,
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            self._proc_token = self.journal.process(self._proc.pid)
            self._wait_running(started + START_TIMEOUT)
        self.boot_seconds = time.monotonic() - started

    def _wait_running(self, deadline: float) -> None:
        """Until the container's first process is in its namespace."""
        assert self.netns is not None and self._proc is not None
        while not pids_in_netns(self.netns):
            if self._proc.poll() is not None:
                raise TargetError(f"{self.name}: {self.job.argv[0]} ended at once (exit "
                                  f"status {self._proc.returncode}): {self._log_tail()}")
            if time.monotonic() > deadline:
                raise TargetError(f"{self.name}: no process in the container after "
                                  f"{START_TIMEOUT:g} s")
            time.sleep(0.01)

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-3:])
        return ""

    def stop(self) -> None:
        if self._proc is not None:
            proc.kill_group(self._proc, grace=2.0)
            self._proc = None
        if self._proc_token is not None:
            self.journal.forget(self._proc_token)
            self._proc_token = None
        if self._container_tokens is not None and self._launch is not None:
            rmdir, delete = self._container_tokens
            # The runtime's own removal first; the journaled delete only if that failed.
            if self.runtime.finish(self._launch):
                self.journal.forget(delete)
            else:
                self.journal.undo(delete)
            with contextlib.suppress(OSError):   # still busy: stays journaled, retried later
                self.journal.undo(rmdir)
            self._container_tokens = None
        self._launch = None
        if self._veth is not None:
            self.net.detach(self._veth)
            self._veth = None
        if self._netns_token is not None:
            self.journal.undo(self._netns_token)
            self._netns_token = None
        self.netns = self.address = self.client_preexec = None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def host_pids(self) -> list[int]:
        return pids_in_netns(self.netns) if self.netns else []
