"""The host's own workload programs on a remote machine, byte for byte.

A bundle holds the workloads' binaries, every shared library they load and the host's
dynamic loader (found as vmtax.guest.rootfs finds them for the container root filesystem). A
program runs as `LOADER --library-path LIB BINARY ARGS`, so the remote runs exactly the
host's programs against the host's glibc, whatever its own distribution is. It lives in
`WORKDIR/.vmtax-bundle-DIGEST`, named by the content hash of its files: targets of one
vmtax process that reach the same remote directory share one copy, checked with
sha256sum after the copy, and it is removed when the last of them is cleaned up.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import platform
import posixpath
import tarfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from vmtax.core import paths
from vmtax.core.errors import TargetError, VmtaxError
from vmtax.guest import rootfs
from vmtax.host import ssh_session

# What the bundle's programs are built for; the remote must be the same.
ARCH = "x86_64"
LOADER_PREFIX = "ld-linux"


@dataclass(frozen=True)
class Bundle:
    files: dict[str, Path]       # path inside the bundle -> host file
    programs: dict[str, str]     # program name (a job's argv[0]) -> path inside the bundle
    loader: str | None           # path of the dynamic loader inside the bundle
    digest: str
    sums: dict[str, str] = field(default_factory=dict)   # path inside -> sha256

    def dir(self, workdir: str) -> str:
        return posixpath.join(workdir, f".vmtax-bundle-{self.digest[:16]}")

    def argv(self, root: str, argv: list[str]) -> list[str]:
        """argv with a bundled program started from root through the bundled loader;
        other commands (sh, rm) are the remote's own."""
        inside = self.programs.get(argv[0])
        if inside is None:
            return list(argv)
        program = posixpath.join(root, inside)
        if self.loader is None:   # a static program needs no loader
            return [program, *argv[1:]]
        return [posixpath.join(root, self.loader), "--library-path",
                posixpath.join(root, "lib"), program, *argv[1:]]


def make(binaries: Iterable[str]) -> Bundle:
    """The bundle of the named host programs and everything they load."""
    if platform.machine() != ARCH:
        raise VmtaxError(f"ssh targets ship this host's {ARCH} programs; this host is "
                         f"{platform.machine()}")
    files: dict[str, Path] = {}
    programs: dict[str, str] = {}
    loader = None
    for name in sorted(set(binaries)):
        path = rootfs.which(name)
        # bin/NAME, an absolute NAME nested under bin; never outside it ("../x" is refused).
        inside = paths.inside("bin", name, "a program to ship")
        programs[name] = inside
        files[inside] = path
        for lib in rootfs.shared_libraries(path):
            inside = f"lib/{lib.name}"
            if files.get(inside, lib).resolve() != lib.resolve():
                raise VmtaxError(f"two different libraries named {lib.name}: {files[inside]} "
                                 f"and {lib}; they cannot share the bundle's lib directory")
            files[inside] = lib
            if lib.name.startswith(LOADER_PREFIX):
                loader = inside
    sums = {inside: rootfs.sha256_file(path) for inside, path in files.items()}
    digest = hashlib.sha256("".join(f"{k}\0{v}\n" for k, v in sorted(sums.items()))
                            .encode()).hexdigest()
    return Bundle(files, programs, loader, digest, sums)


def archive(bundle: Bundle) -> bytes:
    """The bundle's files as one gzip'd tar (for a channel that carries a file at a time
    slowly: a guest agent's); programs and libraries copied, not links to them."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", compresslevel=1, dereference=True) as tar:
        for inside, path in sorted(bundle.files.items()):
            tar.add(str(path), arcname=inside)
    return out.getvalue()


def check_arch(machine: str, where: str) -> None:
    if machine.strip() != ARCH:
        raise TargetError(f"{where}: the remote is {machine.strip() or 'of unknown type'}, "
                          f"not {ARCH}; vmtax runs this host's {ARCH} programs there")


# Bundles in use in this process: (user, host, port, directory) -> [targets, journal token].
_users: dict[tuple[str, ...], list[int]] = {}
_lock = threading.Lock()


def _key(session: ssh_session.Session, path: str) -> tuple[str, ...]:
    c = session.config
    return (str(c.user), c.host, str(c.port), path)


def check_argv(bundle: Bundle, root: str) -> list[str]:
    """The remote command that exits 0 only when the bundle's files in root are intact."""
    sums = "".join(f"{h}  {posixpath.join(root, p)}\n" for p, h in sorted(bundle.sums.items()))
    # No --quiet/--status: busybox's sha256sum (what `sh` runs on busybox systems, whatever
    # PATH says) lacks them; both exit non-zero on a mismatch.
    return ["sh", "-c", 'printf %s "$1" | sha256sum -c - > /dev/null 2>&1', "vmtax-sums", sums]


def _verified(session: ssh_session.Session, bundle: Bundle, root: str) -> bool:
    return session.run(check_argv(bundle, root)).exit_code == 0


def install(session: ssh_session.Session, bundle: Bundle, workdir: str, journal: Any) -> str:
    """Copy the bundle to the remote (unless a checked copy is there) and return its
    directory; journaled, so that it is removed even if vmtax dies."""
    root = bundle.dir(workdir)
    key = _key(session, root)
    with _lock:
        if key in _users:
            _users[key][0] += 1
            return root
        token = journal.add(**ssh_session.journal_entry(session.config, root, jobs=False))
        _users[key] = [1, token]
    try:
        if not _verified(session, bundle, root):
            session.check(["rm", "-rf", "--", root], f"clearing {root}")
            session.put({posixpath.join(root, p): path for p, path in bundle.files.items()})
            if not _verified(session, bundle, root):
                raise TargetError(f"ssh {session.config.where}: the copied programs in {root} "
                                  "do not match their checksums")
    except BaseException:
        release(session, bundle, workdir, journal)
        raise
    return root


def release(session: ssh_session.Session, bundle: Bundle, workdir: str, journal: Any) -> None:
    """One target is done with the bundle; the last one removes it. Unreachable, it stays
    in the journal, whose undo tries again over a new connection."""
    root = bundle.dir(workdir)
    key = _key(session, root)
    with _lock:
        users = _users.get(key)
        if users is None:
            return
        users[0] -= 1
        if users[0] > 0:
            return
        del _users[key]
    with contextlib.suppress(TargetError):
        ssh_session.remove(session, root, jobs=False)
        journal.forget(users[1])
