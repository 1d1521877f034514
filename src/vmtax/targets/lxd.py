"""lxd: a system container from an image of vmtax's own rootfs, made by LXD or by plain LXC.

The image is vmtax's rootfs (vmtax.guest.rootfs: busybox, the workloads' binaries and their
libraries, byte-identical to every other target's) with an inittab that only idles, and a
metadata.yaml, imported once by `lxc image import` under the alias
`vmtax-rootfs-<rootfs hash>-<format>`: cached on purpose, like the rootfs itself, so a
launch takes ~0.2 s. Each target launches one unprivileged container (LXD's default: a
user namespace, uid 0 inside is 100000 outside) and runs every job in it through LXD's REST
API on its unix socket rather than `lxc exec`: a job's environment (oltp's password) goes in
the request's body instead of a host process's argv, and neither a job nor a detached
server keeps an `lxc` client on the host (density counts the container alone); more in
vmtax.helpers.lxd_api. `/work`, the jobs' scratch directory, is in the container's own root
on the host's disk. Its limits are those of an LXD profile of its own: `limits.cpu` (`cpus`,
a count LXD places and balances; or `pin`, a set of host CPUs) and `limits.memory`
(`memory`); /dev/shm is a tmpfs, as a distribution's init would mount it.

What vmtax makes in LXD it makes for itself and removes: a `dir` storage pool and a profile
per target (the profile holds the root disk on that pool, the limits and read-only disks
for the host trees the workloads read), the containers with the log directory LXD keeps of
each (/var/log/lxd/<name>, which LXD leaves when it deletes one), and the daemon when none
ran. Each is journaled before it is made and undone newest first, so on exit, Ctrl-C or
after `kill -9` (the guardian) the containers go while LXD still answers, then the profile
and the pool, and the daemon last. What LXD refuses to delete yet (a container that failed
to start is busy with LXD's own stop of it for seconds, its profile in use meanwhile) stays
journaled, the daemon with it, and is retried in the same order. LXD's existing
configuration (its default profile, its pools, its networks) is never read into a
container nor changed, so no `lxd init` is needed: a never-initialised LXD stays
uninitialised (`lxd init --auto` fails here anyway, finding no unused IPv4 subnet for
lxdbr0). LXD still writes its database under
/var/lib/lxd the first time it starts, and tries to fetch its instance types from
images.linuxcontainers.org at each start (refused here: no network beyond the registries).

The network is vmtax's own bridge, never lxdbr0: LXD's managed bridge needs a subnet of the
host's, NAT rules and a dnsmasq, all changes to the host's own network, and this host has
no unused subnet for it. The container's namespace (loopback only, as LXD makes it with no
NIC device) is joined to vmtax's bridge by a veth pair, as a container target's server is,
and host-side clients reach it from the bridge's namespace.

`lxd:lxc` (manager = "lxc") is the same container made by plain LXC, with no daemon:
`lxc-start` of a config file vmtax writes (no NIC, the same /dev/shm, the limits as cgroup
keys of the host's layout: a count of CPUs is the first that many, LXC does not balance),
on a copy of the same rootfs of the container's own, its ids shifted as LXD shifts them,
in a directory of vmtax's under /var/lib/lxc; jobs through `lxc-attach`. Same network,
same journal discipline: the container (`lxc-stop --kill`), then its directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import secrets
import shutil
import tarfile
import threading
import time
from pathlib import Path
from typing import Any, Literal

from vmtax.core import paths, plugin
from vmtax.core.errors import TargetError, VmtaxError
from vmtax.core.instance import Instance
from vmtax.core.option_types import HostCpus, Programs, Size, cpulist
from vmtax.core.target import Target, TargetContext
from vmtax.core.types import Endpoint, Job, JobResult
from vmtax.guest import rootfs
from vmtax.helpers import lxd_api
from vmtax.host import daemon, network, proc
from vmtax.host import machine as host
from vmtax.host.journal import Journal
from vmtax.targets.lxd_instance import LxcInstance, LxdInstance, SystemContainer

# What each manager needs on the host, and the Debian packages that have it.
MANAGERS = {"lxd": (("lxd", "lxc"), "lxd lxd-client"),
            "lxc": (("lxc-start", "lxc-attach"), "lxc")}
# Debian's LXC directory of containers; vmtax's go in a directory of their own in it.
LXC_ROOT = Path("/var/lib/lxc")
SHM = "lxc.mount.entry = tmpfs dev/shm tmpfs rw,nosuid,nodev,mode=1777,create=dir 0 0"
IMAGE_FORMAT = "1"     # bump when the image's layout changes
# busybox init with this inittab starts nothing and waits: no console shell, no getty.
INITTAB = "::sysinit:/bin/true\n"
# No systemd here: `lxd --group root` in the foreground, as Debian's unit runs it.
DAEMON = daemon.Daemon("lxd", ("lxd", "--group", "root"), lxd_api.SOCKET)
READY_TIMEOUT = 120.0
IMPORT_TIMEOUT = 300.0


def lxd_size(size: str) -> str:
    """A size as vmtax writes it ("512M") as LXD reads it ("512MiB")."""
    return size[:-1] + size[-1].upper() + "iB"


def _missing(manager: str) -> str | None:
    """Why this host cannot run containers of manager (None: it can)."""
    programs, packages = MANAGERS[manager]
    gone = [p for p in programs if shutil.which(p) is None]
    return f"{' and '.join(gone)} not installed (apt-get install {packages})" if gone else None


class LxdOptions(plugin.Options):
    manager: Literal["lxd", "lxc"] = plugin.option(
        "lxd", "What makes the container: the LXD daemon (lxd) or plain LXC's lxc-start, "
        "no daemon (lxc); also as lxd:lxc")
    cpus: int | None = plugin.option(
        None, "limits.cpu as a count: LXD gives the container that many host CPUs and "
        "balances them (plain LXC: the first that many); none: all", unit="CPUs", ge=1,
        cli=True, tune=(1,))
    pin: HostCpus | None = plugin.option(
        None, "limits.cpu as a set: the host CPUs the container runs on; none: LXD places it")
    memory: Size | None = plugin.option(
        None, "limits.memory: the container's memory limit; none: unlimited", unit="bytes",
        cli=True)
    storage: Literal["dir"] = plugin.option(
        "dir", "Storage backend of the pool vmtax makes for the container's root (dir: a "
        "directory on the host's filesystem)")
    network: Literal["vmtax"] = plugin.option(
        "vmtax", "vmtax's own bridge in a namespace of its own, joined by a veth (lxdbr0 "
        "would need a host subnet and NAT rules)")
    privileged: bool = plugin.option(
        False, "security.privileged: no user namespace (uid 0 inside is the host's root)")
    binaries: Programs = plugin.option(
        [], "Host programs to carry into the image beside those the workloads need")

    def problems(self) -> list[tuple[str, str]]:
        found = []
        if os.geteuid() != 0:
            found.append(("manager", "vmtax run as root (sudo): it starts LXD or LXC and "
                                     "joins its containers to its network"))
        if self.cpus is not None and self.pin is not None:
            found.append(("pin", "either cpus (a count) or pin (a set), not both: both are "
                                 "limits.cpu"))
        if self.cpus is not None and self.cpus > len(os.sched_getaffinity(0)):
            found.append(("cpus", f"at most the {len(os.sched_getaffinity(0))} CPUs "
                                  "vmtax may use"))
        return found

    def profile_config(self) -> dict[str, str]:
        """The profile's config keys."""
        config = {"security.privileged": "true" if self.privileged else "false",
                  # /dev/shm, a tmpfs as a distribution's init mounts it (and an OCI
                  # runtime does): mounted by LXC before init, so no job can miss it.
                  "raw.lxc": SHM}
        if self.cpus is not None:
            config["limits.cpu"] = str(self.cpus)
        if self.pin is not None:   # a range, even of one CPU: "1" alone would be a count
            config["limits.cpu"] = ",".join(f"{c}-{c}" for c in self.pin)
        if self.memory is not None:
            config["limits.memory"] = lxd_size(self.memory)
        return config


    def lxc_config(self, trees: tuple[Path, ...] = ()) -> list[str]:
        """Plain LXC's config lines for the same container: no NIC, /dev, /proc, /sys and
        the cgroups as LXD sets them up, the limits on the host's cgroup layout (a count
        of CPUs is the first that many: LXC does not balance them), the trees read-only."""
        v2 = host.cgroup_layout() == "unified"
        cgroup = "lxc.cgroup2" if v2 else "lxc.cgroup"
        lines = ["lxc.net.0.type = empty", "lxc.autodev = 1",
                 "lxc.mount.auto = proc:mixed sys:mixed cgroup:mixed", SHM,
                 "lxc.init.cmd = /sbin/init", "lxc.tty.max = 0", "lxc.console.path = none"]
        cpus = self.pin or (sorted(os.sched_getaffinity(0))[:self.cpus] if self.cpus else None)
        if cpus:
            lines.append(f"{cgroup}.cpuset.cpus = {cpulist(cpus)}")
        if self.memory is not None:
            key = "memory.max" if v2 else "memory.limit_in_bytes"
            lines.append(f"{cgroup}.{key} = {self.memory.upper()}")
        lines += [f"lxc.mount.entry = {tree} {str(tree).lstrip('/')} none bind,ro,create=dir 0 0"
                  for tree in trees]
        return lines


def image_alias(source: Path) -> str:
    return f"{lxd_api.PREFIX}rootfs-{source.name}-{IMAGE_FORMAT}"


def write_image(source: Path, meta: Path, root: Path) -> None:
    """The image's two tarballs: metadata.yaml, and the rootfs with its inittab."""
    description = f"vmtax rootfs {source.name}"
    metadata = (f"architecture: {os.uname().machine}\ncreation_date: {int(time.time())}\n"
                f"properties:\n  description: {description}\n  os: busybox\n")
    with tarfile.open(meta, "w") as tar:
        _add_bytes(tar, "metadata.yaml", metadata.encode())
    with tarfile.open(root, "w") as tar:
        for entry in sorted(source.iterdir()):
            if entry.name != ".complete":
                tar.add(entry, arcname=entry.name)
        _add_bytes(tar, "etc/inittab", INITTAB.encode())


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
    tar.addfile(info, io.BytesIO(data))


def ensure_image(client: lxd_api.Lxd, source: Path, work_dir: Path) -> str:
    """The image of rootfs `source` in LXD (imported unless there); its alias. One vmtax
    at a time imports (a lock in the cache)."""
    alias = image_alias(source)
    lock = paths.cache_dir() / "lxd-image.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if client.exists(f"/1.0/images/aliases/{alias}"):
            return alias
        build = work_dir / f"lxd-image-{secrets.token_hex(3)}"
        build.mkdir(parents=True)
        try:
            write_image(source, build / "meta.tar", build / "rootfs.tar")
            done = proc.run(["lxc", "image", "import", str(build / "meta.tar"),
                             str(build / "rootfs.tar"), "--alias", alias],
                            timeout=IMPORT_TIMEOUT)
        finally:
            shutil.rmtree(build, ignore_errors=True)
        if done.exit_code != 0:
            raise TargetError(f"lxc image import of {source} failed: "
                              f"{(done.stderr or done.stdout).strip()[-300:]}")
    return alias


def ensure_daemon(journal: Journal, log_dir: Path, client: lxd_api.Lxd) -> bool:
    """LXD answering and ready: True if vmtax started it (journaled before anything of the
    target's, so stopped last)."""
    started = daemon.ensure(journal, DAEMON, log_dir, timeout=READY_TIMEOUT)
    done = proc.run(["lxd", "waitready", f"--timeout={READY_TIMEOUT:.0f}"],
                    timeout=READY_TIMEOUT + 10)
    if done.exit_code != 0:
        raise TargetError(f"LXD did not get ready: {(done.stderr or done.stdout).strip()[-200:]}"
                          f" (its log: {log_dir / (DAEMON.name + '.log')})")
    client.server()
    return started


class LxdTarget(Target):
    name = "lxd"
    description = ("A system container from an image of vmtax's rootfs, by LXD (unprivileged, "
                   "dir storage, jobs through its REST API) or by plain LXC (no daemon)")
    Options = LxdOptions
    variant_option = "manager"
    startup_seconds = 1.0
    shares_host_page_cache = True      # a container: the host's kernel caches its files
    small_options = {"cpus": 1}
    packages = ("lxd", "lxd-client", "lxc", "busybox-static")

    def __init__(self, name: str, options: plugin.Options, ctx: TargetContext):
        super().__init__(name, options, ctx)
        self.opts: LxdOptions = options  # type: ignore[assignment]
        self.client = lxd_api.Lxd()
        self.id = secrets.token_hex(3)
        self.profile = f"{lxd_api.PREFIX}{self.id}"
        self.image: str | None = None          # LXD's image alias
        self.lxcpath: Path | None = None       # LXC's directory of containers
        self._source: Path | None = None       # set up: the rootfs every container copies
        self._tokens: list[int] = []           # LXD's pool and profile; LXC's directory
        self._setup_lock = threading.Lock()
        self._main: SystemContainer | None = None
        self._servers: set[str] = set()        # handles of the main container's servers
        self._fingerprint: dict[str, Any] | None = None

    @classmethod
    def variants(cls) -> dict[str, str | None]:
        return {manager: _missing(manager) for manager in MANAGERS}

    @classmethod
    def unavailable(cls) -> str | None:
        whys = list(cls.variants().values())
        return None if None in whys else whys[0]

    # -- what every container of the target shares --

    def _setup(self) -> None:
        with self._setup_lock:
            if self._source is not None:
                return
            why = self.variants()[self.opts.manager]
            if why is not None:
                raise VmtaxError(f"{self.name}: {why}")
            source = rootfs.build([*self.ctx.binaries, *self.opts.binaries])
            if self.opts.manager == "lxd":
                self._setup_lxd(source)
            else:
                self._setup_lxc()
            self._source = source

    def _setup_lxd(self, source: Path) -> None:
        """The daemon, a storage pool and a profile of the target's own, the image."""
        ensure_daemon(self.ctx.journal, Path(self.ctx.work_dir) / "lxd", self.client)
        pool = self.profile
        self._tokens.append(lxd_api.journaled(self.ctx.journal, "lxd pool", pool, self.client))
        self.client.do("POST", "/1.0/storage-pools", {"name": pool, "driver": self.opts.storage})
        devices: dict[str, dict[str, str]] = {"root": {"type": "disk", "path": "/",
                                                       "pool": pool}}
        for i, tree in enumerate(self.ctx.trees):
            devices[f"tree{i}"] = {"type": "disk", "source": str(tree), "path": str(tree),
                                   "readonly": "true"}
        self._tokens.append(lxd_api.journaled(self.ctx.journal, "lxd profile", self.profile,
                                              self.client))
        self.client.do("POST", "/1.0/profiles", {
            "name": self.profile, "description": f"vmtax target {self.name}",
            "config": self.opts.profile_config(), "devices": devices})
        self.image = ensure_image(self.client, source, Path(self.ctx.work_dir))

    def _setup_lxc(self) -> None:
        """A directory of the target's containers among LXC's own (an unprivileged
        container's root, a host id of its own, must be able to pass through it)."""
        self.lxcpath, token = self.ctx.journal.make_dir(LXC_ROOT, lxd_api.PREFIX)
        self._tokens.append(token)
        self.lxcpath.chmod(0o711)

    def _instance(self, label: str, net: Any = None,
                  job: Job | None = None) -> SystemContainer:
        self._setup()
        name = f"{self.profile}-{secrets.token_hex(2)}"
        instance: SystemContainer
        if self.opts.manager == "lxd":
            assert self.image is not None
            instance = LxdInstance(label, name, self.client, self.ctx.journal, self.image,
                                   self.profile, net, job)
        else:
            assert self.lxcpath is not None and self._source is not None
            instance = LxcInstance(label, name, self.lxcpath, self._source, INITTAB,
                                   self.opts.lxc_config(self.ctx.trees),
                                   self.opts.privileged, self.ctx.journal, net, job)
        instance.start()
        return instance

    # -- the target's own container --

    def prepare(self) -> None:
        if self._main is not None:
            return
        try:
            self._main = self._instance(self.name)
            self._fingerprint = {
                "kind": self.kind, "manager": self.opts.manager, **self._versions(),
                "network": "vmtax bridge (veth)", "dev_shm": "tmpfs",
                "rootfs": self._source.name if self._source else None,
                "privileged": self.opts.privileged, "cpus": self.opts.cpus,
                "pin": self.opts.pin, "memory": self.opts.memory}
        except BaseException:
            # Why it failed is what is raised; what cleanup() cannot undo stays journaled.
            with contextlib.suppress(Exception):
                self.cleanup()
            raise

    def _versions(self) -> dict[str, Any]:
        if self.opts.manager == "lxd":
            env = self.client.server().get("environment", {})
            return {"lxd_version": env.get("server_version"),
                    "driver": f"{env.get('driver')} {env.get('driver_version')}",
                    "storage": self.opts.storage, "image": self.image}
        version = proc.run(["lxc-start", "--version"], timeout=30).stdout.strip()
        return {"lxc_version": version, "storage": "dir (a copy of the rootfs)"}

    def _main_instance(self) -> SystemContainer:
        if self._main is None:
            raise TargetError(f"{self.name}: run() before prepare()")
        return self._main

    def run(self, job: Job) -> JobResult:
        return self._main_instance().run(job)

    def start_server(self, job: Job, port: int) -> Endpoint:
        """The server detached in the target's container, which joins the invocation's
        network (a veth on vmtax's bridge) the first time."""
        main = self._main_instance()
        main.attach(self.ctx.shared_network())
        handle = main.serve(job)
        self._servers.add(handle)
        assert main.address is not None
        if not network.wait_tcp_listening(lambda: [main.init_pid], port, job.timeout,
                                          lambda: main.serving(handle)):
            self._servers.discard(handle)
            raise TargetError(f"{self.name}: {job.argv[0]} does not listen on port {port} in "
                              f"the container after {job.timeout:g} s ({main.end(handle)})")
        return Endpoint(main.address, port, [], handle=handle,
                        client_preexec=main.client_preexec, listening=True)

    def stop_server(self, endpoint: Endpoint) -> None:
        handle = str(endpoint.handle)
        if handle in self._servers and self._main is not None:
            self._servers.discard(handle)
            self._main.end(handle)

    def make_instance(self, index: int, network: Any, job: Job | None = None) -> Instance:
        """A container of this configuration on `network`, running job (or idling) until
        stopped."""
        return self._instance(f"{self.name}#{index}", network, job)

    def cpus(self) -> set[int] | None:
        return set(self.opts.pin) if self.opts.pin else None

    def host_pids(self) -> list[int]:
        return self._main.host_pids() if self._main is not None else []

    def alive(self) -> bool:
        return self._main is None or self._main.alive()

    def cleanup(self) -> None:
        for handle in list(self._servers):
            self.stop_server(Endpoint("", 0, handle=handle))
        main, self._main = self._main, None
        tokens, self._tokens = self._tokens, []
        self._source = self.image = self.lxcpath = None
        # Newest first; the first that fails stops the rest, which need it gone (a profile
        # in use by the container), and leaves them all journaled: the journal's undo
        # retries them in the same order.
        if main is not None:
            main.stop()
        for token in reversed(tokens):
            self.ctx.journal.undo(token)

    def fingerprint(self) -> dict[str, Any]:
        if self._fingerprint is None:
            raise TargetError(f"{self.name}: fingerprint() before prepare()")
        return dict(self._fingerprint)
