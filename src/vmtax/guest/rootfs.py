"""The root filesystem every non-native target runs: the host's own workload binaries.

Assembled from busybox, the host binaries the workloads need and the shared libraries
they load, so native, container and VM run byte-identical programs. Cached by the
content hash of its inputs; a cached tree is never modified (containers copy it).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable

from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.core.text import printable
from vmtax.guest.kernel_cache import build_lock

FORMAT = "1"   # bump when the layout changes, to invalidate caches
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
_LDD_LINE = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")
DIRS = ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "tmp", "root",
        "work", "mnt", "run", "var/tmp")


def which(binary: str) -> Path:
    """The absolute path of a program: a name on PATH, or a path (a relative one from the
    current directory, its ".." resolved, so it is the same file wherever it is joined)."""
    found = shutil.which(binary)
    if found is None:
        raise VmtaxError(f"{printable(binary)} is not installed on this host; install it "
                         f"(Debian: apt-get install {printable(binary)}) or run `make run` "
                         "which does")
    return Path(os.path.abspath(found))


def busybox() -> Path:
    for candidate in BUSYBOX_CANDIDATES:
        if os.path.exists(candidate):
            return Path(candidate)
    raise VmtaxError("busybox is not installed; install busybox-static "
                     "(apt-get install busybox-static)")


def shared_libraries(binary: Path) -> list[Path]:
    """The shared objects binary loads, as ldd resolves them on this host."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    if out.returncode != 0 or "not a dynamic executable" in out.stdout + out.stderr:
        return []
    return sorted({Path(m.group(1)) for m in _LDD_LINE.finditer(out.stdout)})


def file_set(binaries: Iterable[str]) -> dict[str, Path]:
    """Guest path -> host file, for busybox, the binaries and all their libraries."""
    files: dict[str, Path] = {"/bin/busybox": busybox()}
    for name in sorted(set(binaries)):
        path = which(name)
        files[str(path)] = path
        for lib in shared_libraries(path):
            files[str(lib)] = lib
    return files


def sha256_file(path: Path) -> str:
    """The file's SHA-256, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def digest(files: dict[str, Path]) -> str:
    h = hashlib.sha256(FORMAT.encode())
    for guest_path in sorted(files):
        h.update(f"{guest_path}\0{sha256_file(files[guest_path])}\n".encode())
    return h.hexdigest()


def populate(root: Path, files: dict[str, Path]) -> None:
    """Write the rootfs layout into root (an empty directory)."""
    for d in DIRS:
        (root / d).mkdir(parents=True, exist_ok=True)
    for guest_path, host_path in files.items():
        dest = paths.under(root, guest_path, "a program or library for the rootfs")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(host_path, dest)   # follows symlinks: the real bytes
        dest.chmod(0o755)
    applets = subprocess.run([str(files["/bin/busybox"]), "--list-full"],
                             capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        link = paths.under(root, applet, "a busybox applet")
        if not link.exists() and not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to("/bin/busybox")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")
    (root / "tmp").chmod(0o1777)


def build(binaries: Iterable[str], cache: Path | None = None) -> Path:
    """The cached rootfs directory holding busybox and binaries; built on first use."""
    files = file_set(binaries)
    key = digest(files)[:16]
    base = (cache or paths.cache_dir()) / "rootfs"
    dest = base / key
    if (dest / ".complete").exists():
        return dest
    # Builders of one rootfs (density's parallel guests on a cold cache, two runs) take
    # turns: a finished one is never replaced under a guest or container that uses it.
    with build_lock(dest):
        if (dest / ".complete").exists():
            return dest
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=base))
        try:
            populate(tmp, files)
            (tmp / ".complete").write_text(key + "\n")
            shutil.rmtree(dest, ignore_errors=True)   # an unfinished one, left by a crash
            os.rename(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return dest
