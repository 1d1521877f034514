"""podman as a container runtime (`container:podman`): rootful podman 4 driving runc.

Each job is `podman run --rm --rootfs HOME/rootfs`: the target's rootfs copy is the
container's root as it is, so there is no image to build, store or remove (`podman import`
would copy the rootfs into podman's storage once more). Every job still pays podman's own
start-up (the CLI, conmon, its database), which is part of what podman costs.

podman's state stays in HOME, removed with the target: storage, tmp dir (with the file
locks), network configuration, and the run dir. podman refuses a runroot path over 50
characters and HOME is under the results directory, so the runroot is a short symlink,
/run/vmtax-podman-<hash of HOME>, to HOME/run, made for each job and removed after it.
The flags, and what they avoid, as measured on Debian 12 (podman 4.3.1, runc 1.1.5) on a
hybrid cgroup host without CAP_SYS_RESOURCE:

- `--runtime RUNC`: crun, podman's default, refuses a hybrid cgroup layout.
- `--cgroup-manager=cgroupfs`, `--events-backend=file`: no systemd scopes, no journald.
- `--storage-driver=vfs`: overlay, unused with --rootfs, bind-mounts its storage directory
  onto itself and never unmounts it.
- `--network-backend=cni` with a private `--network-config-dir`: rootful netavark always
  makes /run/containers/networks. With --network=none neither backend runs at all.
- `--cgroup-parent=/vmtax-<id>` with `--cgroups=no-conmon`: runc makes the container's
  cgroup libpod-<podman id> under it and removes that on delete; podman leaves the parent,
  which the target removes (`Launch.cgroups`). Without a parent podman makes
  `libpod_parent` in every hierarchy, and conmon would get a cgroup of its own there.
  `--cgroups=disabled` is refused with runc ("not compatible with NoCgroups").
- CONTAINERS_CONF (see below): file locks instead of /dev/shm/libpod_lock.

Left outside HOME: runc's state sits in runc's default /run/runc/<podman id> while the
container exists (podman passes `--runtime-flag root=…` to its own runc calls, but not to
the `podman container cleanup` conmon runs at exit, whose `runc delete` then misses it).
So the runroot link, and /run/runc when the first job makes it, are journaled when the
target attaches, before any job: undone after every container's journaled `podman rm`
(which goes through the link), /run/runc only once it is empty. Killed
within the ~0.1 s in which runc creates the container, podman has not yet recorded it,
and the runc container (runc init, waiting) outlives `podman rm`; `finish` deletes such
orphans through runc, the journal cannot.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from vmtax.core import plugin
from vmtax.core.errors import VmtaxError
from vmtax.core.runtime import Launch, Runtime, container_env, job_capabilities, job_cwd
from vmtax.core.target import TargetContext
from vmtax.core.types import Job
from vmtax.host import machine as host
from vmtax.host.journal import Journal, undone_by

# How long conmon and the cleanup command it starts may take to exit after the container.
SETTLE_SECONDS = 10.0
# Where the runroot links go: a short path, cleared at boot.
LINKS = Path("/run")
# runc's default state directory, which podman's cleanup path uses (see above).
RUNC_ROOT = Path("/run/runc")
# Replaces the host's containers.conf files, so they cannot change what is measured. Its
# one setting has no flag: file locks under --tmpdir instead of the SHM segment
# /dev/shm/libpod_lock that every rootful podman on the host shares.
CONTAINERS_CONF = """\
# vmtax's podman: read instead of the host's containers.conf files.
[engine]
lock_type = "file"
"""


def remove_host_state(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo what podman's jobs leave outside the target's directory: the runroot link, and
    runc's /run/runc if a job of ours made it and nothing else is in it. First, as finish()
    does, let conmon and the cleanup it starts at its container's exit end: after the
    journal's `podman rm` they still run, and the cleanup makes podman's storage again in
    the target's directory if that tree goes first (a full test run's killed vmtax)."""
    if storage := entry.get("storage"):
        settle(str(storage).encode())
    link = Path(str(entry.get("link")))
    if link.parent == LINKS and link.name.startswith("vmtax-podman-") and link.is_symlink():
        link.unlink()
    if entry.get("runc_root") == str(RUNC_ROOT):
        # After a kill, the `podman rm` undone just before removes runc's state of the
        # container a moment later; still not empty after that: another's containers.
        deadline = time.monotonic() + SETTLE_SECONDS / 2
        while True:
            try:
                RUNC_ROOT.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.05)


def pid_max() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text())


def ulimits() -> list[str]:
    """--ulimit flags giving the container vmtax's own limits. Unasked, podman sets nofile
    and nproc to 1048576, which a host without CAP_SYS_RESOURCE refuses; podman also lowers
    its own nproc to pid_max at start, so runc can set no more than that."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc = [pid_max() if v == resource.RLIM_INFINITY else min(v, pid_max())
             for v in resource.getrlimit(resource.RLIMIT_NPROC)]
    return [f"--ulimit=nofile={nofile[0]}:{nofile[1]}", f"--ulimit=nproc={nproc[0]}:{nproc[1]}"]


def settle(marker: bytes) -> bool:
    """Wait up to SETTLE_SECONDS for every process whose command line holds marker (conmon,
    the cleanup it starts: their podman's storage) to end; whether they did."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while busy := bool(processes_with(marker)):
        if time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return not busy


def processes_with(marker: bytes) -> list[int]:
    """Processes whose command line contains marker (a zombie's is empty)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry.name))
    return found


class Podman(Runtime):
    name = "podman"
    description = ("podman 4, rootful, with runc: the rootfs copy used directly (--rootfs), "
                   "podman's storage and state kept in the target's directory")
    install = "apt-get install podman"
    packages = ("podman", "runc")
    joins_netns = True

    @classmethod
    def locate(cls) -> str:
        found = super().locate()
        if shutil.which("runc") is None:
            raise VmtaxError("podman needs runc here, which is not installed "
                             "(apt-get install runc)")
        return found

    @classmethod
    def unavailable(cls) -> str | None:
        why = super().unavailable()
        if why is None and os.geteuid() != 0:
            return "podman runs rootful here: vmtax must run as root"
        return why

    def __init__(self, binary: str, home: Path, cpus: list[int] | None = None):
        super().__init__(binary, home, cpus)
        self.runc = shutil.which("runc") or "runc"
        self.env_tool = shutil.which("env") or "env"
        self.conf = home / "containers.conf"
        self.storage = home / "storage"
        self.run_dir = home / "run"
        digest = hashlib.sha256(str(home).encode()).hexdigest()[:12]
        self.runroot = LINKS / f"vmtax-podman-{digest}"
        self.global_flags = [
            "--root", str(self.storage), "--runroot", str(self.runroot),
            "--tmpdir", str(home / "tmp"), "--storage-driver=vfs",
            "--network-backend=cni", "--network-config-dir", str(home / "networks"),
            "--cgroup-manager=cgroupfs", "--events-backend=file", "--runtime", self.runc]
        self.ulimits = ulimits()
        self.cgroup_roots = [point for point, _ in host.cgroup_mounts()]
        # Containers launched and not yet finished: the link stays while there are any.
        self.unfinished: set[str] = set()
        # The journal of the target attached, and the entry of what jobs leave outside HOME.
        self.journal: Journal | None = None
        self._state_token: int | None = None

    def attach(self, ctx: TargetContext, options: plugin.Options, source: Path) -> None:
        self.journal = ctx.journal
        self._state_token = ctx.journal.add(
            type="podman-state", undo=undone_by(remove_host_state), link=str(self.runroot),
            storage=str(self.storage), runc_root=None if RUNC_ROOT.exists() else str(RUNC_ROOT))

    def detach(self) -> None:
        token, self._state_token = self._state_token, None
        if token is not None and self.journal is not None and not self.unfinished:
            self.journal.undo(token)

    def base(self) -> list[str]:
        # env(1): the journaled undo runs with vmtax's environment, not one of ours.
        return [self.env_tool, f"CONTAINERS_CONF={self.conf}", self.binary, *self.global_flags]

    def setup_root(self) -> None:
        self.conf.write_text(CONTAINERS_CONF)

    def placement(self) -> str | None:
        return "cpuset" if self.cpus else None

    def link(self) -> None:
        """Make the short runroot point at HOME/run (anew: a crash may have left one)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.unlink()
        self.runroot.symlink_to(self.run_dir)

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.runroot.unlink()

    def version(self) -> str:
        # What runs the container matters as much as podman's own version.
        out = subprocess.run([self.runc, "--version"], capture_output=True, text=True).stdout
        return f"{super().version()}, {out.splitlines()[0] if out else self.runc}"

    def launch(self, job: Job) -> Launch:
        container = f"vmtax-{uuid.uuid4().hex[:12]}"
        caps = job_capabilities(job)
        env = container_env(job)
        secret = {k: v for k, v in env.items() if v in job.secrets}
        # A namespace vmtax made (a server's) is joined as it is: podman configures nothing.
        network = f"--network=ns:{self.netns}" if self.netns else "--network=none"
        argv = [*self.base(), "run", "--rm", f"--name={container}", network,
                "--hostname=vmtax", f"--workdir={job_cwd(job)}",
                # Exactly the environment and capabilities the other runtimes give.
                # A secret's value reaches podman through its own environment, never its
                # argv, which any user's ps shows.
                "--unsetenv-all", *(f"--env={k}" if v in job.secrets else f"--env={k}={v}"
                                    for k, v in env.items()),
                "--cap-drop=all", f"--cap-add={','.join(caps)}",
                # Unasked, podman loads an AppArmor profile into the host's kernel, where it
                # stays; the other runtimes use no LSM profile either. Seccomp stays podman's.
                "--security-opt=apparmor=unconfined",
                # The other runtimes set no pids limit; podman's 2048 would fail a plan with
                # more threads under podman alone.
                "--pids-limit=-1", *self.ulimits,
                "--cgroups=no-conmon", f"--cgroup-parent=/{container}"]
        if self.cpus:
            argv.append(f"--cpuset-cpus={','.join(map(str, sorted(self.cpus)))}")
        # The rootfs is the one positional argument before the command: nothing after it is
        # read as a podman flag.
        argv += ["--rootfs", str(self.root), *job.argv]
        self.link()
        self.unfinished.add(container)
        return Launch(argv, env={**os.environ, **secret} if secret else None,
                      container=container,
                      undo=[*self.base(), "rm", "--force", "--time=0", "--ignore", container],
                      cgroups=[f"{root}/{container}" for root in self.cgroup_roots])

    def orphans(self) -> list[str]:
        """runc containers of this podman that podman lost: a `podman run` killed while runc
        was creating its container leaves that created (runc init waiting) but recorded by
        podman as never made, so `podman rm` drops it from the database and nothing more."""
        out = subprocess.run([self.runc, "list", "--format=json"], capture_output=True,
                             text=True, timeout=60).stdout
        inside = str(self.storage) + os.sep
        return [c["id"] for c in json.loads(out or "null") or []
                if c["bundle"].startswith(inside)]

    def finish(self, launch: Launch) -> bool:
        # The target calls it at a kill and again after the job: the second call must not
        # start podman, whose runroot link may be gone (podman would make a directory there).
        if launch.container not in self.unfinished:
            return True
        assert launch.undo is not None   # launch() set it
        # `run --rm` has removed the container when the job ended by itself; after a kill it
        # is still there, and `rm` kills its whole pid namespace. --ignore: gone is success.
        removed = subprocess.run(launch.undo, capture_output=True, timeout=60).returncode == 0
        for container in self.orphans():
            subprocess.run([self.runc, "delete", "--force", container], capture_output=True,
                           timeout=60)
        # conmon, and the `podman container cleanup` it starts once the container exits, run
        # in sessions of their own, out of reach of the group kill; after a kill `podman run`
        # itself returns once its container is gone. All of them use the runroot link.
        busy = not settle(str(self.storage).encode())
        if not removed or busy:
            return False     # for the journaled undo, which needs the link
        self.unfinished.discard(launch.container)
        if not self.unfinished:
            self.unlink()
        return True
