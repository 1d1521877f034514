"""Where vmtax keeps its cache (guest images, kernels) and its runtime journal, and how a
path a user names joins a tree of vmtax's (`under`, `inside`: never outside it).

The runtime directory holds the undo journal, whose entries vmtax carries out (it kills,
removes and runs what they list): a directory another user could write to, or had made
first (a non-root user's default is in /tmp), would let that user run commands as the
user of vmtax. So it is made mode 0700 and checked on every use (`check_private`).
"""

import os
import posixpath
import stat
from pathlib import Path

from vmtax.core.errors import VmtaxError
from vmtax.core.text import printable


def cache_dir() -> Path:
    """Where vmtax keeps what it builds and what it remembers (images, kernels, the plugin
    index, doctor's answers): made if missing, and trusted only when vmtax's user owns it
    and no one else can write to it, as `check_private` checks (a link to such a directory
    is taken). What vmtax reads there runs as code or becomes results: another user's files
    there would be their code and their numbers."""
    base = os.environ.get("VMTAX_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vmtax")
    path = Path(base)
    if base not in _trusted_caches:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise VmtaxError(f"cannot create the cache directory {path}: "
                             f"{exc.strerror}") from None
        problem = _problem(Path(os.path.realpath(path)))
        if problem:
            raise VmtaxError(f"cache directory {path} {problem}: vmtax will not trust what "
                             "it keeps there (remove it, or set VMTAX_CACHE to a directory of "
                             "your own)")
        _trusted_caches.add(base)
    return path


# The cache directories checked by this process (each is checked once).
_trusted_caches: set[str] = set()


def work_parent(results_dir: Path) -> Path:
    """Where a study makes its work directory (scratch files, guests' disks): VMTAX_WORK
    (vmtax lab: the lab's own disk, not the share its results go to), else its results
    directory."""
    return Path(os.environ.get("VMTAX_WORK") or results_dir)


def runtime_dir(create: bool = True) -> Path:
    """Host-wide state that must survive a crash of vmtax (the undo journal), checked as
    `check_private` does; create=False for those that only look (nothing is made, and a
    missing directory is returned unchecked)."""
    base = os.environ.get("VMTAX_RUNTIME") or (
        "/run/vmtax" if os.geteuid() == 0 else os.path.join(
            os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/vmtax-{os.geteuid()}", "vmtax"))
    path = Path(os.path.abspath(base))
    if create:
        return private_dir(path)
    if os.path.lexists(path):
        check_private(path)
    return path


def runtime_env() -> dict[str, str]:
    """The environment that makes a child process of vmtax use vmtax's own runtime and
    cache directories, whatever else its environment lacks."""
    return {"VMTAX_RUNTIME": str(runtime_dir()), "VMTAX_CACHE": str(cache_dir())}


def private_dir(path: Path) -> Path:
    """path, made mode 0700 (with any missing parents) unless it exists, then checked as
    `check_private` does."""
    missing = []
    at = path
    while not os.path.lexists(at) and at != at.parent:
        missing.append(at)
        at = at.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:   # made meanwhile, by whoever: checked below
            pass
        except OSError as exc:
            raise VmtaxError(f"cannot create the runtime directory {directory}: "
                             f"{exc.strerror}") from None
    check_private(path)
    return path


def check_private(path: Path) -> None:
    """VmtaxError naming path and what is wrong unless path is a directory (not a symbolic
    link) that vmtax's user owns and no one else can write to, inside directories only
    root or that user can change (a sticky one like /tmp may be writable by all)."""
    problem = _problem(path)
    if problem:
        raise VmtaxError(f"runtime directory {path} {problem}: vmtax will not trust it (remove "
                         "it, or set VMTAX_RUNTIME to a directory of your own)")


def _problem(path: Path) -> str | None:
    me = os.geteuid()
    try:
        found = os.lstat(path)
        if stat.S_ISLNK(found.st_mode):
            return "is a symbolic link"
        if not stat.S_ISDIR(found.st_mode):
            return "is not a directory"
        if found.st_uid != me:
            return f"is owned by uid {found.st_uid}, not by uid {me} that runs vmtax"
        if found.st_mode & 0o022:
            return f"is writable by others (mode {stat.S_IMODE(found.st_mode):o})"
        # Whoever can change a directory above it can swap it for one of their own.
        real = Path(os.path.realpath(path))
        for above in dict.fromkeys([*path.parents, *real.parents]):
            found = os.lstat(above)
            if found.st_uid not in (0, me):
                return f"is inside {above}, owned by uid {found.st_uid}"
            if (not stat.S_ISLNK(found.st_mode) and found.st_mode & 0o022
                    and not found.st_mode & stat.S_ISVTX):
                return (f"is inside {above}, which others can write to (mode "
                        f"{stat.S_IMODE(found.st_mode):o})")
    except OSError as exc:
        return f"cannot be checked ({exc.strerror})"
    return None


def inside(root: str, name: str, what: str) -> str:
    """The POSIX path of name (absolute or relative) under root, as a path in another
    tree (a remote's, a guest's, a container's): "/usr/bin/x" -> ROOT/usr/bin/x; a
    VmtaxError naming what when name, once ".." is resolved, would land outside root (or on
    it), as "../../x" would wherever root is."""
    root = posixpath.normpath(root)
    joined = posixpath.normpath(posixpath.join(root, name.lstrip("/")))
    if posixpath.commonpath([root, joined]) != root or joined == root:
        raise VmtaxError(f"{what}: '{printable(name)}' would land outside {printable(root)}; "
                         "expected a path inside it")
    return joined


def under(root: str | os.PathLike[str], name: str | os.PathLike[str], what: str) -> Path:
    """name joined under the local directory root, as `inside` does, and also refused when a
    symbolic link already in root would take it outside."""
    base = os.path.abspath(root)
    dest = inside(base, os.fspath(name), what)
    real = os.path.realpath(base)
    if posixpath.commonpath([real, os.path.realpath(dest)]) != real:
        raise VmtaxError(f"{what}: '{printable(os.fspath(name))}' leads outside {base} "
                         "through a symbolic link in it; expected a path inside it")
    return Path(dest)
