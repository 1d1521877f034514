"""The root filesystem every non-native target runs: the host's own workload binaries.

Assembled from busybox, the host binaries the workloads need and the shared libraries
they load, so native, container and VM run byte-identical programs. Cached by the
content hash of its inputs; a cached tree is never modified (containers copy it). Its
`.complete` records every entry the build made (each file's sha256 and mode, each link's
target), and a cached tree is used only while it holds exactly those: one that differs (a
program swapped for another, a file added) is built again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterable

from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.core.files import read_json
from vmtax.core.text import printable
from vmtax.guest.kernel_cache import build_lock
from vmtax.host import binary

FORMAT = "2"   # bump when the layout changes, to invalidate caches
# A tree of a few hundred entries: its record is tens of KB.
MAX_RECORD = 16 << 20
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


# A file's SHA-256, hashed once per process while it stays the same (vmtax.host.binary).
sha256_file = binary.sha256


def digest(files: dict[str, Path]) -> str:
    h = hashlib.sha256(FORMAT.encode())
    for guest_path in sorted(files):
        h.update(f"{guest_path}\0{sha256_file(files[guest_path])}\n".encode())
    return h.hexdigest()


def entries(root: Path) -> dict[str, list[Any]]:
    """Every entry below root but `.complete`, by its path there: a directory's mode, a
    link's target, a file's mode and sha256 (hashed once per process while it stays the
    same: vmtax.host.binary); anything else is marked as such."""
    found: dict[str, list[Any]] = {}
    for top, dirs, names in os.walk(root):
        for name in dirs + names:
            path = os.path.join(top, name)
            st = os.lstat(path)
            key = os.path.relpath(path, root)
            if stat.S_ISLNK(st.st_mode):
                found[key] = ["link", os.readlink(path)]
            elif stat.S_ISDIR(st.st_mode):
                found[key] = ["dir", stat.S_IMODE(st.st_mode)]
            elif stat.S_ISREG(st.st_mode):
                found[key] = ["file", stat.S_IMODE(st.st_mode), sha256_file(path)]
            else:
                found[key] = ["other", st.st_mode]
    found.pop(".complete", None)
    return found


def _intact(dest: Path, key: str) -> bool:
    """Whether the cached tree at dest is complete and holds what its build made."""
    try:
        record = read_json(dest / ".complete", "the rootfs's record", MAX_RECORD)
    except (FileNotFoundError, ValueError):
        return False
    return (isinstance(record, dict) and record.get("key") == key
            and record.get("entries") == entries(dest))


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
    if _intact(dest, key):
        return dest
    # Builders of one rootfs (density's parallel guests on a cold cache, two runs) take
    # turns: a finished one is never replaced under a guest or container that uses it.
    with build_lock(dest):
        if _intact(dest, key):
            return dest
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=base))
        try:
            populate(tmp, files)
            (tmp / ".complete").write_text(json.dumps({"key": key, "entries": entries(tmp)}))
            # One unfinished, left by a crash, or changed since it was built.
            shutil.rmtree(dest, ignore_errors=True)
            os.rename(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return dest
