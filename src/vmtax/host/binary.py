"""What a program on this host is, not only where it is: its content's hash.

A rebuilt QEMU, kernel, VMM or workload binary at the same path, with the same version
string (E1's part two patches QEMU and installs the build over the stock one), is another
program; its sha256 is what tells them apart. Hashing tens of MB costs ~0.1 s, so each file
is hashed once per process for as long as its size, mtime and inode stay the same.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Any


@functools.lru_cache(maxsize=256)
def _sha256(path: str, size: int, mtime_ns: int, inode: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def sha256(path: str | Path) -> str:
    """The sha256 of the file at path (symlinks followed); OSError when it cannot be read."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return _sha256(real, st.st_size, st.st_mtime_ns, st.st_ino)


def identity(path: str | Path) -> dict[str, Any]:
    """A program's identity for a fingerprint: its path as resolved, size and sha256 (None
    for a file that cannot be read)."""
    real = os.path.realpath(path)
    try:
        return {"path": real, "size": os.stat(real).st_size, "sha256": sha256(real)}
    except OSError:
        return {"path": real, "size": None, "sha256": None}


def short_id(path: str | Path) -> str | None:
    """A program's identity as a fingerprint keeps it: its sha256's first 16 hex digits
    (None for a file that cannot be read); a rebuild is another one."""
    sha = identity(path)["sha256"]
    return sha[:16] if sha else None
