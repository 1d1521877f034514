"""Files vmtax reads back: what it wrote itself and reads again later (the plugin index,
doctor's versions, the stamp of a checked database, a kernel's record, a store's side file,
a published page), and the files a user names (`read_bounded`).

Each is read as `read_back` reads it: opened without following a symbolic link and
without waiting (a FIFO would block, /dev/zero never end), only when it is a regular
file, of at most a cap (the caps: next to each caller), owned by the user of vmtax (or
another owner the caller trusts, the owner of the results directory) and writable by no
one else, as vmtax writes them. Anything else is refused in one line (Untrusted) naming
the file and what is wrong; a file that is not there is FileNotFoundError, for the caller
to make it (a cache) or go without it.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, Collection

from vmtax.core.errors import VmtaxError


class Untrusted(VmtaxError):
    """A file vmtax wrote is not as vmtax writes it: of another kind, too large, of another
    owner, or writable by others."""


def size_text(n: int) -> str:
    """A cap as a user reads it: "16 MiB", "64 KiB"."""
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n >> 10} KiB"


def read_fd(fd: int, limit: int) -> bytes | None:
    """At most limit bytes of fd; None when it holds more. One byte past the cap tells a
    file at the cap from a larger one; fstat's size is not trusted, as the file may grow
    while it is read."""
    data = b""
    while len(data) <= limit:
        chunk = os.read(fd, limit + 1 - len(data))
        if not chunk:
            break
        data += chunk
    return data if len(data) <= limit else None


def kind_of(mode: int) -> str:
    """What a file of this mode is, for a message: "a FIFO"."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_back(path: str | os.PathLike[str], what: str, *, owners: Collection[int] = (),
              dir_fd: int | None = None) -> int:
    """A descriptor of the file at path that vmtax wrote as what ("the plugin index"),
    opened for reading as read_back says it must be; else Untrusted, one line.
    FileNotFoundError when it is not there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        # O_NOFOLLOW on a link fails with ELOOP: say what it is.
        try:
            found = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            raise Untrusted(f"{what} {path} cannot be read ({exc.strerror})") from None
        raise Untrusted(f"{what} {path} is {kind_of(found.st_mode)}, not a file vmtax "
                        "wrote; remove it") from None
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise Untrusted(f"{what} {path} is {kind_of(found.st_mode)}, not a file vmtax "
                            "wrote; remove it")
        if found.st_uid not in {os.geteuid(), *owners}:
            raise Untrusted(f"{what} {path} is owned by uid {found.st_uid}, not by uid "
                            f"{os.geteuid()} that runs vmtax: vmtax will not trust it "
                            "(remove it)")
        if found.st_mode & 0o022:
            raise Untrusted(f"{what} {path} is writable by others (mode "
                            f"{stat.S_IMODE(found.st_mode):o}): vmtax will not trust it "
                            "(remove it)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_back(path: str | os.PathLike[str], what: str, limit: int, *,
              owners: Collection[int] = (), dir_fd: int | None = None) -> bytes:
    """The bytes of the file at path that vmtax wrote as what ("the plugin index"): a
    regular file, not a link, of at most limit bytes, owned by vmtax's user (or one of
    owners) and writable by no one else; else Untrusted, one line. FileNotFoundError when
    it is not there."""
    fd = open_back(path, what, owners=owners, dir_fd=dir_fd)
    try:
        data = read_fd(fd, limit)
    except OSError as exc:
        raise Untrusted(f"{what} {path} cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if data is None:
        raise too_large(path, what, limit)
    return data


def too_large(path: str | os.PathLike[str], what: str, limit: int) -> Untrusted:
    return Untrusted(f"{what} {path} is larger than {size_text(limit)}, more than vmtax "
                     "writes; remove it")


def read_json(path: str | os.PathLike[str], what: str, limit: int, **kwargs: Any) -> Any:
    """The JSON document read_back reads at path; ValueError when it is not JSON (a cache
    cut short or garbled: made again by its caller)."""
    return json.loads(read_back(path, what, limit, **kwargs))


def read_bounded(path: str | os.PathLike[str], what: str, limit: int) -> bytes:
    """The bytes of a regular file a user names (links followed: it is theirs to name), at
    most limit; else a VmtaxError naming path and what it was to be (`the plan file`)."""
    try:
        # O_NONBLOCK: opening a FIFO without a writer must not wait for one.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise VmtaxError(f"{path}: cannot read {what} ({exc.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise VmtaxError(f"{path}: cannot read {what} (not a regular file)")
        data = read_fd(fd, limit)
    except OSError as exc:
        raise VmtaxError(f"{path}: cannot read {what} ({exc.strerror})") from None
    finally:
        os.close(fd)
    if data is None:
        raise VmtaxError(f"{path}: cannot read {what} (larger than {size_text(limit)}, "
                         f"the most vmtax reads)")
    return data
