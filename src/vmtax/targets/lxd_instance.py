"""One system container made by vmtax, by LXD or by plain LXC, and everything it owns.

A system container boots its own init (busybox's, idle: vmtax.targets.lxd's inittab) in a
network namespace with loopback only. When it must be reachable it is joined to a vmtax
network (vmtax.host.network) by a veth pair made into that namespace, at the address the
network assigns, exactly as a container target's server is. Jobs run in it one at a time
(`run`); a server runs detached in it (`serve`) until `end`, or for the instance's lifetime
when it is given at start (a density instance's nginx). `stop()` removes the veth, then the
container with every process in it.

- `LxdInstance`: launched by the LXD daemon from vmtax's image with the target's profile;
  jobs through LXD's REST API (vmtax.helpers.lxd_api), with no client on the host.
- `LxcInstance`: started by `lxc-start` from a config file vmtax writes, on a copy of the
  rootfs of its own (shifted to the user namespace's ids when unprivileged); jobs through
  `lxc-attach`, the environment passed as the attaching process's own (--keep-env), never
  in its argv. LXC's monitor is the only host process that stays; no daemon.
"""

from __future__ import annotations

import abc
import contextlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from vmtax.core.errors import TargetError
from vmtax.core.instance import Instance
from vmtax.core.runtime import container_env, job_cwd
from vmtax.core.types import Job, JobResult
from vmtax.helpers import lxd_api
from vmtax.host import proc
from vmtax.host.journal import Journal, undone_by
from vmtax.host.network import Endpoint as NetEndpoint
from vmtax.host.network import Network

# A server asked to end: SIGTERM to every process but init, SIGKILL after this long.
STOP_GRACE = 5.0
# LXC's command timeouts: starting a container, attaching to it, stopping it.
LXC_TIMEOUT = 60.0
# The ids an unprivileged container's root and its users have on the host (LXD's default
# map, and /etc/subuid's root range here).
ID_BASE, ID_COUNT = 100000, 65536


def _ns(pid: int, kind: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def oom_killed(cgroup: str, kmsg: str = "/dev/kmsg") -> list[str]:
    """The processes the kernel's OOM killer killed for want of memory in cgroup, by the
    kernel's log ("lxd (pid 5118)"); none where that log cannot be read."""
    pattern = re.compile(rf"oom_memcg={re.escape(cgroup)},.*?task=([^,]*),pid=(\d+)")
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    found = []
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode(errors="replace")
            except BlockingIOError:   # read to its end
                break
            except OSError:           # a record overwritten while it was read: the next
                continue
            if not record:
                break
            found += [f"{m[1]} (pid {m[2]})" for m in pattern.finditer(record)]
    finally:
        os.close(fd)
    return found


def _last_words(exit_code: Any, out: str, err: str) -> str:
    lines = (err or out).strip().splitlines()
    return f"exit status {exit_code}" + (f": {lines[-1][:200]}" if lines else "")


class SystemContainer(Instance):
    """What an LXD and an LXC container share: init, loopback, the veth, the processes."""

    def __init__(self, name: str, journal: Journal, net: Network | None, job: Job | None):
        super().__init__(name)
        self.journal = journal
        self.net = net
        self.job = job
        self.init_pid = 0
        self._veth: NetEndpoint | None = None
        self._job_handle: str | None = None

    def _start(self) -> None:
        started = time.monotonic()
        self.init_pid = self._launch()
        if not self.init_pid:
            raise TargetError(f"{self.name}: its container started without an init")
        up = proc.run(["nsenter", f"--net=/proc/{self.init_pid}/ns/net", "ip", "link",
                       "set", "lo", "up"], timeout=30)
        if up.exit_code != 0:
            raise TargetError(f"{self.name}: cannot bring up its loopback: "
                              f"{up.stderr.strip()[-200:]}")
        if self.net is not None:
            self.attach(self.net)
        if self.job is not None:
            self._job_handle = self.serve(self.job)
        self.boot_seconds = time.monotonic() - started

    def attach(self, net: Network) -> None:
        """Join `net` by a veth pair into the container's network namespace (once)."""
        if self._veth is not None:
            return
        self.net = net
        self._veth = net.attach_veth(self.init_pid)
        self.address = self._veth.address
        self.client_preexec = net.client_preexec()

    def stop(self) -> None:
        if self._veth is not None and self.net is not None:
            self.net.detach(self._veth)
        self._veth = None
        self._remove()
        self._job_handle = None
        self.init_pid = 0
        self.address = self.client_preexec = None

    def alive(self) -> bool:
        if not self.init_pid or _ns(self.init_pid, "pid") is None:
            return False
        return self._job_handle is None or self.serving(self._job_handle)

    def host_pids(self) -> list[int]:
        """The container's processes (those in its pid namespace) and its monitor, the
        host process that holds it (`[lxc monitor]`): what one more instance costs."""
        inode = _ns(self.init_pid, "pid") if self.init_pid else None
        if inode is None:
            return []
        pids = [int(entry) for entry in os.listdir("/proc")
                if entry.isdigit() and _ns(int(entry), "pid") == inode]
        monitor = _parent(self.init_pid)
        return pids + ([monitor] if monitor and monitor not in pids else [])

    @abc.abstractmethod
    def _launch(self) -> int:
        """Make and start the container (journaled first); its init's host pid."""

    @abc.abstractmethod
    def _remove(self) -> None:
        """Remove the container with every process in it, if made; idempotent."""

    @abc.abstractmethod
    def run(self, job: Job) -> JobResult:
        """Run job to its end or its timeout; at the timeout every process of the
        container but its init is killed (one job at a time, no server meanwhile)."""

    @abc.abstractmethod
    def serve(self, job: Job) -> str:
        """Start job detached; a handle for `serving` and `end`."""

    @abc.abstractmethod
    def serving(self, handle: str) -> bool:
        """Whether a detached job still runs."""

    @abc.abstractmethod
    def end(self, handle: str) -> str:
        """End a detached job (SIGTERM, then SIGKILL, to every process but init); how it
        ended, with its last line. Idempotent."""


class LxdInstance(SystemContainer):
    """A container `lxd_name` of image `image` with profile `profile`."""

    def __init__(self, name: str, lxd_name: str, client: lxd_api.Lxd, journal: Journal,
                 image: str, profile: str, net: Network | None = None,
                 job: Job | None = None):
        super().__init__(name, journal, net, job)
        self.lxd_name = lxd_name
        self.client = client
        self.image = image
        self.profile = profile
        self._token: int | None = None

    def _launch(self) -> int:
        self._token = lxd_api.journaled(self.journal, "lxd instance", self.lxd_name,
                                        self.client)
        self.client.do("POST", "/1.0/instances", {
            "name": self.lxd_name, "type": "container", "profiles": [self.profile],
            "source": {"type": "image", "alias": self.image},
            # Never started again by a restarted daemon: vmtax's instances are its own.
            "config": {"boot.autostart": "false"}})
        try:
            self.client.start(self.lxd_name)
        except lxd_api.LxdError as exc:
            # Neither LXD nor LXC says that a process starting the container ran out of
            # memory in it (`memory = "1K"`); the kernel's log does.
            killed = oom_killed(f"/lxc.payload.{self.lxd_name}")
            raise TargetError(f"{self.name}: {exc}" + (
                f"; the kernel's OOM killer killed {', '.join(killed)} in the container's "
                "memory cgroup: its memory limit is too small" if killed else "")) from None
        return self.client.init_pid(self.lxd_name)

    def _remove(self) -> None:
        if self._token is not None:   # stays journaled if LXD cannot delete it yet
            self.journal.undo(self._token)
            self._token = None

    def run(self, job: Job) -> JobResult:
        done = self.client.exec(self.lxd_name, job.argv, container_env(job), job_cwd(job),
                                job.timeout)
        return JobResult(done.exit_code, done.stdout, done.stderr, host_elapsed=done.elapsed,
                         timed_out=done.timed_out)

    def serve(self, job: Job) -> str:
        return self.client.start_exec(self.lxd_name, job.argv, container_env(job),
                                      job_cwd(job))

    def serving(self, handle: str) -> bool:
        with contextlib.suppress(lxd_api.LxdError):
            op = self.client.call("GET", handle).get("metadata") or {}
            return op.get("status") == "Running"
        return False

    def end(self, handle: str) -> str:
        for signal in ("TERM", "KILL"):
            if self.serving(handle):
                self.client.kill_all(self.lxd_name, signal)
            try:
                done = self.client.wait(handle, STOP_GRACE)
            except lxd_api.LxdError as exc:   # failed, or forgotten by LXD: gone either way
                return str(exc)
            if done is not None:
                out, err = self.client.output(done)
                return _last_words(done.get("return"), out, err)
        return "survived SIGKILL"


def stop_lxc(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo an LXC container vmtax started: `lxc-stop -k` kills its init, and with it every
    process of its pid namespace, and its monitor exits."""
    name, path = entry.get("name"), entry.get("lxcpath")
    if (not isinstance(name, str) or not name.startswith(lxd_api.PREFIX)
            or not isinstance(path, str) or not Path(path).name.startswith(lxd_api.PREFIX)):
        raise ValueError(f"LXC container {name!r} in {path!r} is not one vmtax starts")
    proc.run(["lxc-stop", "--kill", "-n", name, "-P", path], timeout=LXC_TIMEOUT)


class LxcInstance(SystemContainer):
    """A plain LXC container `lxc_name` under `lxcpath`, on a copy of `source` (vmtax's
    rootfs with its inittab), configured by `config` lines (the target's limits, mounts)."""

    def __init__(self, name: str, lxc_name: str, lxcpath: Path, source: Path, inittab: str,
                 config: list[str], privileged: bool, journal: Journal,
                 net: Network | None = None, job: Job | None = None):
        super().__init__(name, journal, net, job)
        self.lxc_name = lxc_name
        self.lxcpath = lxcpath
        self.source = source
        self.inittab = inittab
        self.config = config
        self.privileged = privileged
        self.dir = lxcpath / lxc_name
        self._tokens: list[int] = []     # its directory, then the running container
        self._servers: dict[str, tuple[subprocess.Popen[bytes], int, Path]] = {}

    def _launch(self) -> int:
        self._tokens.append(self.journal.add(type="rmtree", path=str(self.dir)))
        self.dir.mkdir(mode=0o711)
        root = self.dir / "rootfs"
        shutil.copytree(self.source, root, symlinks=True,
                        ignore=shutil.ignore_patterns(".complete"))
        (root / "etc/inittab").write_text(self.inittab)
        if not self.privileged:
            _shift_ids(root)
        (self.dir / "config").write_text("\n".join([
            f"lxc.uts.name = {self.lxc_name}", f"lxc.rootfs.path = dir:{root}",
            *self.config, *([] if self.privileged else [
                f"lxc.idmap = u 0 {ID_BASE} {ID_COUNT}",
                f"lxc.idmap = g 0 {ID_BASE} {ID_COUNT}"])]) + "\n")
        self._tokens.append(self.journal.add(type="lxc container", undo=undone_by(stop_lxc),
                                             name=self.lxc_name, lxcpath=str(self.lxcpath)))
        started = proc.run(["lxc-start", "-n", self.lxc_name, "-P", str(self.lxcpath),
                            "-f", str(self.dir / "config"), "--daemon",
                            "-o", str(self.dir / "lxc.log"), "-l", "WARN"],
                           timeout=LXC_TIMEOUT)
        if started.exit_code != 0:
            raise TargetError(f"{self.name}: lxc-start failed: {self._log_tail()}")
        info = proc.run(["lxc-info", "-n", self.lxc_name, "-P", str(self.lxcpath), "-p", "-H"],
                        timeout=LXC_TIMEOUT)
        return int(info.stdout.strip() or 0) if info.stdout.strip().isdigit() else 0

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            lines = (self.dir / "lxc.log").read_text(errors="replace").strip().splitlines()
            return " | ".join(line.split(" - ")[-1] for line in lines[-2:])
        return "no log"

    def _remove(self) -> None:
        for handle in list(self._servers):
            self.end(handle)
        for token in reversed(self._tokens):   # the container, then its directory
            self.journal.undo(token)
        self._tokens = []

    def _attach(self, job: Job) -> list[str]:
        """lxc-attach running job in its working directory: a shell of the container's
        changes into it, the job's argv passed to it as arguments, never as shell text."""
        return ["lxc-attach", "-n", self.lxc_name, "-P", str(self.lxcpath), "--keep-env",
                "--", "/bin/sh", "-c", 'cd "$0" && exec "$@"', job_cwd(job), *job.argv]

    def run(self, job: Job) -> JobResult:
        done = proc.run(self._attach(job), timeout=job.timeout, env=container_env(job))
        if done.timed_out:
            self._kill_all("KILL")
        return JobResult(done.exit_code, done.stdout, done.stderr, host_elapsed=done.elapsed,
                         timed_out=done.timed_out)

    def _kill_all(self, signal: str) -> None:
        proc.run(["lxc-attach", "-n", self.lxc_name, "-P", str(self.lxcpath), "--clear-env",
                  "--", "kill", f"-{signal}", "-1"], timeout=LXC_TIMEOUT)

    def serve(self, job: Job) -> str:
        log = self.dir / f"serve-{len(self._servers)}.log"
        with open(log, "wb") as out:
            process = proc.spawn(self._attach(job), env=container_env(job),
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        handle = str(process.pid)
        self._servers[handle] = (process, self.journal.process(process.pid), log)
        return handle

    def serving(self, handle: str) -> bool:
        server = self._servers.get(handle)
        return server is not None and server[0].poll() is None

    def end(self, handle: str) -> str:
        server = self._servers.pop(handle, None)
        if server is None:
            return "ended"
        process, token, log = server
        for signal in ("TERM", "KILL"):
            if process.poll() is None:
                self._kill_all(signal)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=STOP_GRACE)
                break
        proc.kill_group(process)
        self.journal.forget(token)
        with contextlib.suppress(OSError):
            return _last_words(process.returncode, "", log.read_text(errors="replace"))
        return _last_words(process.returncode, "", "")


def _shift_ids(root: Path) -> None:
    """Every file of root owned by the ids the container's user namespace maps its own to
    (uid 0 inside is ID_BASE outside), as LXD shifts an unprivileged container's rootfs."""
    def shift(path: str) -> None:
        st = os.lstat(path)
        os.lchown(path, ID_BASE + st.st_uid, ID_BASE + st.st_gid)

    shift(str(root))
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:   # each once: a directory is walked as a parent later
            shift(os.path.join(parent, name))
