"""The contract every container runtime follows: how one job becomes one container.

The container target (vmtax.targets.container) keeps a private copy of the rootfs and runs
each job in a fresh container; a runtime is how that container is started (unshare, runc,
crun, podman, gVisor's runsc). A runtime is a plugin of its own (group
"container-runtime"), found by the registry, so a new one is one new module that imports
only this contract, the host, the guest and the helpers. The target drives it like this:

    why = cls.unavailable()               # for `vmtax list`, `vmtax doctor`, runtime = "auto"
    runtime = cls(cls.locate(), home, cpus)     # once, when the target is prepared
    runtime.attach(ctx, options, source)  # what it keeps of its own (Docker: its daemon...)
    journal(runtime.cgroup_dirs())        # the target's cgroup, removed after its last job
    runtime.setup_root()                  # the rootfs copy at home/"rootfs" exists
    launch = runtime.launch(PROBE)        # a probe job; on failure runtime.adapt(stderr)
    ...                                   # then one launch per job:
    launch = runtime.launch(job)          # its undo is journaled before it is spawned
    ...                                   # the host command runs to its end or is killed
    runtime.finish(launch)                # after the job, and after a kill
    runtime.detach()                      # when the target is cleaned up

Every container gets the same things whichever runtime starts it: the environment
(`container_env`), working directory (`job_cwd`), capabilities (`CAPABILITIES` plus the
job's own), host name and namespaces, so that runtimes differ only in what they cost.
A runtime also declares what it refuses (`refuses`), so that a plan asking for it is
refused before anything runs (vmtax.studies.plan).
"""

from __future__ import annotations

import abc
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

from vmtax.core import plugin
from vmtax.core.errors import VmtaxError
from vmtax.core.instance import Instance
from vmtax.core.target import Feature, TargetContext
from vmtax.core.types import Job

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NAMESPACES = ("pid", "mount", "net", "uts", "ipc")
HOSTNAME = "vmtax"
# Docker's default set: what a typical container keeps of root's capabilities.
CAPABILITIES = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
                "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
                "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"]


def container_env(job: Job) -> dict[str, str]:
    """The environment of the job's process in its container."""
    return {"PATH": DEFAULT_PATH, **job.env}


def job_cwd(job: Job) -> str:
    """The job's working directory in its container: the shared scratch directory or /."""
    return "/work" if job.in_scratch else "/"


def job_capabilities(job: Job) -> list[str]:
    """The capabilities the job's process keeps: the default set and those it asks for."""
    return [*CAPABILITIES, *(c for c in job.capabilities if c not in CAPABILITIES)]


def _pin_to(cpus: list[int]) -> Callable[[], None]:
    """A preexec: the child and everything it starts run only on cpus."""
    def pin() -> None:
        os.sched_setaffinity(0, cpus)
    return pin


def chain(*steps: Callable[[], None] | None) -> Callable[[], None] | None:
    """One preexec running the given ones in order (None when none is given)."""
    given = tuple(s for s in steps if s is not None)
    if len(given) <= 1:
        return given[0] if given else None

    def run() -> None:
        for step in given:
            step()
    return run


@dataclass
class Launch:
    """How to start one job: the host command, its environment and the container it makes."""
    argv: list[str]
    env: dict[str, str] | None = None
    preexec: Callable[[], None] | None = None
    container: str | None = None    # id of the container the runtime makes
    undo: list[str] | None = None   # command that kills and removes it (journaled first)
    # Cgroup directories the runtime may make for it, removed by vmtax too: a runtime that
    # was killed while creating the container, or whose rmdir met a task still exiting,
    # leaves them behind (CI once found /sys/fs/cgroup/cpuset/vmtax-<id>).
    cgroups: list[str] | None = None


class Runtime(plugin.Plugin, abc.ABC):
    """One way of starting a container; `home` holds the rootfs copy and runtime state."""
    group = "container-runtime"
    install: ClassVar[str]          # how to get it, for the "not installed" error
    # Order in which `runtime = "auto"` tries runtimes (lowest first); None: never picked.
    auto_rank: ClassVar[int | None] = None
    # Can put a container into a network namespace vmtax made (`netns`), so that it can
    # serve a client on the host.
    joins_netns: ClassVar[bool] = False
    # The container's sockets are the host kernel's (its socket table shows a server
    # listen); gVisor's are in its own user-space network stack.
    kernel_sockets: ClassVar[bool] = True
    # Features of vmtax.core.target.Feature that no job can have in its containers ->
    # why, in a few words: {"real-time scheduling": "gVisor"}. A plan whose workload needs
    # one (Workload.needs) is refused when it is checked, before anything runs.
    refuses: ClassVar[dict[Feature, str]] = {}
    # Options of the container target that only some runtimes honour (Docker's network,
    # storage, seccomp and limits), by name: a plan setting one for a runtime that does not
    # list it is refused when it is checked.
    honours: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def locate(cls) -> str:
        """The runtime's executable. Called when a target using it is prepared (it may
        build the runtime, as runsc does); raises VmtaxError saying how to get it."""
        found = shutil.which(cls.name)
        if found is None:
            raise VmtaxError(f"{cls.name} is not installed ({cls.install})")
        return found

    @classmethod
    def host_note(cls) -> str:
        """A remark for `vmtax doctor` on how the runtime fares on this host ("; ..."), or
        "". Cheap; never raises."""
        return ""

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this host cannot use the runtime, in one line (None: it may; the target's
        probe has the last word). Called by `vmtax list`, `vmtax doctor` and `runtime =
        "auto"`; cheap (builds nothing), never raises."""
        try:
            cls.locate()
        except VmtaxError as exc:
            return str(exc)
        return None

    @classmethod
    def option_problems(cls, options: plugin.Options) -> list[tuple[str, str]]:
        """(option, what it must be) for each of the options it honours whose value it
        would refuse, or not apply, when it runs: refused when the plan is checked, as
        plugin.Options.problems are. Default: none."""
        return []

    def __init__(self, binary: str, home: Path, cpus: list[int] | None = None):
        """A runtime for one target: `binary` as locate() found it, `home` the target's
        directory (home/"rootfs" is the rootfs copy; state goes beside it), `cpus` the
        host CPUs its containers are confined to (None: all)."""
        self.binary = binary
        self.root = home / "rootfs"
        self.cgroup_workaround = False
        self.cpus = cpus
        # The network namespace the next launch joins (None: a fresh one, loopback only).
        self.netns: str | None = None
        # Held from a long-lived container's launch until it runs
        # (vmtax.targets.container_instance).
        self.launch_lock = threading.Lock()

    def placement(self) -> str | None:
        """How `cpus` is enforced: "cpuset" (the runtime's cgroup) or "affinity"."""
        return "affinity" if self.cpus else None

    def affinity(self) -> Callable[[], None] | None:
        """The preexec that confines a launch to `cpus` when placement() is "affinity"."""
        return _pin_to(self.cpus) if self.cpus and self.placement() == "affinity" else None

    def version(self) -> str:
        """The runtime's version line, stored in the target's fingerprint."""
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True)
        lines = (out.stdout or out.stderr).splitlines()
        return lines[0].strip() if lines else ""

    def attach(self, ctx: TargetContext, options: plugin.Options, source: Path) -> None:
        """Called once, before setup_root(), with the target's context (journal, trees,
        work dir), its options and the cached rootfs its copy was made from (never
        modified). A runtime that keeps things of its own on the host (a daemon, an image, a
        network, a container its jobs run in) makes them here, each journaled before it is
        made, and removes them in detach(). Raises VmtaxError or OSError when it cannot."""

    def limits(self) -> dict[str, Any]:
        """The limits of the target's options as the runtime reports it applied them, once
        attached, for the target's fingerprint (a result must not pass for one measured
        under a limit the runtime did not apply). Default: none reported."""
        return {}

    def detach(self) -> None:
        """Remove what attach() made; idempotent. Called when the target is cleaned up and
        when its probe passes the runtime over."""

    def instance(self, name: str, job: Job, log: Path, server: bool) -> Instance | None:
        """job running for as long as the instance (not started yet), which host-side
        clients reach the runtime's own way (Docker's: at an address on Docker's bridge);
        `log` takes its output. server: the target's server for a client, which must see
        the data its jobs prepared (/work); else one of a factory's copies of the target.
        None (the default): the target starts a container of the runtime in a network
        namespace on vmtax's network (vmtax.targets.container_instance)."""
        return None

    def setup_root(self) -> None:
        """Adapt the rootfs copy to this runtime; called once, before the first launch."""

    def cgroup_dirs(self) -> list[str]:
        """The directories of `cgroup()` that setup_root() makes: the target journals their
        removal first and removes them after its last job. Default: none."""
        return []

    def cgroup(self) -> str | None:
        """The cgroup that holds every container this runtime starts, for the target's
        lifetime, as /proc/PID/cgroup names it ("/vmtax-0123abcd"): a collector (host-cpu)
        reads all of the target's jobs there. None (the default): there is none."""
        return None

    def adapt(self, failure: str) -> bool:
        """The target's probe job failed with this stderr: switch on a workaround and
        return True to probe again, or False to give the runtime up."""
        return False

    @abc.abstractmethod
    def launch(self, job: Job) -> Launch:
        """The host command that runs job in a fresh container (in `netns` when set).
        Called once per job; the target journals launch.undo and launch.cgroups before it
        spawns launch.argv in a process group of its own. Raises OSError or VmtaxError
        when the launch cannot be prepared."""

    def finish(self, launch: Launch) -> bool:
        """Kill and remove what launch left outside its process group; True once nothing
        is. Called after the job ended and again after a kill; idempotent."""
        return True


# -- the registry of container runtimes ----------------------------------------------------

def runtimes() -> dict[str, type[Runtime]]:
    """Runtime name -> class, built-in and third-party."""
    return plugin.plugins(Runtime.group)  # type: ignore[return-value]


def auto_order() -> list[str]:
    """The runtimes `runtime = "auto"` tries, in order."""
    ranked = [(cls.auto_rank, name) for name, cls in runtimes().items()
              if cls.auto_rank is not None]
    return [name for _, name in sorted(ranked)]
