"""Docker as a container runtime (`container:docker`): dockerd, containerd and runc, driven
through the docker CLI the way a Docker user drives them.

The image. The container target's rootfs (busybox and the workloads' binaries, cached by
the hash of its contents: vmtax.guest.rootfs) is tarred and `docker import`ed once as
`vmtax-rootfs:<hash>`, so the binaries are byte-identical to every other target's. The
image is kept on purpose, as a cache: the next run with the same binaries needs no import.
Remove vmtax's images with `docker image rm $(docker images -q vmtax-rootfs)`.

The containers. Every job runs by `docker exec` in one long-lived container per target,
idling on `sleep`, so the workloads' data directory /work outlives each job (fileio
prepares its files in one job and reads them in the next) on the storage the plan asks
for: the container's overlay root, or a volume (a directory of the target's, bind-mounted).
A server for a host-side client (iperf3, oltp, serving) runs there too (`docker exec`), as
it must see the data the jobs prepared (oltp's database); each instance of a density or
boot study is a container of its own (`docker run --detach`). Clients reach them as a
Docker user's client does: at the container's address on the bridge network, or on the
host's loopback with network = "host". Every container's cgroup is under
/vmtax-docker-<id> (`cgroup()`: the host-cpu collector reads the jobs' CPU time there),
which the target removes after its last container.

The daemon. A dockerd answering on /var/run/docker.sock is used and left running. Where none
does, vmtax starts one (vmtax.host.daemon) that leaves the host's network as it was (see
`DOCKERD_FLAGS`): no iptables rules or policy, no ip_forward, no docker0. Its containers'
bridge is a user-defined network vmtax makes, `vmtax-<id>` on the bridge device `vtd<id>`,
with a /24 of 10.214.0.0/16 that no route of the host's overlaps; the host reaches the
containers directly on it, and the containers reach nothing beyond the host.

Undo. The daemon (journaled before the rest, so stopped after it), the network and every
container are journaled before they are made; containers and the network are removed by `docker rm
--force` and `docker network rm` in this module's undo functions, also by the guardian
after a kill -9.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar

from vmtax.core import paths, plugin
from vmtax.core.errors import TargetError, VmtaxError
from vmtax.core.instance import Instance
from vmtax.core.option_types import size_bytes
from vmtax.core.runtime import (
    CAPABILITIES,
    HOSTNAME,
    Launch,
    Runtime,
    container_env,
    job_cwd,
)
from vmtax.core.target import LISTEN_ENV, REALTIME, Feature, TargetContext
from vmtax.core.types import Job
from vmtax.helpers import runtime_cgroup
from vmtax.host import daemon, proc
from vmtax.host import machine as host
from vmtax.host.journal import Journal, undone_by

SOCKET = Path("/var/run/docker.sock")
HOST = f"unix://{SOCKET}"
IMAGE = "vmtax-rootfs"
# A dockerd vmtax starts changes nothing of the host's network (HOST-NOTES: a default one
# leaves ip_forward on, the FORWARD policy DROP, DOCKER chains, MASQUERADE and docker0):
# --iptables=false: no iptables rules or policies at all (nor bridge-nf settings);
# --ip6tables=false: the same for IPv6 (20.10's default, said for certain);
# --ip-forward=false: net.ipv4.ip_forward is left as it is;
# --ip-masq=false: no MASQUERADE for the bridges' subnets;
# --bridge=none: no default bridge network, so no docker0.
DOCKERD_FLAGS = ("--iptables=false", "--ip6tables=false", "--ip-forward=false",
                 "--ip-masq=false", "--bridge=none")
# The bridge networks' subnets: one /24 per network, skipping any the host routes.
POOL = ipaddress.IPv4Network("10.214.0.0/16")
# vmtax's containers and networks: only such names are removed by a journal entry.
NAME = re.compile(r"vmtax-[0-9a-f]{8,12}")
HOLD = ["sleep", "2147483647"]       # what the job container runs: nothing, for 68 years
CLI_TIMEOUT = 120.0                  # a docker command on a loaded host
START_TIMEOUT = 60.0                 # docker run --detach until the container runs
STOP_GRACE = 30.0                    # a server's clean shutdown (MariaDB's) on SIGTERM
# What Docker applies of `--cpus`: a CFS quota per 100 ms period, in whole microseconds, of
# at least the kernel's 1 ms. Below 0.01 CPUs the quota rounds to nothing (0.0000001 CPUs
# ran unthrottled), or the kernel refuses it; more than the host's CPUs Docker refuses.
CFS_PERIOD_US = 100_000
MIN_CPUS = Fraction(1_000, CFS_PERIOD_US)
# Docker refuses a memory limit below 6 MiB ("Minimum memory limit allowed is 6MB").
MIN_MEMORY = 6 << 20
# A cgroup v1 memory limit at least this large is no limit (the kernel's "unlimited" is
# LONG_MAX rounded down to a page).
UNLIMITED = 1 << 62


def cli() -> list[str]:
    """The docker CLI talking to the daemon on SOCKET, whatever DOCKER_HOST says."""
    return [shutil.which("docker") or "docker", f"--host={HOST}"]


def docker(*args: str, timeout: float = CLI_TIMEOUT, env: dict[str, str] | None = None,
           input: bytes | None = None) -> proc.Completed:
    return proc.run([*cli(), *args], timeout=timeout, env=env, input=input)


def must(what: str, *args: str, timeout: float = CLI_TIMEOUT,
         env: dict[str, str] | None = None) -> str:
    """Run a docker command; its stdout, or VmtaxError naming what failed and why: the
    engine's whole message in one line (its last line is only the CLI's "Run 'docker run
    --help'")."""
    done = docker(*args, timeout=timeout, env=env)
    if done.exit_code != 0:
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines()
                 if line.strip()]
        why = " | ".join(lines) if lines else ("timed out" if done.timed_out
                                               else f"exit status {done.exit_code}")
        raise VmtaxError(f"docker: {what} failed: {why[:1000]}")
    return done.stdout


def dockerd() -> daemon.Daemon:
    return daemon.Daemon("dockerd", (shutil.which("dockerd") or "dockerd", *DOCKERD_FLAGS),
                         SOCKET)


def _named(entry: dict[str, Any]) -> str:
    name = entry.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"docker object {name!r} is not one vmtax makes")
    return name


def remove_container(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo a container vmtax ran: kill and remove it (gone already is fine)."""
    name = _named(entry)
    if daemon.answers(SOCKET):
        done = docker("rm", "--force", name, timeout=60)
        if done.exit_code != 0 and "No such container" not in done.stderr:
            raise VmtaxError(f"docker rm {name}: {done.stderr.strip()[:200]}")


def remove_network(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo a bridge network vmtax made (its containers are removed before it)."""
    name = _named(entry)
    if daemon.answers(SOCKET):
        done = docker("network", "rm", name, timeout=60)
        if done.exit_code != 0 and "not found" not in done.stderr:
            raise VmtaxError(f"docker network rm {name}: {done.stderr.strip()[:200]}")


def host_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks the host routes or has addresses in (every table)."""
    found = []
    for argv in (["ip", "-j", "-4", "route", "show", "table", "all"], ["ip", "-j", "-4", "addr"]):
        out = proc.run(argv, timeout=30).stdout
        for item in json.loads(out or "[]"):
            dsts = [item.get("dst")] + [a.get("local", "") + "/" + str(a.get("prefixlen", 32))
                                        for a in item.get("addr_info", [])]
            for dst in dsts:
                if dst and dst != "default" and dst[0].isdigit():
                    found.append(ipaddress.IPv4Network(dst, strict=False))
    return found


def free_subnets(seed: str) -> list[ipaddress.IPv4Network]:
    """The pool's /24s no host network overlaps, starting at one derived from seed."""
    taken = host_networks()
    subnets = list(POOL.subnets(new_prefix=24))
    first = int(seed, 16) % len(subnets)
    ordered = subnets[first:] + subnets[:first]
    return [s for s in ordered if not any(s.overlaps(t) for t in taken)]


def namespace_pids(pid: int) -> list[int]:
    """The host's processes in the pid namespace of pid (a container's processes)."""
    try:
        inode = os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}/ns/pid").st_ino == inode:
                    found.append(int(entry))
            except OSError:
                pass
    return found


def enforced(pid: int) -> dict[str, Any]:
    """The CPU and memory limits the kernel enforces on process pid's cgroups: "cpus" as
    CFS quota over period, "memory" in bytes (None: no limit), on cgroup v1 or v2."""
    found: dict[str, Any] = {"cpus": None, "memory": None}
    own = runtime_cgroup.own_cgroups(f"/proc/{pid}/cgroup")
    for point, controllers in runtime_cgroup.hierarchies():
        if controllers not in own:
            continue
        at = Path(point + own[controllers])
        v2 = controllers == {""}
        if v2 or "cpu" in controllers:
            quota, period = ((_number(at / "cpu.max"), _number(at / "cpu.max", 1)) if v2 else
                             (_number(at / "cpu.cfs_quota_us"), _number(at / "cpu.cfs_period_us")))
            if quota and period:
                found["cpus"] = quota / period
        if v2 or "memory" in controllers:
            memory = _number(at / ("memory.max" if v2 else "memory.limit_in_bytes"))
            if memory is not None and memory < UNLIMITED:
                found["memory"] = memory
    return found


def _number(path: Path, field: int = 0) -> int | None:
    """The field-th word of a cgroup file as a number; None for none there ("max", v1's
    "-1") or no file."""
    try:
        word = path.read_text().split()[field]
    except (OSError, IndexError):
        return None
    return int(word) if word.isdigit() else None


class Docker(Runtime):
    name = "docker"
    description = ("Docker (dockerd, containerd, runc): vmtax's rootfs imported as an image, "
                   "jobs by docker exec, on a bridge network of vmtax's or the host's")
    install = "apt-get install docker.io"
    packages = ("docker.io",)
    honours = frozenset({"network", "storage", "seccomp", "cpu_limit", "memory_limit"})
    # Docker gives its containers' cgroups no real-time budget (that needs dockerd
    # --cpu-rt-runtime) where the kernel schedules real-time tasks per cgroup.
    refuses: ClassVar[dict[Feature, str]] = (
        {REALTIME: "Docker"} if os.path.exists("/sys/fs/cgroup/cpu/cpu.rt_runtime_us") else {})

    @classmethod
    def locate(cls) -> str:
        found = super().locate()
        if shutil.which("dockerd") is None:
            raise VmtaxError("docker needs dockerd, which is not installed "
                             "(apt-get install docker.io)")
        return found

    @classmethod
    def host_note(cls) -> str:
        if daemon.answers(SOCKET, timeout=0.5):
            return f"; a dockerd answers on {SOCKET}: used as it is and left running"
        return ("; vmtax starts dockerd when a run needs it (no iptables rules, forwarding "
                "or docker0) and stops it afterwards")

    @classmethod
    def unavailable(cls) -> str | None:
        why = super().unavailable()
        if why is None and os.geteuid() != 0:
            return "vmtax must run as root to start dockerd and reach its socket"
        return why

    @classmethod
    def option_problems(cls, options: plugin.Options) -> list[tuple[str, str]]:
        values = options.values()
        cpus, memory = values.get("cpu_limit"), values.get("memory_limit")
        found = []
        if cpus is not None:
            available = len(os.sched_getaffinity(0))
            exact = Fraction(repr(cpus))
            if not MIN_CPUS <= exact <= available:
                found.append(("cpu_limit", f"from {float(MIN_CPUS):g} to {available} CPUs: "
                              "Docker refuses more than the host has, and applies no limit "
                              "at all below 0.01"))
            elif (exact * 10**9).denominator != 1:
                found.append(("cpu_limit", "at most 9 decimal places (Docker refuses a "
                                           "finer --cpus)"))
        if memory is not None and size_bytes(memory) < MIN_MEMORY:
            found.append(("memory_limit", "at least 6M (Docker's minimum)"))
        return found

    def __init__(self, binary: str, home: Path, cpus: list[int] | None = None):
        super().__init__(binary, home, cpus)
        self.id = uuid.uuid4().hex[:8]
        self.home = home
        self.journal: Journal | None = None
        self.settings: dict[str, Any] = {}
        self.trees: tuple[Path, ...] = ()
        self.image = ""
        self.network: str | None = None      # the bridge network's name; None: the host's
        self.jobs: str | None = None         # the container the jobs run in
        self.jobs_address: str | None = None # its address on the bridge network
        self.jobs_pid: int | None = None     # its init, as the host sees it
        self._tokens: list[int] = []         # the network, then the job container
        self._limits: dict[str, Any] = {}    # as Docker and the kernel report them applied

    # -- what the target sees ----------------------------------------------------------

    def placement(self) -> str | None:
        return "cpuset" if self.cpus else None

    def cgroup(self) -> str | None:
        return f"/vmtax-docker-{self.id}"

    def cgroup_dirs(self) -> list[str]:
        # docker makes them with the first container; the target removes them at its end.
        return [f"{point}{self.cgroup()}" for point, _ in host.cgroup_mounts()]

    def version(self) -> str:
        # The daemon's, and its storage driver: what runs the containers.
        out = docker("info", "--format", "{{.ServerVersion}} ({{.Driver}})", timeout=60)
        return f"Docker {out.stdout.strip() or 'unknown'}"

    def attach(self, ctx: TargetContext, options: plugin.Options, source: Path) -> None:
        self.detach()
        self.journal = ctx.journal
        values = options.values()
        self.settings = {"network": values.get("network") or "bridge",
                         "storage": values.get("storage") or "overlay",
                         "seccomp": values.get("seccomp") or "default",
                         "cpu_limit": values.get("cpu_limit"),
                         "memory_limit": values.get("memory_limit")}
        self.trees = ctx.trees
        daemon.ensure(ctx.journal, dockerd(), paths.cache_dir() / "logs")
        self.image = self.import_image(source)
        if self.settings["network"] == "bridge":
            self.make_network()
        if self.settings["storage"] == "volume":
            (self.home / "volume").mkdir(exist_ok=True)   # removed with the target's dir
        self.jobs = f"vmtax-{self.id}"
        self._tokens.append(self.journal_container(self.jobs))
        must("starting the job container",
             *self.run_args(self.jobs, Job(HOLD), data=True))
        self.jobs_pid, self.jobs_address = self.state(self.jobs)
        self._limits = self.applied_limits(self.jobs, self.jobs_pid)

    def applied_limits(self, container: str, pid: int) -> dict[str, Any]:
        """The container's limits as Docker reports them (its HostConfig) and as the kernel
        enforces them (its cgroups); VmtaxError when a limit the plan asks for is not
        enforced, so that no result passes for one measured under it."""
        out = must("inspecting a container", "inspect", "--format",
                   "{{json .HostConfig}}", container)
        config = json.loads(out)
        limits = {"docker": {key: config.get(key) for key in (
                      "NanoCpus", "CpuQuota", "CpuPeriod", "CpusetCpus", "Memory",
                      "MemorySwap")},
                  "enforced": enforced(pid)}
        wanted, applied = self.settings["cpu_limit"], limits["enforced"]["cpus"]
        if wanted and (applied is None or abs(applied - wanted) > 1 / CFS_PERIOD_US):
            raise VmtaxError(f"docker: cpu_limit {wanted:g} asked for, but the container's "
                             f"cgroup enforces {f'{applied:g} CPUs' if applied else 'no limit'}")
        memory, applied = self.settings["memory_limit"], limits["enforced"]["memory"]
        if memory and (applied is None   # the kernel rounds it down to whole pages
                       or abs(applied - size_bytes(memory)) >= os.sysconf("SC_PAGE_SIZE")):
            raise VmtaxError(f"docker: memory_limit {memory} asked for, but the container's "
                             f"cgroup enforces {f'{applied} bytes' if applied else 'no limit'}")
        return limits

    def limits(self) -> dict[str, Any]:
        return dict(self._limits)

    def detach(self) -> None:
        while self._tokens and self.journal is not None:
            self.journal.undo(self._tokens.pop())
        self.jobs = self.jobs_address = self.jobs_pid = self.network = None

    def state(self, container: str) -> tuple[int, str]:
        """A running container's init (its host pid) and its address (the bridge
        network's, or 127.0.0.1 on the host's network); VmtaxError when it is not running."""
        out = must("inspecting a container", "inspect", "--format",
                   "{{json .State}}\t{{json .NetworkSettings.Networks}}", container)
        state, networks = (json.loads(part) for part in out.strip().split("\t"))
        if not state.get("Running") or not state.get("Pid"):
            raise VmtaxError(f"docker: container {container} is not running (exit status "
                             f"{state.get('ExitCode')})")
        if self.network is None:
            return state["Pid"], "127.0.0.1"
        address = (networks or {}).get(self.network, {}).get("IPAddress")
        if not address:
            raise VmtaxError(f"docker: container {container} has no address on "
                             f"{self.network}")
        return state["Pid"], address

    def on_host_network(self, job: Job) -> Job:
        """job as a server on the host's network runs it: listening on loopback only."""
        if self.network is not None:
            return job
        return dataclasses.replace(job, env={**job.env, LISTEN_ENV: "127.0.0.1"})

    def import_image(self, source: Path) -> str:
        """The image of the cached rootfs at source, imported the first time."""
        tag = f"{IMAGE}:{source.name}"
        if docker("image", "inspect", tag, timeout=60).exit_code == 0:
            return tag
        tar = subprocess.Popen(["tar", "-C", str(source), "--numeric-owner",
                                "--exclude=./.complete", "-c", "."],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert tar.stdout is not None
        try:
            done = subprocess.run([*cli(), "import", "-", tag], stdin=tar.stdout,
                                  capture_output=True, text=True, timeout=600)
        finally:
            tar.stdout.close()
            tar.wait()
        if done.returncode != 0 or tar.returncode != 0:
            raise VmtaxError(f"docker: importing {source} as {tag} failed: "
                             f"{done.stderr.strip()[-300:] or 'tar failed'}")
        return tag

    def make_network(self) -> None:
        """A bridge network of vmtax's, on a subnet no route of the host's overlaps."""
        assert self.journal is not None
        name = f"vmtax-{self.id}"
        self._tokens.append(self.journal.add(type="docker-network", name=name,
                                             undo=undone_by(remove_network)))
        why = "no free /24 in " + str(POOL)
        for subnet in free_subnets(self.id)[:16]:
            done = docker("network", "create", "--driver=bridge", f"--subnet={subnet}",
                          f"--gateway={subnet[1]}",
                          f"--opt=com.docker.network.bridge.name=vtd{self.id}", name)
            if done.exit_code == 0:
                self.network = name
                return
            why = done.stderr.strip()[:300]
            if "overlap" not in why:   # another's network there: try the next subnet
                break
        raise VmtaxError(f"docker: creating the bridge network {name} failed: {why}")

    def journal_container(self, name: str) -> int:
        assert self.journal is not None
        return self.journal.add(type="docker-container", name=name,
                                undo=undone_by(remove_container))

    def run_args(self, name: str, job: Job, data: bool = False) -> list[str]:
        """`docker run --detach` of job in a new container `name` with the plan's options;
        data: the workloads' data directory is the volume when storage = "volume"."""
        args = ["run", "--detach", f"--name={name}", f"--cgroup-parent={self.cgroup()}",
                f"--workdir={job_cwd(job)}"]
        if self.network:
            args += [f"--network={self.network}", f"--hostname={HOSTNAME}"]
        else:   # Docker refuses a host name of the container's own with the host's network
            args.append("--network=host")
        if self.settings["seccomp"] == "unconfined":
            args.append("--security-opt=seccomp=unconfined")
        if self.cpus:
            args.append(f"--cpuset-cpus={','.join(map(str, sorted(self.cpus)))}")
        if self.settings["cpu_limit"]:
            args.append(f"--cpus={self.settings['cpu_limit']}")
        if self.settings["memory_limit"]:
            args.append(f"--memory={self.settings['memory_limit']}")
        if data and self.settings["storage"] == "volume":
            args.append(f"--volume={self.home / 'volume'}:/work")
        args += [f"--volume={tree}:{tree}:ro" for tree in self.trees]
        args += self.env_args(job)
        return [*args, self.image, *job.argv]

    def env_args(self, job: Job) -> list[str]:
        """--env flags giving exactly the job's environment; a secret's value reaches the
        CLI through its own environment (`secret_env`), never its argv."""
        return [f"--env={k}" if v in job.secrets else f"--env={k}={v}"
                for k, v in container_env(job).items()]

    @staticmethod
    def secret_env(job: Job) -> dict[str, str] | None:
        secret = {k: v for k, v in container_env(job).items() if v in job.secrets}
        return {**os.environ, **secret} if secret else None

    def launch(self, job: Job) -> Launch:
        if self.jobs is None:
            raise VmtaxError("docker: launch before attach")
        extra = [c for c in job.capabilities if c not in CAPABILITIES]
        if extra:
            raise VmtaxError(f"docker: the job needs {', '.join(extra)}, beyond Docker's "
                             "default capabilities, which vmtax's container keeps")
        argv = [*cli(), "exec", f"--workdir={job_cwd(job)}", *self.env_args(job), self.jobs,
                *job.argv]
        return Launch(argv, env=self.secret_env(job))

    def finish(self, launch: Launch) -> bool:
        # Called after a kill: the processes of `docker exec` are the container's, not the
        # CLI's, and outlive it.
        self.signal_jobs("KILL")
        return True

    def signal_jobs(self, signal: str) -> None:
        """Signal every process in the job container but its idle init: kill(-1) in its pid
        namespace. Jobs run one at a time, and a server only while no job runs."""
        if self.jobs is not None:
            docker("exec", self.jobs, "kill", f"-{signal}", "-1", timeout=60)

    def instance(self, name: str, job: Job, log: Path, server: bool) -> Instance | None:
        # The server sees the data the jobs prepared (oltp's data directory) where they
        # left it: in the job container, whose storage the plan chose.
        return (ExecServer(name, self, job, log) if server
                else DockerInstance(name, self, job, log))


class ExecServer(Instance):
    """A server for a host-side client, run by `docker exec` in the job container and
    reached at that container's address."""

    def __init__(self, name: str, runtime: Docker, job: Job, log: Path):
        super().__init__(name)
        self.runtime = runtime
        self.job = job
        self.log = log
        self._proc: subprocess.Popen[bytes] | None = None
        self._token: int | None = None

    def _start(self) -> None:
        started = time.monotonic()
        launch = self.runtime.launch(self.runtime.on_host_network(self.job))
        with open(self.log, "wb") as log:
            self._proc = proc.spawn(launch.argv, env=launch.env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self._token = self.runtime.journal.process(self._proc.pid) \
            if self.runtime.journal else None
        self.address = self.runtime.jobs_address
        self.boot_seconds = time.monotonic() - started

    def stop(self) -> None:
        if self._proc is not None:
            # The CLI ends when its process does; killing the CLI would leave that running.
            # SIGTERM first: MariaDB shuts down cleanly on it.
            if self._proc.poll() is None:
                self.runtime.signal_jobs("TERM")
                try:
                    self._proc.wait(timeout=STOP_GRACE)
                except subprocess.TimeoutExpired:
                    self.runtime.signal_jobs("KILL")
            proc.kill_group(self._proc)
            self._proc = None
        if self._token is not None and self.runtime.journal is not None:
            self.runtime.journal.forget(self._token)
        self._token = None
        self.address = None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def host_pids(self) -> list[int]:
        init = self.runtime.jobs_pid
        return [pid for pid in namespace_pids(init) if pid != init] if init else []


class DockerInstance(Instance):
    """job in a container of its own (`docker run --detach`), on the runtime's bridge
    network at the address Docker gives it, or on the host's network at 127.0.0.1."""

    def __init__(self, name: str, runtime: Docker, job: Job, log: Path):
        super().__init__(name)
        self.runtime = runtime
        self.job = job
        self.log = log
        self.container: str | None = None
        self._token: int | None = None
        self._pid: tuple[int, int | None] | None = None   # its init: pid, start time

    def _start(self) -> None:
        started = time.monotonic()
        job = self.runtime.on_host_network(self.job)
        self.container = f"vmtax-{uuid.uuid4().hex[:12]}"
        self._token = self.runtime.journal_container(self.container)
        try:
            must(f"starting {self.name}", *self.runtime.run_args(self.container, job),
                 timeout=START_TIMEOUT, env=self.runtime.secret_env(job))
            pid, self.address = self.runtime.state(self.container)
        except VmtaxError as exc:
            raise TargetError(f"{self.name}: {exc}: {self._log_tail()}") from None
        self._pid = (pid, proc.process_start_time(pid))
        self.boot_seconds = time.monotonic() - started

    def _log_tail(self) -> str:
        """The container's last lines of output, kept in `log` too."""
        assert self.container is not None
        done = docker("logs", "--tail=20", self.container, timeout=60)
        text = done.stdout + done.stderr
        self.log.write_text(text)
        return " | ".join(text.strip().splitlines()[-3:])

    def stop(self) -> None:
        if self._token is not None and self.runtime.journal is not None:
            self.runtime.journal.undo(self._token)
        self._token = None
        self.container = self._pid = self.address = None

    def alive(self) -> bool:
        return self._pid is not None and proc.running(*self._pid)

    def host_pids(self) -> list[int]:
        return namespace_pids(self._pid[0]) if self.alive() and self._pid else []
