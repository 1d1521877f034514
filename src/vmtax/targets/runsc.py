"""gVisor's runsc as a container runtime, built from source on first use.

Debian packages no runsc, and gVisor's Go module needs a newer Go than Debian 12's (1.19).
Debian's go only fetches a pinned Go toolchain from the Go module proxy (the route
GOTOOLCHAIN takes), and that toolchain builds runsc at a pinned gVisor version. The
toolchain, Go's module and build caches and the binary all live under vmtax's cache, so
every host measures the same runsc, built by the same Go, whatever Go it has itself.

Two runtimes share the binary: `runsc` (the systrap platform, gVisor's default) and
`runsc-ptrace`.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import ClassVar

from vmtax import paths, proc
from vmtax.errors import VmtaxError
from vmtax.targets.container import Launch, OciRuntime
from vmtax.types import Job

# gVisor publishes its Go module only as pseudo-versions of its `go` branch.
GVISOR_VERSION = "v0.0.0-20260905035102-160fafc42237"
# gVisor's go.mod asks for Go >= 1.26.3; the newest patch release of that line.
GO_VERSION = "1.26.11"
GO_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
BUILD_TIMEOUT = 1800.0
# How users reach the module proxy (a company mirror); the other GO* variables (GOROOT,
# GOFLAGS, GOOS, ...) would change which Go runs or what it builds, so they are dropped.
GO_NETWORK_VARS = ("GOPROXY", "GONOPROXY", "GOPRIVATE", "GOSUMDB", "GONOSUMDB", "GOINSECURE")
INSTALL = "apt-get install golang-go"


def home() -> Path:
    path = paths.cache_dir() / "runsc"
    path.mkdir(exist_ok=True)
    return path


def binary_path() -> Path:
    return home() / GVISOR_VERSION / "runsc"


def go_arch() -> str | None:
    return GO_ARCH.get(os.uname().machine)


def toolchain_module() -> str:
    return f"golang.org/toolchain@v0.0.1-go{GO_VERSION}.linux-{go_arch()}"


def bootstrap_go() -> str | None:
    """A Go that can fetch the toolchain: Debian's golang-go, else whatever is on PATH."""
    for candidate in ("/usr/bin/go", *sorted(glob.glob("/usr/lib/go-*/bin/go"))):
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("go")


def go_env(gopath: Path) -> dict[str, str]:
    """The environment of every go command: private caches (never ~/go), no toolchain
    switching, no cgo (a cgo-built runsc fails at run time)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GO") or k in GO_NETWORK_VARS}
    env.update(GOPATH=str(gopath), GOMODCACHE=str(gopath / "pkg" / "mod"),
               GOCACHE=str(gopath / "cache"), GOTOOLCHAIN="local", CGO_ENABLED="0",
               # -modcacherw: the module cache stays deletable with the rest of the cache.
               GOFLAGS="-mod=mod -modcacherw")
    return env


def download_command(go: str) -> list[str]:
    return [go, "mod", "download", "-json", toolchain_module()]


def build_command(go: str) -> list[str]:
    # `go install` leaves runsc's version variable unset ("VERSION_MISSING").
    return [go, "install",
            f"-ldflags=-X gvisor.dev/gvisor/runsc/version.version={GVISOR_VERSION}",
            f"gvisor.dev/gvisor/runsc@{GVISOR_VERSION}"]


def run_go(argv: list[str], env: dict[str, str], cwd: Path, what: str,
           owner: str = "runsc") -> str:
    """Run a go command; its stdout, or VmtaxError ("OWNER: WHAT failed") with the end of
    its stderr. Also builds the serving workload's tools (vmtax.serving_tools)."""
    done = proc.run(argv, env=env, cwd=str(cwd), timeout=BUILD_TIMEOUT)
    if done.exit_code != 0:
        why = "timed out" if done.timed_out else f"exit code {done.exit_code}"
        tail = " | ".join(done.stderr.strip().splitlines()[-5:])
        raise VmtaxError(f"{owner}: {what} failed ({why}): {tail}")
    return done.stdout


def fetch_toolchain(gopath: Path, scratch: Path) -> str:
    """The pinned Go toolchain's go command, downloaded by the bootstrap Go if needed."""
    go = bootstrap_go()
    if go is None:
        raise VmtaxError(f"runsc: needs Go to build runsc ({INSTALL})")
    info = json.loads(run_go(download_command(go), go_env(gopath), scratch,
                          f"downloading Go {GO_VERSION}"))
    root = Path(info["Dir"])
    # Module zips carry no file modes: make the toolchain's programs executable again.
    for path in [*(root / "bin").iterdir(), *(root / "pkg" / "tool").rglob("*")]:
        if path.is_file():
            path.chmod(path.stat().st_mode | 0o111)
    return str(root / "bin" / "go")


def build() -> Path:
    """The pinned runsc, built into the cache the first time (2-3 minutes)."""
    target = binary_path()
    if target.exists():
        return target
    if go_arch() is None:
        raise VmtaxError(f"runsc: no Go toolchain for {os.uname().machine}")
    with open(home() / ".lock", "w") as lock:
        # A second vmtax waits for the first one's build instead of doing it again.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        for stale in home().glob(".build-*"):     # left by a build that was killed
            shutil.rmtree(stale)
        gopath = home() / "go"
        scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=home()))
        try:
            go = fetch_toolchain(gopath, scratch)
            run_go(build_command(go), {**go_env(gopath), "GOBIN": str(scratch)}, scratch,
                f"building gVisor {GVISOR_VERSION} with Go {GO_VERSION}")
            # Publish whole: a runsc in the cache is always a complete one.
            scratch.chmod(0o755)
            scratch.rename(target.parent)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        # The toolchain, sources and build cache (1.1 GB) would only speed up the build
        # of another pin; a failed build keeps them for its retry.
        shutil.rmtree(gopath)
    return target


class Runsc(OciRuntime):
    name = "runsc"
    description = ("gVisor's runsc: a user-space kernel between the job and the host, "
                   "systrap platform")
    install = f"built from gVisor's source on first use; needs {INSTALL}"
    packages = ("golang-go",)
    joins_netns = True
    kernel_sockets = False
    platform: ClassVar[str] = "systrap"     # gVisor's way of intercepting system calls

    @classmethod
    def locate(cls) -> str:
        return str(build())

    @classmethod
    def host_note(cls) -> str:
        if binary_path().exists():
            return f"; {binary_path()}"
        return "; built from source on first use (about 3 minutes, from the Go module proxy)"

    @classmethod
    def unavailable(cls) -> str | None:
        # Cheap: only whether a build could run; locate() builds (about 3 minutes, once).
        if binary_path().exists():
            return None
        if go_arch() is None:
            return f"no Go toolchain for {os.uname().machine}"
        if bootstrap_go() is None:
            return f"needs Debian's golang-go to build runsc: {INSTALL}"
        return None

    def __init__(self, binary: str, home: Path, cpus: list[int] | None = None):
        # runsc resolves the bundle and rootfs paths from its own working directory.
        super().__init__(binary, home.resolve(), cpus)

    def global_flags(self) -> list[str]:
        # network=none: the sandbox gets only its own loopback, like the other runtimes'
        # jobs.
        # ignore-cgroups: runsc leaves its cgroup directories behind on this kind of host;
        # it then ignores the cpuset too, so CPUs are confined by affinity (placement).
        # overlay2=none: by default the rootfs gets an overlay that dies with the
        # container, but /work must outlive each job
        # (fileio prepares its files in one job, measures in the next).
        # gofer-network-namespace=new: the default pins a shared namespace with a bind
        # mount under --root that nothing removes, so the container's directory could not
        # be deleted.
        # A server's sandbox joins the namespace vmtax made (network=sandbox): gVisor's own
        # network stack takes over the namespace's veth, with its address and routes.
        network = "--network=sandbox" if self.netns else "--network=none"
        return [f"--platform={self.platform}", network, "--ignore-cgroups",
                "--overlay2=none", "--gofer-network-namespace=new"]

    def placement(self) -> str | None:
        return "affinity" if self.cpus else None

    def launch(self, job: Job) -> Launch:
        launch = super().launch(job)
        assert launch.container is not None   # set by OciRuntime.launch()
        # runsc has no `delete -f`: it spells it `delete --force`.
        launch.undo = [*self.base(), "delete", "--force", launch.container]
        return launch

    def finish(self, launch: Launch) -> bool:
        assert launch.undo is not None   # launch() set it
        # runsc keeps a container's state in files named after it, not in a directory.
        def left() -> bool:
            return any(self.state.glob(f"*{launch.container}*"))
        if left():
            proc.run(launch.undo, timeout=30)
        return not left()


class RunscPtrace(Runsc):
    name = "runsc-ptrace"
    description = ("gVisor's runsc: a user-space kernel between the job and the host, "
                   "ptrace platform")
    platform = "ptrace"
