"""The files of a site `vmtax publish` writes, which it owns, and only those.

DIR holds a manifest of its own (MANIFEST): each file publish wrote, its sha256 (and the
stat of its last write, so an unchanged file is not read again) and what it was made from
(a run page: the run's status, its values and whether it has figures), so a page whose
run changed since (an interrupted run resumed and finished) is written again. Publish
refuses, in one line naming it, a DIR that holds anything else: a file it did not write, or
one changed since it wrote it (a user's own index.html, a page planted for a run), a
symbolic link, a FIFO or device, a directory but its own three; a non-empty DIR without a
manifest is not publish's at all. Nothing is followed out of DIR: every file is opened and
written relative to its directory's descriptor, without following a link (vmtax.host.outputs'
write_in, vmtax.core.files' read_back); a page is read only as a bounded regular file.
A new hash is recorded before its file is written, so a publish killed between the two
leaves a DIR the next publish still owns.

Names are checked where they are joined: a page is `index.html` or SUBDIR/NAME.html, NAME
a run id, a series' name or two run ids, never a path.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from vmtax.core.errors import VmtaxError
from vmtax.core.files import Untrusted, kind_of, read_back
from vmtax.core.text import printable
from vmtax.host import outputs

MANIFEST = ".vmtax-site.json"
SUBDIRS = ("runs", "trends", "changes")
# A run's page with figures inlined is a few MB; the manifest lists one line per page.
MAX_PAGE = 64 << 20
MAX_MANIFEST = 16 << 20
_PAGE = re.compile(r"(?:(?:runs|trends|changes)/)?[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.html")


class SiteError(VmtaxError):
    """DIR holds what publish did not write, or cannot be written."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class SiteFiles:
    """DIR, opened and checked as the module says: its pages read and written by name."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.path = Path(directory)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise SiteError(f"cannot publish into {self.path}: {exc.strerror}") from None
        self._subdirs: dict[str, int] = {}
        try:
            self.files = self._manifest()
            self._check()
            for sub in SUBDIRS:
                self._subdir(sub)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for fd in [*self._subdirs.values(), self.fd]:
            os.close(fd)
        self._subdirs.clear()

    def __enter__(self) -> "SiteFiles":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _refuse(self, name: str, why: str) -> SiteError:
        return SiteError(f"cannot publish into {self.path}: {printable(name)} {why}, which "
                         "publish did not write; publish into a new or empty directory, or "
                         "remove it")

    def _manifest(self) -> dict[str, dict[str, Any]]:
        try:
            kept = json.loads(read_back(MANIFEST, f"{self.path}'s manifest", MAX_MANIFEST,
                                        dir_fd=self.fd))
        except FileNotFoundError:
            if os.listdir(self.fd):
                first = sorted(os.listdir(self.fd))[0]
                raise self._refuse(first, "is there and no manifest of vmtax's") from None
            return {}
        except Untrusted as exc:
            raise SiteError(f"cannot publish into {self.path}: {exc}") from None
        except ValueError:
            raise SiteError(f"cannot publish into {self.path}: its manifest {MANIFEST} is "
                            "damaged; publish into a new directory") from None
        files = kept.get("files") if isinstance(kept, dict) else None
        if not isinstance(files, dict) or not all(
                isinstance(v, dict) and isinstance(v.get("sha256"), list) for v in files.values()):
            raise SiteError(f"cannot publish into {self.path}: its manifest {MANIFEST} is "
                            "damaged; publish into a new directory")
        return files

    def _check(self) -> None:
        """Everything in DIR is publish's own, as it wrote it."""
        for entry in os.scandir(self.fd):
            if entry.name == MANIFEST:
                continue
            if entry.name in SUBDIRS and entry.is_dir(follow_symlinks=False):
                sub = self._subdir(entry.name)
                for inner in os.scandir(sub):
                    self._check_file(f"{entry.name}/{inner.name}", inner, sub)
            else:
                self._check_file(entry.name, entry, self.fd)

    def _check_file(self, name: str, entry: os.DirEntry[str], dir_fd: int) -> None:
        found = entry.stat(follow_symlinks=False)
        if not stat.S_ISREG(found.st_mode):
            raise self._refuse(name, f"is {kind_of(found.st_mode)}")
        kept = self.files.get(name)
        if kept is None:
            raise self._refuse(name, "is there")
        if kept.get("stat") == _stat(found):
            return
        try:
            data = read_back(entry.name, f"the page {self.path / name}", MAX_PAGE,
                             dir_fd=dir_fd)
        except Untrusted as exc:
            raise SiteError(f"cannot publish into {self.path}: {exc}") from None
        if _sha256(data) not in kept["sha256"]:
            raise self._refuse(name, "was changed since vmtax wrote it")
        kept["stat"] = _stat(found)

    def _subdir(self, name: str) -> int:
        if name not in self._subdirs:
            try:
                os.mkdir(name, dir_fd=self.fd)
            except FileExistsError:
                pass
            except OSError as exc:
                raise SiteError(f"cannot publish into {self.path}: {name}/ cannot be made "
                                f"({exc.strerror})") from None
            try:
                self._subdirs[name] = os.open(name, os.O_RDONLY | os.O_DIRECTORY |
                                              os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
            except OSError:
                raise self._refuse(name, "is not a directory") from None
        return self._subdirs[name]

    def _where(self, name: str) -> tuple[int, str]:
        if not _PAGE.fullmatch(name):
            raise SiteError(f"publish: {printable(name)!r} is not a page name of a site")
        sub, _, base = name.rpartition("/")
        return (self._subdir(sub) if sub else self.fd), base

    def made_from(self, name: str) -> Any:
        """What the page was last written from (None: not written, or no record)."""
        return self.files.get(name, {}).get("made_from")

    def has(self, name: str) -> bool:
        return name in self.files

    def write(self, name: str, data: bytes, made_from: Any = None) -> None:
        """The page name written (never through a link), recorded in the manifest: its
        new hash before the write, its stat after."""
        dir_fd, base = self._where(name)
        entry = self.files.setdefault(name, {"sha256": []})
        entry["sha256"] = [*entry["sha256"][-1:], _sha256(data)]
        self._save()
        outputs.write_in(dir_fd, base, data, self.path / name, through=False)
        self.files[name] = {"sha256": [_sha256(data)],
                            "stat": _stat(os.stat(base, dir_fd=dir_fd, follow_symlinks=False)),
                            "made_from": made_from}

    def _save(self) -> None:
        data = json.dumps({"files": self.files}, sort_keys=True).encode()
        outputs.write_in(self.fd, MANIFEST, data, self.path / MANIFEST, through=False)

    def finish(self) -> None:
        """The manifest as the pages now are."""
        self._save()


def _stat(found: os.stat_result) -> list[int]:
    """What any write to a file changes (ctime included, which no user can set back)."""
    return [found.st_ino, found.st_size, found.st_ctime_ns]

