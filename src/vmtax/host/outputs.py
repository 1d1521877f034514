"""The files vmtax writes for a user (export's formats, compare --junit, report's HTML and
figures, trend --html, publish's pages): written, never replaced.

What is at the path decides how (`write_file`, and `write_in` for a directory already
opened):
- nothing, or a regular file: all of the data or nothing, atomically. The data goes into
  an unnamed file in the same directory (O_TMPFILE), linked to the path when it was free;
  to replace a regular file, linked to a temporary name (`.NAME.<8 hex digits>.tmp`) and
  renamed over it. So a kill -9 while the data is written leaves nothing, and the
  temporary name, which lives for two system calls, is journaled (vmtax.host.journal's
  "unlink"): `vmtax cleanup` or the next run removes one a kill left. (A filesystem
  without O_TMPFILE gets the temporary name, journaled, for the whole write.)
- a character device, a FIFO or a symbolic link (/dev/null, /dev/stdout, a link of the
  user's): written through, as `cat > FILE` would, never renamed over; a FIFO no one reads
  is refused at once, rather than waited on.
- a directory, a block device or a socket: refused.
Every refusal and failure is a VmtaxError of one line naming the path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Iterator

from vmtax.core.errors import VmtaxError
from vmtax.host.journal import Journal


def _refused(path: str | os.PathLike[str], why: str) -> VmtaxError:
    return VmtaxError(f"cannot write {path}: {why}")


def write_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Write data to the file at path, as the module says: atomically where it is a regular
    file or nothing, through a device, FIFO or link, else refused (VmtaxError)."""
    path = Path(path)
    try:
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _refused(path, exc.strerror or str(exc)) from None
    try:
        write_in(parent, path.name, data, path, through=True)
    finally:
        os.close(parent)


def write_in(dir_fd: int, name: str, data: bytes, path: str | os.PathLike[str], *,
             through: bool) -> None:
    """Write data to name in the directory open as dir_fd (whose path is path's parent, for
    messages and the journal). Without through, anything but a regular file at name is
    refused, and no link is followed (publish's own pages)."""
    try:
        found = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        found = None
    except OSError as exc:
        raise _refused(path, exc.strerror or str(exc)) from None
    if found is None or stat.S_ISREG(found.st_mode):
        _atomic(dir_fd, name, data, Path(path), found is not None, through)
    elif not through:
        raise _refused(path, "it is not a regular file vmtax wrote")
    elif stat.S_ISDIR(found.st_mode):
        raise _refused(path, "it is a directory; expected a file")
    elif stat.S_ISBLK(found.st_mode) or stat.S_ISSOCK(found.st_mode):
        raise _refused(path, "it is a block device or a socket; expected a file")
    else:
        _through(dir_fd, name, data, path)


def _through(dir_fd: int, name: str, data: bytes, path: str | os.PathLike[str]) -> None:
    """data written into what name is (a device, a FIFO, what a link leads to)."""
    try:
        # O_NONBLOCK: a FIFO without a reader is refused (ENXIO), not waited on.
        fd = os.open(name, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError as exc:
        why = {errno.ENXIO: "it is a FIFO that no one reads",
               errno.ENOENT: "it is a symbolic link to nothing",
               errno.EISDIR: "it leads to a directory; expected a file"}.get(exc.errno or 0)
        raise _refused(path, why or exc.strerror or str(exc)) from None
    try:
        found = os.fstat(fd)
        if stat.S_ISBLK(found.st_mode) or stat.S_ISSOCK(found.st_mode):
            raise _refused(path, "it leads to a block device or a socket; expected a file")
        if stat.S_ISREG(found.st_mode):   # a link to a file: the file, written anew
            os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
        _write_all(fd, data)
    except OSError as exc:
        raise _refused(path, exc.strerror or str(exc)) from None
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _atomic(dir_fd: int, name: str, data: bytes, path: Path, exists: bool,
            through: bool) -> None:
    try:
        fd = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o666, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise _refused(path, exc.strerror or str(exc)) from None
        _named(dir_fd, name, data, path, through)
        return
    try:
        _write_all(fd, data)
        unnamed = f"/proc/self/fd/{fd}"
        if not exists:
            try:
                os.link(unnamed, name, dst_dir_fd=dir_fd, follow_symlinks=True)
                return
            except FileExistsError:   # made meanwhile: decided again
                pass
        with _temporary(dir_fd, name, path) as tmp:
            os.link(unnamed, tmp, dst_dir_fd=dir_fd, follow_symlinks=True)
            _replace(dir_fd, tmp, name, path, through)
    except OSError as exc:
        raise _refused(path, exc.strerror or str(exc)) from None
    finally:
        os.close(fd)


def _replace(dir_fd: int, tmp: str, name: str, path: Path, through: bool) -> None:
    """tmp renamed over name if name is (still) a regular file or nothing; else what took
    its place meanwhile (a link, a device) is written as write_in would, and tmp removed."""
    try:
        found = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        found = None
    if found is None or stat.S_ISREG(found.st_mode):
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return
    with open(os.open(tmp, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd), "rb") as f:
        data = f.read()
    os.unlink(tmp, dir_fd=dir_fd)
    write_in(dir_fd, name, data, path, through=through)


def _named(dir_fd: int, name: str, data: bytes, path: Path, through: bool) -> None:
    """The write of a filesystem without O_TMPFILE: a temporary name, journaled, for all
    of it."""
    try:
        with _temporary(dir_fd, name, path) as tmp:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666,
                         dir_fd=dir_fd)
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
            _replace(dir_fd, tmp, name, path, through)
    except OSError as exc:
        raise _refused(path, exc.strerror or str(exc)) from None


@contextlib.contextmanager
def _temporary(dir_fd: int, name: str, path: Path) -> Iterator[str]:
    """A temporary name beside name, journaled while the block runs (it removes what of it
    is left, as a kill would leave it for the journal's undo)."""
    tmp = f".{name}.{os.urandom(4).hex()}.tmp"
    where = os.path.join(os.path.realpath(f"/proc/self/fd/{dir_fd}"), tmp)
    journal = Journal()
    token = journal.add(type="unlink", path=where)
    try:
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        journal.forget(token)


def output_dir(path: str | os.PathLike[str]) -> Path:
    """A directory for figure files, created if needed."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise VmtaxError(f"cannot create directory {path}: {exc.strerror or exc}") from None
    return path
