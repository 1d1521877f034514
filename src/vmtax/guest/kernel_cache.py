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
from typing import Iterator

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


def load_kernel(kdir: Path) -> Kernel:
    meta = json.loads((kdir / "meta.json").read_text())
    modules_dir = kdir / "modules"
    return Kernel(kdir / meta["path"], meta["version"], meta["sha256"],
                  modules_dir if modules_dir.is_dir() else None, meta["modules"], meta.get("hz"),
                  tuple(meta.get("params", ())))


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
