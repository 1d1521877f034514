"""One CPU-accounting cgroup per container target, holding every container it starts.

A container target starts one container per job, and a cgroup-managing runtime (runc, crun)
gives each its own cgroup, gone when the job ends: nothing a collector could read across a
cell's repetitions. So each target gets a cgroup of its own in the CPU-accounting hierarchy
(cgroup v1's cpuacct), `/vmtax-<id>`, whose leaf `runtime` every launch's runtime process
joins before it execs. What the runtime starts inherits it: runc makes the container's
cgroup under its own (`/vmtax-<id>/runtime/<container>`), and a runtime that makes none
(crun with its cgroup manager disabled, runsc with --ignore-cgroups) leaves its processes
in it. crun with its cgroup manager makes the container's at each hierarchy's root, out of
it, so a crun that manages cgroups has no target cgroup (Crun.cgroup). cpuacct counts
hierarchically, so `/vmtax-<id>` holds the CPU time of every job's container and of the
runtime starting it, as the job's wall time does.

Only the accounting hierarchy is joined: the cpu controller's (real-time budgets, shares),
memory's and cpuset's cgroups stay where they were, so a job is scheduled and limited as
before. Hence nothing is made where cpuacct is mounted with cpu, nor on a cgroup v2-only
host, where joining is joining every controller (and v2 forbids a container's cgroup under
one holding the runtime's process).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Callable

# The leaf the runtime's process joins, so that the target's cgroup itself holds no process
# beside its children (v1 allows it; v2 would not).
LEAF = "runtime"
# Mount options of a cgroup hierarchy that are no controller.
_FLAGS = {"rw", "ro", "nosuid", "nodev", "noexec", "relatime", "noatime", "strictatime",
          "clone_children", "noprefix", "xattr", "nsdelegate", "memory_recursiveprot",
          "memory_localevents", "favordynmods", "cpuset_v2_mode", "memory_hugetlb_accounting"}


def hierarchies(mountinfo: str = "/proc/self/mountinfo",
                root: str = "/sys/fs/cgroup") -> list[tuple[str, frozenset[str]]]:
    """(mount point, its controllers) of each cgroup hierarchy under root; a v2 one has the
    controller set {""}, as /proc/PID/cgroup names it ("0::/")."""
    found = []
    try:
        text = Path(mountinfo).read_text()
    except OSError:
        return []
    for line in text.splitlines():
        mount, sep, fs = line.partition(" - ")
        fields, fs_fields = mount.split(), fs.split()
        if not sep or len(fields) < 5 or len(fs_fields) < 3:
            continue
        point, fstype = fields[4], fs_fields[0]
        if not (point == root or point.startswith(root + "/")):
            continue
        if fstype == "cgroup2":
            found.append((point, frozenset([""])))
        elif fstype == "cgroup":
            # A v1 hierarchy's super options are its controllers ("cpuacct",
            # "name=systemd") among flags, as /proc/PID/cgroup lists them.
            found.append((point, frozenset(set(fs_fields[2].split(",")) - _FLAGS)))
    return found


def own_cgroups(path: str = "/proc/self/cgroup") -> dict[frozenset[str], str]:
    """Controllers of a hierarchy -> this process's cgroup in it ("/" for the root)."""
    found = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return {}
    for line in text.splitlines():
        _, _, rest = line.partition(":")
        controllers, _, cgroup = rest.partition(":")
        found[frozenset(controllers.split(","))] = cgroup or "/"
    return found


class TargetCgroup:
    """`/vmtax-<id>` in the cpuacct hierarchy, with the runtime's leaf in it."""

    def __init__(self, mountinfo: str = "/proc/self/mountinfo",
                 self_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"):
        self.path = f"/vmtax-{uuid.uuid4().hex[:12]}"
        self._hierarchies = hierarchies(mountinfo, root)
        self._own = own_cgroups(self_cgroup)
        accounting = [(point, controllers) for point, controllers in self._hierarchies
                      if "cpuacct" in controllers]
        self.why_not: str | None = None    # why there is none on this host
        self.hierarchy: str | None = None  # the cpuacct hierarchy's mount point
        if not accounting:
            self.why_not = ("this host has no cgroup v1 cpuacct hierarchy to count its jobs "
                            "in apart from their scheduling")
        elif "cpu" in accounting[0][1]:
            self.why_not = (f"cpuacct is mounted with cpu ({accounting[0][0]}): a cgroup for "
                            "counting would change how the jobs are scheduled")
        else:
            self.hierarchy = accounting[0][0]

    def dirs(self) -> list[str]:
        """Its directories, the leaf first, for the journal to remove after the target."""
        if self.hierarchy is None:
            return []
        return [f"{self.hierarchy}{self.path}/{LEAF}", f"{self.hierarchy}{self.path}"]

    def make(self) -> None:
        """Make it (idempotent); OSError when the hierarchy refuses."""
        if self.hierarchy is not None:
            os.makedirs(f"{self.hierarchy}{self.path}/{LEAF}", exist_ok=True)

    def join(self) -> Callable[[], None] | None:
        """A preexec that moves the launched runtime's process into the leaf."""
        if self.hierarchy is None:
            return None
        procs = f"{self.hierarchy}{self.path}/{LEAF}/cgroup.procs"

        def join() -> None:
            with open(procs, "w") as f:
                f.write("0")
        return join

    def container_dirs(self, container: str) -> list[str]:
        """Where a runtime may make a cgroup for `container`, in every hierarchy: under its
        own process's cgroup (runc: under the leaf in cpuacct, under vmtax's cgroup
        elsewhere), or at the hierarchy's root (crun, whatever cgroupsPath says)."""
        found: list[str] = []
        for point, controllers in self._hierarchies:
            parent = (f"{self.path}/{LEAF}" if point == self.hierarchy
                      else self._own.get(controllers, "/").rstrip("/"))
            found += dict.fromkeys([f"{point}{parent}/{container}", f"{point}/{container}"])
        return found
