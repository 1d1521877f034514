"""Guest kernels in vmtax's cache, and how a build is published there.

A built kernel is a directory with `meta.json` (see `Kernel`), made by vmtax.guest.image
(Debian's kernels, the user's) or vmtax.guest.minimal_kernel; one builder at a time makes
it (`build_lock`) in a scratch directory that is then renamed into place (`publish_dir`),
so a directory in the cache is always a complete one. The kernel source tree the compile
workload reads (vmtax.helpers.kernel_tree) is published the same way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.core.files import read_json
from vmtax.host import binary

_VERSION = re.compile(rb"Linux version (\d[^\s\x00]*) \(")


def kernel_version(data: bytes) -> str | None:
    """The release string ("6.1.0-56-amd64") of an ELF kernel or a bzImage."""
    m = _VERSION.search(data)
    if m:
        return m.group(1).decode()
    # bzImage boot protocol: a pointer to the version string at 0x20e, relative to 0x200.
    if data[0x202:0x206] == b"HdrS":
        start = int.from_bytes(data[0x20E:0x210], "little") + 0x200
        release = data[start:start + 256].split(b" ", 1)[0].split(b"\0", 1)[0]
        return release.decode(errors="replace") or None
    return None


@dataclass(frozen=True)
class Kernel:
    path: Path                        # uncompressed ELF (or the user's file, used as is)
    version: str
    sha256: str
    modules_dir: Path | None          # flat directory of .ko files, None if all built in
    modules: dict[str, list[str]]     # phase -> insmod order
    hz: int | None = None             # CONFIG_HZ, when its config is known
    # Boot parameters this kernel takes beyond upstream's (vmtax.guest.minimal_kernel's
    # source edits): "lapic_timer_period".
    params: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """Identifies the kernel and its module set in cache keys."""
        return f"{self.sha256}:{json.dumps(self.modules, sort_keys=True)}"


# A kernel's record: a few KB of module lists.
MAX_META = 1 << 20


def _words(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _record_problem(meta: object) -> str | None:
    """What of a kernel's record is not as vmtax writes it."""
    if not isinstance(meta, dict):
        return "it is not a JSON object"
    checks = {"path": isinstance(meta.get("path"), str) and meta["path"] != "",
              "version": isinstance(meta.get("version"), str),
              "sha256": isinstance(meta.get("sha256"), str)
              and re.fullmatch(r"[0-9a-f]{64}", meta["sha256"]) is not None,
              "modules": isinstance(meta.get("modules"), dict)
              and all(_words(v) for v in meta["modules"].values()),
              "hz": meta.get("hz") is None or type(meta["hz"]) is int,
              "params": _words(meta.get("params", []))}
    bad = [key for key, ok in checks.items() if not ok]
    return f"its {bad[0]} is missing or not as vmtax writes it" if bad else None


def load_kernel(kdir: Path) -> Kernel:
    """The kernel built into kdir, once its record (meta.json) is whole and the file it names
    has the sha256 it claims (hashed once per process while the file stays the same:
    vmtax.host.binary). A record that is not, or a file that differs, is a damaged cache
    entry: it is moved out of the cache, and the VmtaxError says a new run builds it again."""
    try:
        meta: Any = read_json(kdir / "meta.json", "the kernel's record", MAX_META)
        problem = _record_problem(meta)
    except ValueError as exc:
        problem = f"it is not JSON ({exc})"
    if problem is None:
        # A user's own file is kept by its absolute path; vmtax's own build, inside kdir.
        path = Path(meta["path"]) if os.path.isabs(meta["path"]) else \
            paths.under(kdir, meta["path"], f"the kernel in {kdir}")
        try:
            found = binary.sha256(path)
        except OSError as exc:
            found = f"unreadable ({exc.strerror})"
        if found != meta["sha256"]:
            problem = f"{path} has sha256 {found[:16]}…, not the {meta['sha256'][:16]}… it claims"
    if problem is not None:
        _remove_damaged(kdir)
        raise VmtaxError(f"the cached kernel {kdir} was damaged ({problem}) and is removed "
                         "from the cache; run the command again to build it anew")
    modules_dir = kdir / "modules"
    return Kernel(path, meta["version"], meta["sha256"],
                  modules_dir if modules_dir.is_dir() else None, meta["modules"], meta.get("hz"),
                  tuple(meta.get("params", ())))


def _remove_damaged(kdir: Path) -> None:
    """kdir out of the cache at once (a rename), then removed."""
    aside = kdir.with_name(f".damaged-{kdir.name}-{os.getpid()}")
    with contextlib.suppress(OSError):
        os.rename(kdir, aside)
        shutil.rmtree(aside, ignore_errors=True)


def publish_dir(tmp: Path, dest: Path, marker: str = "meta.json") -> None:
    """Move a finished build into place; a concurrent builder may have won the race (its
    build is complete when it has its marker file)."""
    try:
        os.rename(tmp, dest)
    except OSError:
        if not (dest / marker).exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def build_lock(dest: Path) -> Iterator[None]:
    """Held while building dest: a second process that wants the same build waits for the
    first one's (minutes of work) instead of racing it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
