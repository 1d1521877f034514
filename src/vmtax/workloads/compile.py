"""compile: the Linux kernel's tinyconfig compiled with make and gcc (E3's kernel build),
timed by the target's clock.

E3 timed a kernel build: CPU-bound work of a kind users run every day, many short compiler
processes reading thousands of headers. Here it is the kernel's own code base, Debian's
linux-source configured with `make tinyconfig`, and its own gcc command lines (flags,
includes, defines as kbuild ran them), driven by GNU make `-j jobs`: by default every
object tinyconfig compiles, or `objects` of them, evenly spread over the kernel in a fixed
order (for a short run). What is measured is compiling those objects, C and assembler,
with Debian's gcc (driver, compiler proper cc1) and binutils' as; kbuild itself (Kconfig,
fixdep, host tools) and linking vmlinux are not.

The code base and the toolchain (vmtax.helpers.kernel_tree: tens of MB, built on the host
when a run first needs it) reach every target as a read-only tree at the same path
(vmtax.host.trees): natively the cached directory, in containers a read-only bind mount,
in guests a read-only ext4 disk. Objects go to the scratch directory. Each repetition
deletes them untimed and times the build.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from vmtax.core import plugin
from vmtax.core.errors import VmtaxError
from vmtax.core.types import Job, Metric, MetricSpec
from vmtax.core.workload import Workload
from vmtax.helpers import kernel_tree
from vmtax.helpers.macro_data import TIME_RESOLUTION, programs, script_job, times

# For estimates before the tree is built: CPU seconds to compile an average tinyconfig
# object natively on this (shared) host; the manifest's measured figure replaces it.
ESTIMATE_OBJECT_S = 0.5
# A TCG guest compiles tens of times slower than the host: the timeout allows 100 times.
TIMEOUT_FACTOR = 100
# make runs the recipes with /bin/sh (busybox in targets); the tree's vmtax.mk knows every
# object, `dirs` makes their directories in $O, `pick` builds those named in $PICK.
_RUN = """jobs=$1 goal=$2 pick=$3
busybox rm -rf out
mk() { "$MAKE_BIN" -s -C "$TREE/src" -f vmtax.mk O="$PWD/out" PICK="$pick" "$@"; }
mk dirs
begin; mk -j "$jobs" "$goal"; end build
"""


class CompileOptions(plugin.Options):
    objects: int = plugin.option(0, "Kernel objects compiled, evenly spread over tinyconfig's "
                                 "(0: all of them)", unit="objects", ge=0, le=100000)
    jobs: int = plugin.option(1, "Objects compiled at once (make -j)", unit="processes",
                              ge=1, le=256)


@functools.cache
def _tree() -> Path:
    return kernel_tree.kernel_tree()


@functools.cache
def _built_manifest() -> dict[str, Any] | None:
    """The tree's manifest if it is built (estimates never start the build)."""
    try:
        tree = kernel_tree.tree_path()
    except VmtaxError:
        return None
    return kernel_tree.manifest(tree) if (tree / kernel_tree.MANIFEST).exists() else None


class Compile(Workload):
    name = "compile"
    description = ("make and gcc compiling the Linux kernel's tinyconfig with the kernel's own "
                   "command lines, from a read-only tree (seconds)")
    Options = CompileOptions
    options: CompileOptions
    # gcc, cc1 and as come with the tree (vmtax.helpers.kernel_tree); make in the root file system
    # brings the C library and dynamic loader they run with.
    binaries = ("make",)
    packages = kernel_tree.PACKAGES
    metrics = (
        MetricSpec("time", "s", False, "Seconds the build took, by the target's clock",
                   group="CPU", primary=True, resolution=TIME_RESOLUTION),
    )

    def host_problems(self) -> list[tuple[str, str]]:
        try:
            kernel_tree.tarball()
        except VmtaxError as exc:
            # Said as what the plan check expects: "expected a Linux source ... , got 20".
            return [("objects", f"a Linux source tarball to build the tree from ({exc})")]
        return []

    def trees(self) -> tuple[Path, ...]:
        return (_tree(),)

    def _picked(self) -> list[str] | None:
        """The objects built, None for all of them (the manifest knows them)."""
        if self.options.objects == 0:
            return None
        return kernel_tree.select(kernel_tree.manifest(_tree())["objects"],
                                  self.options.objects)

    def _cpu_seconds(self) -> float:
        """CPU seconds of the compiles natively, from the manifest when the tree is built."""
        m = _built_manifest()
        per_object = m["cpu_seconds"] / len(m["objects"]) if m else ESTIMATE_OBJECT_S
        count = len(m["objects"]) if m else 500
        if self.options.objects:
            count = min(count, self.options.objects)
        return per_object * count

    def run_seconds(self) -> float:
        return self._cpu_seconds() / self.options.jobs

    def prepare_seconds(self) -> float:
        return 1.0

    def run_job(self) -> Job:
        picked = self._picked()
        return script_job(_RUN, self.options.jobs, "all" if picked is None else "pick",
                          " ".join(picked or ()),
                          env={**programs("make"), "TREE": str(_tree())},
                          timeout=self._cpu_seconds() * TIMEOUT_FACTOR + 300)

    def cleanup_jobs(self) -> list[Job]:
        return [script_job("busybox rm -rf out\n", timeout=120)]

    def parse(self, stdout: str) -> list[Metric]:
        return [self.metric("time", times(stdout, ("build",))["build"])]
