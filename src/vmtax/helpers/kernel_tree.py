"""The compile workload's code base: the Linux kernel's tinyconfig, reduced to what its
compiles read, with the kernel's own compile commands and a toolchain, in one read-only tree.

Built once on the host (minutes) from Debian's linux-source: unpack, `make tinyconfig`, a
real build with the host's gcc. Every object's `.o.cmd` file, written by kbuild, holds the
object's exact compile command (flags, includes, defines) and, after fixdep, every file the
compile read. From those the tree is assembled, tens of MB instead of the 1.3 GB build:

  src/          the .c/.S sources and every header they include (generated ones too)
  src/vmtax.mk  one rule per object: the kernel's command as kbuild ran it, minus its
                dependency-file output (-Wp,-MMD) and the steps kbuild chains after it,
                writing into $(O) (a writable directory: the tree is read-only in targets);
                make runs in src/ so the kernel's relative -I./include paths resolve
  toolchain/    gcc's driver, its compiler proper (cc1) and the assembler (as) with their
                shared libraries, at gcc's own relative layout (bin/gcc finds
                lib/gcc/<triplet>/<version>/cc1 and as from its own path), the libraries
                found through LD_LIBRARY_PATH, which vmtax.mk exports
  manifest.json the objects in build order and what compiling them took natively

Targets see the tree at its host path (vmtax.host.trees): make is the one program of the
toolchain targets carry in their root file system, with the C library and dynamic loader
the other programs need. The tree is cached under the cache's kernel-trees/ by the content
hash of the source tarball, the toolchain and FORMAT, and published by an atomic rename.
The assembled tree is compiled once before publishing: an object whose compile needs a
file its dependency list does not name (an assembler .incbin) is left out, and the
manifest records the CPU seconds the compiles took (the estimate of a -j1 build).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.guest import minimal_kernel, rootfs
from vmtax.guest.kernel_cache import build_lock, publish_dir
from vmtax.host import build_progress

FORMAT = "1"   # bump when the build or its layout changes, to invalidate caches
MAKEFILE = "vmtax.mk"
MANIFEST = "manifest.json"
# Debian packages of the build and of the toolchain the tree carries.
PACKAGES = (*minimal_kernel.PACKAGES, "make", "gcc", "binutils")
# Host tools are built with the same gcc but are not part of the kernel (which is compiled
# freestanding, -nostdinc, where host tools read the C library's headers).
_HOST_DIRS = ("scripts/", "tools/")
# Read by every compile (include/linux/kconfig.h includes it) but left out of the
# dependency lists by fixdep, which lists the CONFIG_ options used instead.
ALWAYS = ("include/generated/autoconf.h",)
# Linux 6.3 renamed the saved command from cmd_OBJ to savedcmd_OBJ (kbuild's Kbuild.include).
_CMD = re.compile(r"^(?:saved)?cmd_(\S+) := (.*)$", re.MULTILINE)
_SOURCE = re.compile(r"^source_\S+ := (\S+)$", re.MULTILINE)
# make echoing a recipe of vmtax.mk: the compile of one object.
_RECIPE = re.compile(r"^\S*/toolchain/bin/gcc ")
# About the lines kbuild prints building tinyconfig's vmlinux, the bar's total until a
# build here has counted them: 6.1 compiles 439 objects, plus host tools, headers, links.
EXPECTED_STEPS = 600
_DEPS = re.compile(r"^deps_\S+ := \\\n((?:.*\\\n)*.*)$", re.MULTILINE)


@dataclass(frozen=True)
class ObjectCommand:
    """One kernel object: its path, its source and kbuild's compile command (in make
    syntax, as the .cmd file has it: `$` doubled, `#` as $(pound))."""
    obj: str
    source: str
    command: str
    deps: tuple[str, ...]


def parse_cmd(text: str) -> ObjectCommand | None:
    """The compile of a kernel object from its .o.cmd file; None for what is not a kernel
    object compiled by gcc from a .c or .S file (archives, links, host tools)."""
    cmd, source = _CMD.search(text), _SOURCE.search(text)
    if cmd is None or source is None:
        return None
    obj, command = cmd[1], cmd[2].strip()
    words = command.split()
    if (not obj.endswith(".o") or obj.startswith(_HOST_DIRS) or words[:1] != ["gcc"]
            or "-c" not in words or "-nostdinc" not in words
            or not source[1].endswith((".c", ".S"))):
        return None
    deps: list[str] = []
    found = _DEPS.search(text)
    for line in (found[1].splitlines() if found else ()):
        dep = line.strip().removesuffix("\\").strip()
        if dep and not dep.startswith("$(wildcard"):
            deps.append(dep)
    return ObjectCommand(obj, source[1], command, tuple(deps))


def recipe(oc: ObjectCommand) -> str:
    """The object's compile as a recipe line: gcc from the toolchain, the object into $(O),
    no dependency file, nothing chained after the compile."""
    command = re.split(r"\s;\s|;\s*$", oc.command)[0]
    out = []
    words = command.split()
    for i, word in enumerate(words):
        if word.startswith("-Wp,-MMD,") or word.startswith("-Wp,-MD,"):
            continue
        if i == 0:
            word = "$(CC)"
        elif words[i - 1] == "-o" and word == oc.obj:
            word = "$@"
        out.append(word)
    if "$@" not in out:
        raise VmtaxError(f"kernel tree: the compile of {oc.obj} does not write it with -o")
    return " ".join(out)


def makefile(objects: list[ObjectCommand], gcc_version: str) -> str:
    """vmtax.mk: `make -f vmtax.mk O=DIR` compiles every object into DIR (run its goal
    `dirs` first); `make -f vmtax.mk O=DIR PICK="a.o b.o" pick` those named."""
    lines = [
        "# Written by vmtax.helpers.kernel_tree: the kernel's own compile commands "
        "(kbuild's .cmd).",
        r"pound := \#",
        "TC := $(abspath $(CURDIR)/../toolchain)",
        "CC := $(TC)/bin/gcc",
        "export LD_LIBRARY_PATH := $(TC)/lib",
        "O ?= out",
        f"# gcc {gcc_version}",
        "OBJECTS := " + " ".join(f"$(O)/{oc.obj}" for oc in objects),
        "all: $(OBJECTS)",
        "pick: $(addprefix $(O)/,$(PICK))",
        "DIRS := " + " ".join(sorted({f"$(O)/{os.path.dirname(oc.obj)}" for oc in objects})),
        "dirs:\n\t@mkdir -p $(DIRS)",
        ".PHONY: all pick dirs",
        "",
    ]
    for oc in objects:
        lines.append(f"$(O)/{oc.obj}:\n\t{recipe(oc)}")
    return "\n".join(lines) + "\n"


def select(objects: list[str], count: int) -> list[str]:
    """`count` of the objects (0: all), evenly spread over the list in its order, so a
    subset samples every part of the kernel and is the same every time."""
    if count <= 0 or count >= len(objects):
        return list(objects)
    return [objects[i * len(objects) // count] for i in range(count)]


# --- the toolchain --------------------------------------------------------------------------

def _gcc_query(*args: str) -> str:
    try:
        done = subprocess.run(["gcc", *args], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise VmtaxError("gcc is not installed; the compile workload needs "
                         "apt-get install gcc binutils make") from None
    return done.stdout.strip()


def toolchain_files() -> dict[str, Path]:
    """Path inside toolchain/ -> host file: gcc, cc1 and as at gcc's relative layout, and
    their shared libraries (not the dynamic loader, which the root file system has)."""
    gcc = Path(os.path.realpath(shutil.which("gcc") or "gcc"))
    cc1 = Path(_gcc_query("-print-prog-name=cc1"))
    as_ = Path(os.path.realpath(shutil.which(_gcc_query("-print-prog-name=as")) or "as"))
    if not cc1.is_absolute() or not gcc.exists() or not as_.exists():
        raise VmtaxError("gcc, its cc1 or as is missing; the compile workload needs "
                         "apt-get install gcc binutils make")
    # Debian's cc1 is /usr/lib/gcc/<triplet>/<version>/cc1: gcc looks there relative to
    # its own ../ (bin/..), and for `as` in the same directory before PATH.
    libexec = cc1.parent.relative_to("/usr")
    files = {"bin/gcc": gcc, str(libexec / "cc1"): cc1, str(libexec / "as"): as_}
    for program in (gcc, cc1, as_):
        for lib in rootfs.shared_libraries(program):
            if not lib.name.startswith("ld-linux"):
                files[f"lib/{lib.name}"] = lib
    return files


def cache_key(tarball: Path) -> str:
    """Content hash of the source, the toolchain and the layout."""
    h = hashlib.sha256(f"{FORMAT}\0".encode())
    h.update(minimal_kernel.tarball_sha256(tarball).encode())
    for name, path in sorted(toolchain_files().items()):
        h.update(f"{name}\0{rootfs.sha256_file(path)}\n".encode())
    return h.hexdigest()[:16]


# --- building it ------------------------------------------------------------------------------

def _compile(tree: Path, jobs: int, out: Path, progress: build_progress.Build,
             expected: int) -> tuple[float, float]:
    """Compile every object of the assembled tree into out, going on past failures: (wall
    seconds, CPU seconds of the compiles)."""
    argv = ["make", "-C", str(tree / "src"), "-f", MAKEFILE, f"O={out}"]
    progress.run([*argv, "-s", "dirs"], tree, "making the objects' directories", timeout=600)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    try:
        # make echoes each recipe: one line per object compiled.
        progress.run([*argv, f"-j{jobs}", "-k", "all"], tree, "compiling it from the tree",
                     timeout=minimal_kernel.BUILD_TIMEOUT, steps=_RECIPE, expected=expected)
    except VmtaxError:
        pass   # the objects that did not compile are counted, and left out, by the caller
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _assemble(build: Path, dest: Path, objects: list[ObjectCommand]) -> None:
    """Copy what the compiles read and the toolchain into dest, and write vmtax.mk."""
    wanted: set[str] = set(ALWAYS)
    for oc in objects:
        wanted.add(oc.source)
        wanted.update(oc.deps)
    outside = sorted(d for d in wanted if os.path.isabs(d) or d.startswith(".."))
    if outside:
        raise VmtaxError(f"kernel tree: compiles read files outside the source: {outside[:3]}")
    for name in sorted(wanted):
        target = dest / "src" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(build / name, target)
    for name, host_file in toolchain_files().items():
        target = dest / "toolchain" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(host_file, target)
        target.chmod(0o755)
    version = _gcc_query("-dumpfullversion")
    (dest / "src" / MAKEFILE).write_text(makefile(objects, version))


def build(tarball: Path, dest: Path, jobs: int | None = None) -> None:
    """Build the kernel on the host, assemble the tree from it into dest, check it
    compiles, record the manifest, publish."""
    jobs = jobs or os.cpu_count() or 1
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        with build_progress.Build(f"compile workload's kernel tree from {tarball.name}",
                                  "kernel-tree", minimal_kernel.SOURCE_NOTE) as progress:
            source = minimal_kernel.unpack_tinyconfig(tarball, tmp, progress)
            started = time.monotonic()
            progress.run(["make", f"-j{jobs}", "vmlinux"], source, "make vmlinux",
                         timeout=minimal_kernel.BUILD_TIMEOUT, steps=build_progress.KBUILD_STEP,
                         key=f"kernel-tree {tarball.name}", expected=EXPECTED_STEPS)
            kbuild_seconds = time.monotonic() - started
            objects = sorted(filter(None, (parse_cmd(p.read_text(errors="replace"))
                                           for p in source.rglob(".*.o.cmd"))),
                             key=lambda oc: oc.obj)
            if not objects:
                raise VmtaxError(f"kernel tree: no compiled objects found in {source} "
                                 f"(log: {progress.log})")
            tree = tmp / "tree"
            _assemble(source, tree, objects)
            shutil.rmtree(source)   # ~1.3 GB
            # An object that does not compile from the tree alone is left out: this compile
            # checks the tree and measures it (wall and CPU time on this host).
            check = tmp / "check"
            wall, cpu = _compile(tree, jobs, check, progress, len(objects))
        built = [oc for oc in objects if (check / oc.obj).exists()]
        dropped = [oc.obj for oc in objects if oc not in built]
        if len(built) < len(objects) * 0.9:
            raise VmtaxError(f"kernel tree: only {len(built)} of {len(objects)} objects "
                             f"compile from the tree; log: {progress.log}")
        if dropped:
            (tree / "src" / MAKEFILE).write_text(makefile(built, _gcc_query("-dumpfullversion")))
        size = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file())
        (tree / MANIFEST).write_text(json.dumps({
            "format": FORMAT, "source": str(tarball), "config": "tinyconfig",
            "gcc": _gcc_query("-dumpfullversion"), "objects": [oc.obj for oc in built],
            "dropped": dropped, "cpu_seconds": round(cpu, 2),
            "wall_seconds": round(wall, 2), "jobs": jobs, "bytes": size,
            "kbuild_seconds": round(kbuild_seconds, 1)}, indent=1))
        for path in [tree, *tree.rglob("*")]:   # read-only, in the cache as in targets
            if path.is_dir():
                path.chmod(0o555)
            elif path.is_file():
                path.chmod(0o555 if os.access(path, os.X_OK) else 0o444)
        publish_dir(tree, dest, MANIFEST)
    finally:
        _make_writable(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


def _make_writable(root: Path) -> None:
    """So rmtree can remove a tree left read-only (directories without write permission)."""
    if root.exists():
        for path in [root, *root.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)


def tarball() -> Path:
    try:
        return minimal_kernel.source_tarball()
    except VmtaxError:
        if os.environ.get(minimal_kernel.SOURCE_ENV):
            raise   # it names the variable and what it asked for
        raise VmtaxError("the compile workload builds Debian's linux-source, which is not "
                         f"installed; apt-get install {' '.join(PACKAGES)} (or make deps)"
                         ) from None


def tree_path(cache: Path | None = None) -> Path:
    """Where the tree for the installed source and toolchain lives (built or not)."""
    return (cache or paths.cache_dir()) / "kernel-trees" / f"tinyconfig-{cache_key(tarball())}"


def manifest(tree: Path) -> dict[str, Any]:
    built: dict[str, Any] = json.loads((tree / MANIFEST).read_text())
    return built


def kernel_tree(cache: Path | None = None, jobs: int | None = None) -> Path:
    """The tree for the installed source and toolchain, built on first use (minutes)."""
    dest = tree_path(cache)
    if (dest / MANIFEST).exists():
        return dest
    with build_lock(dest):
        if not (dest / MANIFEST).exists():   # another process may have built it meanwhile
            build(tarball(), dest, jobs)
    return dest


def main() -> int:
    """Build it ahead of time (make test does, for its live tests); quiet when it is built."""
    try:
        kernel_tree()
    except VmtaxError as exc:
        print(f"vmtax: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":   # python -m vmtax.helpers.kernel_tree
    sys.exit(main())
