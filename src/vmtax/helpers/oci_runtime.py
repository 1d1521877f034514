"""The base of container runtimes with a runc-compatible command line (runc, crun, gVisor's
runsc): the OCI runtime spec of one job and `BIN --root STATE run --bundle B ID`.

Shared by runtime plugins in more than one module (vmtax.targets.container's runc and crun,
vmtax.targets.runsc), which build on the contract in vmtax.core.runtime.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any, Callable

from vmtax.core.runtime import (
    HOSTNAME,
    NAMESPACES,
    Launch,
    Runtime,
    chain,
    container_env,
    job_capabilities,
    job_cwd,
)
from vmtax.core.types import Job
from vmtax.helpers.runtime_cgroup import TargetCgroup

# Real-time budget of a container's cgroup where the kernel schedules real-time tasks per
# cgroup (CONFIG_RT_GROUP_SCHED, cgroup v1): a new cgroup gets none, so SCHED_FIFO fails
# ("Unable to change scheduling policy") even with CAP_SYS_NICE. Half of every second, as
# the host's default leaves 95% to its own real-time tasks.
RT_GROUP_FILE = "/sys/fs/cgroup/cpu/cpu.rt_runtime_us"
RT_RUNTIME_US, RT_PERIOD_US = 500_000, 1_000_000


def oci_config(job: Job, root: Path, cpus: list[int] | None = None,
               netns: str | None = None) -> dict[str, Any]:
    """The OCI runtime spec of one job: its process in the rootfs copy, no network but lo
    (or the network namespace at `netns`, made by vmtax.host.network), on the host CPUs `cpus`
    (a cpuset) when given, with the capabilities it asks for."""
    caps = job_capabilities(job)
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


class OciRuntime(Runtime):
    """A runc-compatible CLI: `BIN --root STATE run --bundle B ID` with a generated config."""

    def __init__(self, binary: str, home: Path, cpus: list[int] | None = None):
        super().__init__(binary, home, cpus)
        self.bundle = home / "bundle"
        # Private state instead of /run/<runtime>: nothing of ours lands in host-wide dirs.
        self.state = home / "state"
        # Every launch's runtime process joins it, so its containers are counted there.
        self.target_cgroup = TargetCgroup()

    def global_flags(self) -> list[str]:
        return []

    def preexec(self) -> Callable[[], None] | None:
        return None

    def base(self) -> list[str]:
        return [self.binary, "--root", str(self.state), *self.global_flags()]

    def setup_root(self) -> None:
        self.target_cgroup.make()

    def cgroup_dirs(self) -> list[str]:
        return self.target_cgroup.dirs()

    def cgroup(self) -> str | None:
        return self.target_cgroup.path if self.target_cgroup.hierarchy else None

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
                      preexec=chain(self.target_cgroup.join(), self.preexec(),
                                    self.affinity()),
                      container=container, undo=[*self.base(), "delete", "-f", container],
                      cgroups=self.target_cgroup.container_dirs(container))

    def finish(self, launch: Launch) -> bool:
        # `run` deletes its container when the process exits; state left means it did not.
        assert launch.container is not None and launch.undo is not None   # launch() set them
        state = self.state / launch.container
        if state.exists():
            subprocess.run(launch.undo, capture_output=True, timeout=30)
        return not state.exists()
