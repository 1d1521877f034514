"""Containers: the shared rootfs in Linux namespaces, started by unshare or an OCI runtime.

Every target gets a private writable copy of the cached rootfs (the cache is never
modified), so `/work` inside the container is a directory on the host's disk. Each job
runs in a fresh container with its own pid, mount, network (loopback only), uts and ipc
namespaces. A runtime is a plugin of its own (vmtax.core.runtime): the built-in ones are
below, others live in their own modules; `auto_rank` says which one plain `container` picks
first.

`cpus` confines a container to host CPUs: an OCI runtime gets them as its cgroup cpuset
(linux.resources.cpu.cpus); where there is no cgroup to put them in (unshare, crun with its
cgroup manager disabled) the runtime is started with that CPU affinity, which every process
of the container inherits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import stat
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

from pydantic import AfterValidator

from vmtax.core import plugin
from vmtax.core.errors import TargetError, VmtaxError
from vmtax.core.instance import Instance
from vmtax.core.option_types import HostCpus, Programs, Size
from vmtax.core.runtime import (
    NAMESPACES,
    Launch,
    Runtime,
    auto_order,
    chain,
    container_env,
    job_cwd,
    runtimes,
)
from vmtax.core.target import Feature, Target, TargetContext
from vmtax.core.types import Endpoint, Job, JobResult
from vmtax.guest import rootfs
from vmtax.helpers.oci_runtime import OciRuntime
from vmtax.host import machine as host
from vmtax.host import network, proc, trees
from vmtax.targets.container_instance import ContainerInstance

# Device nodes a rootfs without a /dev mount needs (the OCI runtimes create these themselves).
DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8),
           "urandom": (1, 9), "tty": (5, 0)}
PROBE = Job(["true"], timeout=30.0)
# What a factory's container runs: nothing, for as long as the factory keeps it (busybox's
# sleep takes at most 2^31-1 seconds).
HOLD = Job(["sleep", "2147483647"], timeout=30.0)
# How long killed containers may take to release their output pipes.
KILL_GRACE = 10.0


class Unshare(Runtime):
    name = "unshare"
    description = "util-linux unshare(1): namespaces only, no cgroups, no OCI runtime"
    install = "apt-get install util-linux"
    packages = ("util-linux",)
    auto_rank = 3
    joins_netns = True

    def setup_root(self) -> None:
        # unshare mounts only /proc, so the copy's own /dev carries the device nodes.
        for node, (major, minor) in DEVICES.items():
            path = self.root / "dev" / node
            if not path.exists():
                os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
                path.chmod(0o666)

    def command(self, job: Job) -> list[str]:
        net = [] if self.netns else ["--net"]   # else unshare starts in self.netns
        return [self.binary, "--fork", "--kill-child", "--pid", "--mount", *net, "--uts",
                "--ipc", "--mount-proc=/proc", f"--root={self.root}", f"--wd={job_cwd(job)}",
                "--", *job.argv]

    def launch(self, job: Job) -> Launch:
        enter = network.enter_netns(self.netns) if self.netns else None
        return Launch(self.command(job), env=container_env(job),
                      preexec=chain(enter, self.affinity()))


class Runc(OciRuntime):
    name = "runc"
    description = "runc, the OCI reference runtime (Docker's and containerd's default)"
    install = "apt-get install runc"
    packages = ("runc",)
    auto_rank = 1
    joins_netns = True


_CLONE_NEWNS = 0x00020000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_libc = ctypes.CDLL(None, use_errno=True)


def _hide_cgroup2() -> None:
    """In the child: a private mount namespace whose /sys/fs/cgroup/unified is an empty tmpfs.

    crun refuses a hybrid cgroup layout; seen this way the host is plain cgroup v1, and the
    host's own mounts are untouched. Failing here aborts the exec, so crun never starts.
    """
    if _libc.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if _libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    if _libc.mount(b"tmpfs", b"/sys/fs/cgroup/unified", b"tmpfs", 0, b"size=4k") != 0:
        raise OSError(ctypes.get_errno(), "mount tmpfs on /sys/fs/cgroup/unified")


class Crun(OciRuntime):
    name = "crun"
    description = "crun, the OCI runtime in C (podman's default)"
    install = "apt-get install crun"
    packages = ("crun",)
    auto_rank = 2
    joins_netns = True

    @classmethod
    def host_note(cls) -> str:
        if host.cgroup_layout() != "hybrid":
            return ""
        return ("; crun refuses this hybrid cgroup layout, vmtax works around it (a private "
                "mount namespace hiding the cgroup2 mount, --cgroup-manager=disabled)")

    def adapt(self, failure: str) -> bool:
        if "hybrid mode not supported" in failure and not self.cgroup_workaround:
            self.cgroup_workaround = True
            return True
        return False

    def cgroup(self) -> str | None:
        # crun's cgroup manager puts a container's cgroup at each hierarchy's root, whatever
        # cgroupsPath says, out of the target's: only without it are the jobs counted there.
        return super().cgroup() if self.cgroup_workaround else None

    def global_flags(self) -> list[str]:
        # Without cgroups crun makes no cgroup directories; delete works from the host's view.
        return ["--cgroup-manager=disabled"] if self.cgroup_workaround else []

    def preexec(self) -> Callable[[], None] | None:
        return _hide_cgroup2 if self.cgroup_workaround else None


def _known_runtime(value: str) -> str:
    if value != "auto" and value not in runtimes():
        raise ValueError("unknown runtime")
    return value


Runtime_ = Annotated[str, AfterValidator(_known_runtime), plugin.Expect(
    lambda: "one of " + ", ".join(f'"{n}"' for n in ["auto", *runtimes()]))]


class ContainerOptions(plugin.Options):
    runtime: Runtime_ = plugin.option(
        "auto", "How containers start: auto takes the first usable of runc, crun, unshare",
        tune=("runc", "crun", "unshare"))
    binaries: Programs = plugin.option(
        [], "Host programs to carry into the rootfs beside those the workloads need")
    cpus: HostCpus | None = plugin.option(
        None, "Host CPUs the container may run on (a cpuset); none: all",
        tune=(str(min(os.sched_getaffinity(0))),))
    # Only for runtimes that honour them (Runtime.honours); unset, a runtime does as its
    # users get it.
    network: Literal["bridge", "host"] | None = plugin.option(
        None, "docker: the container's network: bridge (a Docker bridge network vmtax "
        "makes, Docker's default) or host (the host's own network stack); none: bridge",
        tune=("host",), safety={"host": "the container shares the host's network stack"})
    storage: Literal["overlay", "volume"] | None = plugin.option(
        None, "docker: where the workloads' data directory (/work) is: overlay (the "
        "container's root filesystem, Docker's default) or volume (a bind-mounted host "
        "directory); none: overlay", tune=("volume",))
    seccomp: Literal["default", "unconfined"] | None = plugin.option(
        None, "docker: the system-call filter: default (Docker's profile) or unconfined; "
        "none: default", tune=("unconfined",),
        safety={"unconfined": "no system-call filter between the container and the kernel"})
    cpu_limit: float | None = plugin.option(
        None, "docker: CPU time the container may use (docker run --cpus, from 0.01 to the "
        "host's CPUs); none: no limit",
        unit="CPUs", gt=0, le=1024)
    memory_limit: Size | None = plugin.option(
        None, "docker: memory the container may use (docker run --memory, at least 6M); "
        "none: no limit")

    def problems(self) -> list[tuple[str, str]]:
        # Every runtime here makes namespaces, device nodes or cgroups as root: refused in
        # one line before anything runs, not with a PermissionError once the rootfs is built.
        if os.geteuid() != 0:
            return [("runtime", "vmtax run as root (sudo): its containers need root for "
                                "namespaces, device nodes and cgroups")]
        runtime = runtimes().get(self.runtime)
        honoured = runtime.honours if runtime is not None else set()
        return [(key, f"nothing for runtime {self.runtime!r} (set only for " + ", ".join(
                    name for name, cls in runtimes().items() if key in cls.honours) + ")")
                for key in RUNTIME_OWN if getattr(self, key) is not None
                and key not in honoured] + (runtime.option_problems(self) if runtime else [])


# ContainerOptions that only the runtimes honouring them take.
RUNTIME_OWN = ("network", "storage", "seccomp", "cpu_limit", "memory_limit")


class ContainerTarget(Target):
    name = "container"
    description = ("The host's own binaries in fresh Linux namespaces (pid, mount, net, uts, "
                   "ipc), one container per job, started by a container runtime")
    Options = ContainerOptions
    variant_option = "runtime"
    startup_seconds = 0.5
    shares_host_page_cache = True    # its processes' files are cached by the host's kernel
    packages = ("busybox-static",)   # every container's rootfs is built on it

    def __init__(self, name: str, options: plugin.Options, ctx: TargetContext):
        super().__init__(name, options, ctx)
        self.opts: ContainerOptions = options  # type: ignore[assignment]
        self.runtime: Runtime | None = None
        self.dir: Path | None = None
        self._fingerprint: dict[str, Any] | None = None
        self._dir_token: int | None = None
        self._tree_tokens: list[int] = []   # read-only bind mounts in the rootfs copy
        self._cgroup_tokens: list[int] = []   # the runtimes' cgroups for all their jobs
        # container id -> journal tokens: remove its cgroups, then (undone first) delete it
        self._undo: dict[str, list[int]] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._alive = True
        self._prepare_lock = threading.Lock()
        # Servers running for host-side clients, by their endpoints' handles.
        self._serving: dict[str, Instance] = {}

    @classmethod
    def variants(cls) -> dict[str, str | None]:
        return {name: runtime.unavailable() for name, runtime in runtimes().items()}

    @classmethod
    def packages_for(cls, options: plugin.Options) -> tuple[str, ...]:
        """Its rootfs's and its runtime's; with "auto", the first runtime it would pick
        (runc), which a fresh host lacks: auto would fall to a lesser one."""
        assert isinstance(options, ContainerOptions)
        name = auto_order()[0] if options.runtime == "auto" else options.runtime
        return (*cls.packages, *runtimes()[name].packages)

    @classmethod
    def refuses(cls, options: plugin.Options) -> dict[Feature, str]:
        """What its runtime refuses; with "auto", what every runtime it may pick refuses."""
        assert isinstance(options, ContainerOptions)
        names = auto_order() if options.runtime == "auto" else [options.runtime]
        first, *others = [runtimes()[name].refuses for name in names] or [{}]
        return {feature: why for feature, why in first.items()
                if all(feature in other for other in others)}

    def candidates(self) -> list[tuple[type[Runtime], str]]:
        """(runtime, binary) pairs to try in order; raises if an explicit one is missing."""
        wanted = self.opts.runtime
        if wanted != "auto":
            cls = runtimes()[wanted]
            try:
                return [(cls, cls.locate())]
            except VmtaxError as exc:
                raise VmtaxError(f"{self.name}: {exc}") from None
        found = []
        for name in auto_order():
            cls = runtimes()[name]
            why = cls.unavailable()
            if why is None:
                found.append((cls, cls.locate()))
            else:
                self.warnings.append(f"runtime {name} passed over: {why}")
        if not found:
            raise VmtaxError(f"{self.name}: none of {', '.join(auto_order())} is installed "
                             f"(apt-get install runc)")
        return found

    def attach(self, runtime: Runtime, source: Path) -> str | None:
        """Let the runtime make what it keeps of its own; None if it could, else why not."""
        try:
            runtime.attach(self.ctx, self.opts, source)
        except (OSError, VmtaxError) as exc:   # Docker's daemon did not start
            return str(exc)
        return None

    def probe(self, runtime: Runtime) -> str | None:
        """Run a trivial container; None if it worked, else why not (one line)."""
        try:
            runtime.setup_root()
        except OSError as exc:     # mknod refused, as in a user namespace
            return str(exc)
        while True:
            try:
                result = self._run_on(runtime, PROBE)
            except (OSError, subprocess.SubprocessError) as exc:
                return str(exc)
            if result.ok:
                return None
            if not runtime.adapt(result.stderr):
                lines = result.stderr.strip().splitlines()
                return lines[-1] if lines else f"exit code {result.exit_code}"

    def prepare(self) -> None:
        if self.runtime is not None:
            return
        candidates = self.candidates()
        source = rootfs.build([*self.ctx.binaries, *self.opts.binaries])
        self.dir = Path(self.ctx.work_dir) / f"container-{uuid.uuid4().hex[:8]}"
        self._dir_token = self.ctx.journal.add(type="rmtree", path=str(self.dir))
        failures = []
        try:
            self.dir.mkdir(parents=True)
            shutil.copytree(source, self.dir / "rootfs", symlinks=True)
            self._tree_tokens = [trees.bind_readonly(self.ctx.journal, tree, self.dir / "rootfs")
                                 for tree in self.ctx.trees]
            for cls, binary in candidates:
                runtime = cls(binary, self.dir, self.opts.cpus)
                if runtime.cgroup_dirs():
                    self._cgroup_tokens.append(
                        self.ctx.journal.add(type="rmdir", paths=runtime.cgroup_dirs()))
                error = self.attach(runtime, source) or self.probe(runtime)
                if error is None:
                    self.runtime = runtime
                    break
                runtime.detach()
                failures.append(f"{cls.name}: {error}")
        except BaseException:
            self.cleanup()
            raise
        if self.runtime is None:
            self.cleanup()
            raise VmtaxError(f"{self.name}: no usable container runtime ({'; '.join(failures)})")
        self.warnings += [f"runtime {f} (passed over)" for f in failures]
        self._fingerprint = {
            "kind": self.kind,
            "runtime": self.runtime.name,
            "runtime_version": self.runtime.version(),
            "namespaces": list(NAMESPACES),
            "rootfs": source.name,
            "cgroup_workaround": self.runtime.cgroup_workaround,
            "cpus": self.opts.cpus,
            "cpu_placement": self.runtime.placement(),
            **({"limits": limits} if (limits := self.runtime.limits()) else {}),
        }

    def run(self, job: Job) -> JobResult:
        if self.runtime is None:
            raise TargetError(f"{self.name}: run() before prepare()")
        return self._run_on(self.runtime, job)

    def _run_on(self, runtime: Runtime, job: Job) -> JobResult:
        launch = runtime.launch(job)
        # A launch that makes a container (not unshare's) has its undo command.
        if launch.container is not None and launch.undo is not None:
            self._undo[launch.container] = [
                self.ctx.journal.add(type="rmdir", paths=launch.cgroups or []),
                self.ctx.journal.add(type="argv", argv=launch.undo)]
        start = time.perf_counter()
        self._proc = proc.spawn(launch.argv, preexec=launch.preexec, env=launch.env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        timed_out = False
        try:
            try:
                out, err = self._proc.communicate(timeout=job.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                self._kill(runtime, launch)
                try:
                    out, err = self._proc.communicate(timeout=KILL_GRACE)
                except subprocess.TimeoutExpired:
                    self._alive = False
                    raise TargetError(
                        f"{self.name}: {job.argv[0]} survived being killed") from None
            except BaseException:
                self._kill(runtime, launch)
                raise
            elapsed = time.perf_counter() - start
            exit_code = None if timed_out else self._proc.returncode
        finally:
            self._proc = None
        if (launch.container is not None and launch.undo is not None
                and runtime.finish(launch)):
            self._remove(launch.container, delete=False)
        return JobResult(exit_code, out.decode(errors="replace"), err.decode(errors="replace"),
                         host_elapsed=elapsed, guest_elapsed=None, timed_out=timed_out)

    def _kill(self, runtime: Runtime, launch: Launch) -> None:
        # OCI runtimes give the container its own session, out of reach of the group kill:
        # removing it kills its processes (the whole pid namespace) first.
        runtime.finish(launch)
        if self._proc is not None:
            proc.kill_group(self._proc)

    # -- long-lived containers: servers for host-side clients, a factory's instances --

    def _instance(self, name: str, job: Job, net: Any, log: str, server: bool) -> Instance:
        with self._prepare_lock:   # a factory's threads: one rootfs copy, one probe
            self.prepare()
        runtime = self.runtime
        assert runtime is not None and self.dir is not None   # prepared
        instance = runtime.instance(name, job, self.dir / log, server)   # its own network
        if instance is None:
            if not runtime.joins_netns:
                raise TargetError(f"{self.name}: the {runtime.name} runtime cannot join a "
                                  "network namespace vmtax made, so it cannot serve a client "
                                  "on the host or be one of many instances yet")
            instance = ContainerInstance(name, runtime, job, self.ctx.journal, net,
                                         self.dir / log)
        instance.start()
        return instance

    def start_server(self, job: Job, port: int) -> Endpoint:
        """The server in a container of its own in a network namespace vmtax made, joined
        to the invocation's network by a veth pair; or where its runtime puts it, on a
        network of the runtime's own (Runtime.instance)."""
        server = self._instance(f"{self.name} server", job, self.ctx.shared_network(),
                                f"server-{port}.log", server=True)
        assert server.address is not None and self.runtime is not None   # started
        key = f"{port}-{uuid.uuid4().hex[:8]}"
        self._serving[key] = server
        seen = self.runtime.kernel_sockets   # else the runner probes with a connection
        endpoint = Endpoint(server.address, port, [], handle=key,
                            client_preexec=server.client_preexec, listening=seen)
        if seen and not network.wait_tcp_listening(server.host_pids, port, job.timeout,
                                                   server.alive):
            self.stop_server(endpoint)
            raise TargetError(f"{self.name}: {job.argv[0]} does not listen on port {port} "
                              f"in the container after {job.timeout:g} s")
        return endpoint

    def stop_server(self, endpoint: Endpoint) -> None:
        server = self._serving.pop(str(endpoint.handle), None)
        if server is not None:
            server.stop()

    def make_instance(self, index: int, network: Any, job: Job | None = None) -> Instance:
        """A container of this configuration on `network` running job (or idling) until
        stopped."""
        return self._instance(f"{self.name}#{index}", job or HOLD, network,
                              f"instance-{index}.log", server=False)

    def cpus(self) -> set[int] | None:
        return set(self.opts.cpus) if self.opts.cpus else None

    def cgroup(self) -> str | None:
        return self.runtime.cgroup() if self.runtime is not None else None

    def host_pids(self) -> list[int]:
        """The processes of the containers that serve: those in their network namespaces."""
        return [pid for server in self._serving.values() for pid in server.host_pids()]

    def _remove(self, container: str, delete: bool) -> None:
        """Delete the container (unless the runtime already did) and its cgroups. A cgroup
        still busy stays journaled: the owner's final undo or the next start retries it."""
        rmdir, argv = self._undo.pop(container)
        if delete:
            self.ctx.journal.undo(argv)
        else:
            self.ctx.journal.forget(argv)
        with contextlib.suppress(OSError):
            self.ctx.journal.undo(rmdir)

    def cleanup(self) -> None:
        if self._proc is not None:
            proc.kill_group(self._proc)
            self._proc = None
        for path in list(self._serving):
            self.stop_server(Endpoint("", 0, handle=path))
        for container in list(self._undo):
            self._remove(container, delete=True)
        if self.runtime is not None:   # its containers go before their cgroups
            self.runtime.detach()
        for token in self._cgroup_tokens:
            with contextlib.suppress(OSError):   # still busy: stays journaled, retried later
                self.ctx.journal.undo(token)
        self._cgroup_tokens = []
        for token in self._tree_tokens:   # before the copy is removed
            self.ctx.journal.undo(token)
        self._tree_tokens = []
        if self._dir_token is not None:
            self.ctx.journal.undo(self._dir_token)
            self._dir_token = None
        self.runtime = None

    def fingerprint(self) -> dict[str, Any]:
        if self._fingerprint is None:
            raise TargetError(f"{self.name}: fingerprint() before prepare()")
        return dict(self._fingerprint)

    def alive(self) -> bool:
        return self._alive
