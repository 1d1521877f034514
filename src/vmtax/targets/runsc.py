"""gVisor's runsc as a container runtime, built from source on first use.

Debian packages no runsc, and gVisor's Go module needs a newer Go than Debian 12's (1.19):
the pinned Go toolchain (vmtax.helpers.go_toolchain) builds runsc at a pinned gVisor
version. Go's module and build caches and the binary all live under vmtax's cache, so
every host measures the same runsc, built by the same Go, whatever Go it has itself.

Two runtimes share the binary: `runsc` (the systrap platform, gVisor's default) and
`runsc-ptrace`.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from typing import ClassVar

from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.core.runtime import Launch
from vmtax.core.target import REALTIME, Feature
from vmtax.core.types import Job
from vmtax.helpers import go_toolchain
from vmtax.helpers.oci_runtime import OciRuntime
from vmtax.host import build_progress, proc

# gVisor publishes its Go module only as pseudo-versions of its `go` branch.
GVISOR_VERSION = "v0.0.0-20260905035102-160fafc42237"


def home() -> Path:
    path = paths.cache_dir() / "runsc"
    path.mkdir(exist_ok=True)
    return path


def binary_path() -> Path:
    return home() / GVISOR_VERSION / "runsc"


def build_command(go: str) -> list[str]:
    # `go install` leaves runsc's version variable unset ("VERSION_MISSING").
    return [go, "install",
            f"-ldflags=-X gvisor.dev/gvisor/runsc/version.version={GVISOR_VERSION}",
            f"gvisor.dev/gvisor/runsc@{GVISOR_VERSION}"]


def build() -> Path:
    """The pinned runsc, built into the cache the first time (2-3 minutes)."""
    target = binary_path()
    if target.exists():
        return target
    if go_toolchain.go_arch() is None:
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
            with build_progress.Build("gVisor's runsc", "runsc", logged=False) as progress:
                progress.describe(f"downloading Go {go_toolchain.GO_VERSION}")
                go = go_toolchain.fetch_toolchain(gopath, scratch, "runsc", "runsc")
                what = f"building gVisor {GVISOR_VERSION} with Go {go_toolchain.GO_VERSION}"
                progress.describe(what)
                go_toolchain.run_go(
                    build_command(go), {**go_toolchain.go_env(gopath), "GOBIN": str(scratch)},
                    scratch, what, "runsc")
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
    install = f"built from gVisor's source on first use; needs {go_toolchain.INSTALL}"
    packages = ("golang-go",)
    joins_netns = True
    kernel_sockets = False
    # gVisor schedules its tasks itself, with SCHED_NORMAL only: sched_setscheduler(2)
    # refuses a real-time policy, which cyclictest reports as "run as root".
    refuses: ClassVar[dict[Feature, str]] = {REALTIME: "gVisor"}
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
        if go_toolchain.go_arch() is None:
            return f"no Go toolchain for {os.uname().machine}"
        if go_toolchain.bootstrap_go() is None:
            return f"needs Debian's golang-go to build runsc: {go_toolchain.INSTALL}"
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
