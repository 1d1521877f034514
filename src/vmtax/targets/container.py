"""Containers: the shared rootfs in Linux namespaces, started by unshare or an OCI runtime.

Every target gets a private writable copy of the cached rootfs (the cache is never
modified), so `/work` inside the container is a directory on the host's disk. Each job
runs in a fresh container with its own pid, mount, network (loopback only), uts and ipc
namespaces. A runtime is a plugin of its own (group "container-runtime"): the built-in ones
are below, others live in their own modules; `auto_rank` says which one plain `container`
picks first.

`cpus` confines a container to host CPUs: an OCI runtime gets them as its cgroup cpuset
(linux.resources.cpu.cpus); where there is no cgroup to put them in (unshare, crun with its
cgroup manager disabled) the runtime is started with that CPU affinity, which every process
of the container inherits.
"""

from __future__ import annotations

import abc
import contextlib
import ctypes
import json
import os
import shutil
import stat
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar

from pydantic import AfterValidator

from vmtax import host, network, plugin, proc, rootfs, trees
from vmtax.container_instance import ContainerInstance
from vmtax.errors import TargetError, VmtaxError
from vmtax.instance import Instance
from vmtax.option_types import HostCpus, Programs
from vmtax.targets.base import Target, TargetContext
from vmtax.types import Endpoint, Job, JobResult

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NAMESPACES = ("pid", "mount", "net", "uts", "ipc")
HOSTNAME = "vmtax"
# Docker's default set: what a typical container keeps of root's capabilities.
CAPABILITIES = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
                "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
                "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"]
# Device nodes a rootfs without a /dev mount needs (the OCI runtimes create these themselves).
DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8),
           "urandom": (1, 9), "tty": (5, 0)}
PROBE = Job(["true"], timeout=30.0)
# What a factory's container runs: nothing, for as long as the factory keeps it (busybox's
# sleep takes at most 2^31-1 seconds).
HOLD = Job(["sleep", "2147483647"], timeout=30.0)
# How long killed containers may take to release their output pipes.
KILL_GRACE = 10.0


def container_env(job: Job) -> dict[str, str]:
    return {"PATH": DEFAULT_PATH, **job.env}


def job_cwd(job: Job) -> str:
    return "/work" if job.in_scratch else "/"


# Real-time budget of a container's cgroup where the kernel schedules real-time tasks per
# cgroup (CONFIG_RT_GROUP_SCHED, cgroup v1): a new cgroup gets none, so SCHED_FIFO fails
# ("Unable to change scheduling policy") even with CAP_SYS_NICE. Half of every second, as
# the host's default leaves 95% to its own real-time tasks.
RT_GROUP_FILE = "/sys/fs/cgroup/cpu/cpu.rt_runtime_us"
RT_RUNTIME_US, RT_PERIOD_US = 500_000, 1_000_000


def oci_config(job: Job, root: Path, cpus: list[int] | None = None,
               netns: str | None = None) -> dict[str, Any]:
    """The OCI runtime spec of one job: its process in the rootfs copy, no network but lo
    (or the network namespace at `netns`, made by vmtax.network), on the host CPUs `cpus`
    (a cpuset) when given, with the capabilities it asks for."""
    caps = [*CAPABILITIES, *(c for c in job.capabilities if c not in CAPABILITIES)]
    resources: dict[str, Any] = {"devices": [{"allow": False, "access": "rwm"}]}
    cpu: dict[str, Any] = {}
    if cpus:
        cpu["cpus"] = ",".join(map(str, sorted(cpus)))
    if "CAP_SYS_NICE" in job.capabilities and os.path.exists(RT_GROUP_FILE):
        cpu.update(realtimeRuntime=RT_RUNTIME_US, realtimePeriod=RT_PERIOD_US)
    if cpu:
        resources["cpu"] = cpu
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": list(job.argv),
            "env": [f"{k}={v}" for k, v in container_env(job).items()],
            "cwd": job_cwd(job),
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "noNewPrivileges": True,
        },
        "root": {"path": str(root), "readonly": False},
        "hostname": HOSTNAME,
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            # A tmpfs /dev: the runtime adds null, zero, full, random, urandom, tty.
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "nodev", "mode=1777"]},
        ],
        "linux": {
            # OCI calls the network namespace "network".
            "namespaces": [{"type": "network", "path": netns} if ns == "net" and netns
                           else {"type": "network" if ns == "net" else ns}
                           for ns in NAMESPACES],
            "resources": resources,
        },
    }


def _pin_to(cpus: list[int]) -> Callable[[], None]:
    """In the child before exec: it and everything it starts run only on cpus."""
    def pin() -> None:
        os.sched_setaffinity(0, cpus)
    return pin


def _chain(*steps: Callable[[], None] | None) -> Callable[[], None] | None:
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

    @classmethod
    def locate(cls) -> str:
        """The runtime's executable; raises VmtaxError saying how to get it."""
        found = shutil.which(cls.name)
        if found is None:
            raise VmtaxError(f"{cls.name} is not installed ({cls.install})")
        return found

    @classmethod
    def host_note(cls) -> str:
        """A remark for `vmtax doctor` on how the runtime fares on this host ("; ...")."""
        return ""

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this host cannot use the runtime (None: it may; the probe has the last word)."""
        try:
            cls.locate()
        except VmtaxError as exc:
            return str(exc)
        return None

    def __init__(self, binary: str, home: Path, cpus: list[int] | None = None):
        self.binary = binary
        self.root = home / "rootfs"
        self.cgroup_workaround = False
        self.cpus = cpus
        # The network namespace the next launch joins (None: a fresh one, loopback only).
        self.netns: str | None = None
        # Held from a long-lived container's launch until it runs (vmtax.container_instance).
        self.launch_lock = threading.Lock()

    def placement(self) -> str | None:
        """How `cpus` is enforced: "cpuset" (the runtime's cgroup) or "affinity"."""
        return "affinity" if self.cpus else None

    def affinity(self) -> Callable[[], None] | None:
        return _pin_to(self.cpus) if self.cpus and self.placement() == "affinity" else None

    def version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True)
        lines = (out.stdout or out.stderr).splitlines()
        return lines[0].strip() if lines else ""

    def setup_root(self) -> None:
        """Adapt the rootfs copy to this runtime before the first job."""

    def adapt(self, failure: str) -> bool:
        """A probe failed with this stderr: switch on a workaround; True to probe again."""
        return False

    @abc.abstractmethod
    def launch(self, job: Job) -> Launch:
        """The host command that runs job in a fresh container."""

    def finish(self, launch: Launch) -> bool:
        """Kill and remove what launch left outside its process group; True once nothing is."""
        return True


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
                      preexec=_chain(enter, self.affinity()))


class OciRuntime(Runtime):
    """A runc-compatible CLI: `BIN --root STATE run --bundle B ID` with a generated config."""

    def __init__(self, binary: str, home: Path, cpus: list[int] | None = None):
        super().__init__(binary, home, cpus)
        self.bundle = home / "bundle"
        # Private state instead of /run/<runtime>: nothing of ours lands in host-wide dirs.
        self.state = home / "state"
        self.cgroup_roots = [point for point, _ in host.cgroup_mounts()]

    def global_flags(self) -> list[str]:
        return []

    def preexec(self) -> Callable[[], None] | None:
        return None

    def base(self) -> list[str]:
        return [self.binary, "--root", str(self.state), *self.global_flags()]

    def placement(self) -> str | None:
        # Without a cgroup manager the runtime ignores linux.resources.
        if self.cpus and not self.cgroup_workaround:
            return "cpuset"
        return super().placement()

    def launch(self, job: Job) -> Launch:
        self.bundle.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)
        cpuset = self.cpus if self.placement() == "cpuset" else None
        (self.bundle / "config.json").write_text(
            json.dumps(oci_config(job, self.root, cpuset, self.netns), indent=1))
        container = f"vmtax-{uuid.uuid4().hex[:12]}"
        return Launch([*self.base(), "run", "--bundle", str(self.bundle), container],
                      preexec=_chain(self.preexec(), self.affinity()), container=container,
                      undo=[*self.base(), "delete", "-f", container],
                      cgroups=[f"{root}/{container}" for root in self.cgroup_roots])

    def finish(self, launch: Launch) -> bool:
        # `run` deletes its container when the process exits; state left means it did not.
        assert launch.container is not None and launch.undo is not None   # launch() set them
        state = self.state / launch.container
        if state.exists():
            subprocess.run(launch.undo, capture_output=True, timeout=30)
        return not state.exists()


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

    def global_flags(self) -> list[str]:
        # Without cgroups crun makes no cgroup directories; delete works from the host's view.
        return ["--cgroup-manager=disabled"] if self.cgroup_workaround else []

    def preexec(self) -> Callable[[], None] | None:
        return _hide_cgroup2 if self.cgroup_workaround else None


def runtimes() -> dict[str, type[Runtime]]:
    return plugin.plugins(Runtime.group)  # type: ignore[return-value]


def auto_order() -> list[str]:
    ranked = [(cls.auto_rank, name) for name, cls in runtimes().items()
              if cls.auto_rank is not None]
    return [name for _, name in sorted(ranked)]


def _known_runtime(value: str) -> str:
    if value != "auto" and value not in runtimes():
        raise ValueError("unknown runtime")
    return value


Runtime_ = Annotated[str, AfterValidator(_known_runtime), plugin.Expect(
    lambda: "one of " + ", ".join(f'"{n}"' for n in ["auto", *runtimes()]))]


class ContainerOptions(plugin.Options):
    runtime: Runtime_ = plugin.option(
        "auto", "How containers start: auto takes the first usable of runc, crun, unshare")
    binaries: Programs = plugin.option(
        [], "Host programs to carry into the rootfs beside those the workloads need")
    cpus: HostCpus | None = plugin.option(
        None, "Host CPUs the container may run on (a cpuset); none: all")


class ContainerTarget(Target):
    name = "container"
    description = ("The host's own binaries in fresh Linux namespaces (pid, mount, net, uts, "
                   "ipc), one container per job, started by a container runtime")
    Options = ContainerOptions
    variant_option = "runtime"
    startup_seconds = 0.5
    packages = ("busybox-static",)   # every container's rootfs is built on it

    def __init__(self, name: str, options: plugin.Options, ctx: TargetContext):
        super().__init__(name, options, ctx)
        self.opts: ContainerOptions = options  # type: ignore[assignment]
        self.runtime: Runtime | None = None
        self.dir: Path | None = None
        self._fingerprint: dict[str, Any] | None = None
        self._dir_token: int | None = None
        self._tree_tokens: list[int] = []   # read-only bind mounts in the rootfs copy
        # container id -> journal tokens: remove its cgroups, then (undone first) delete it
        self._undo: dict[str, list[int]] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._alive = True
        self._prepare_lock = threading.Lock()
        # Servers running for host-side clients, by network namespace path.
        self._serving: dict[str, ContainerInstance] = {}

    @classmethod
    def variants(cls) -> dict[str, str | None]:
        return {name: runtime.unavailable() for name, runtime in runtimes().items()}

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

    def probe(self, runtime: Runtime) -> str | None:
        """Run a trivial container; None if it worked, else why not (one line)."""
        runtime.setup_root()
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
                error = self.probe(runtime)
                if error is None:
                    self.runtime = runtime
                    break
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

    def _instance(self, name: str, job: Job, net: Any, log: str) -> ContainerInstance:
        with self._prepare_lock:   # a factory's threads: one rootfs copy, one probe
            self.prepare()
        runtime = self.runtime
        assert runtime is not None and self.dir is not None   # prepared
        if not runtime.joins_netns:
            raise TargetError(f"{self.name}: the {runtime.name} runtime cannot join a network "
                              "namespace vmtax made, so it cannot serve a client on the host "
                              "or be one of many instances yet")
        instance = ContainerInstance(name, runtime, job, self.ctx.journal, net, self.dir / log)
        instance.start()
        return instance

    def start_server(self, job: Job, port: int) -> Endpoint:
        """The server in a container of its own in a network namespace vmtax made, joined
        to the invocation's network by a veth pair."""
        server = self._instance(f"{self.name} server", job, self.ctx.shared_network(),
                                f"server-{port}.log")
        assert server.netns is not None and server.address is not None   # started
        self._serving[server.netns] = server
        seen = server.runtime.kernel_sockets   # else the runner probes with a connection
        endpoint = Endpoint(server.address, port, [], handle=server.netns,
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
                              f"instance-{index}.log")

    def cpus(self) -> set[int] | None:
        return set(self.opts.cpus) if self.opts.cpus else None

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
