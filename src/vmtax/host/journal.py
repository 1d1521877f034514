"""An undo journal of every change vmtax makes to the host.

Each change (a process started, a directory created, a sysctl written) is recorded in a
file under the runtime directory *before* it is made, and removed once it is undone (an
undo that fails leaves it listed, to be retried: see `Journal.undo_all`). On
a normal exit, Ctrl-C or SIGTERM the owner undoes its own entries; if vmtax was killed,
its guardian (vmtax.host.guardian) undoes them at once, or failing that the next vmtax start
(or `vmtax cleanup`) finds the journal of a dead process and undoes it.

An entry is a dict. The journal undoes the basic changes itself, by the entry's "type"
(kill, rmtree, unlink, write, rmdir, umount, argv); any other entry names the function that undoes
it in its "undo" field (`undone_by`), "vmtax.host.hugepages:end_lease", called with the
journal and the entry. It is named rather than registered because a guardian or `vmtax
cleanup` undoing a dead process's journal has imported none of the modules that wrote it.

A journal is carried out as its reader's user, so it is read only from a private runtime
directory (vmtax.core.paths.check_private), and every entry is checked before it acts
(`_refusal`): a process by its pid and start time, a directory tree only when the user
owns it and it is not a symbolic link, a command only as vmtax writes them (deleting a
network namespace, a network device or a container), a setting only under /sys or
/proc/sys, an undo function only of vmtax's own. A journal that cannot be written stops
what was about to change the host (VmtaxError), before it changes it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib
import itertools
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.host.proc import process_start_time, running


# Undoes one entry: called with the journal that holds it and the entry.
UndoHandler = Callable[["Journal", dict[str, Any]], None]

# How entries written before entries named their own undo are undone: a journal left by
# the previous version of vmtax (killed, then upgraded) must still be undone.
PREVIOUS_VERSION_UNDO = {"hugepages": "vmtax.host.hugepages:end_lease",
                         "ksm": "vmtax.host.ksm:end_lease",
                         "remote": "vmtax.host.ssh_session:undo"}

# Undo functions that moved after a vmtax had written their path into journals: a journal
# left by that version (killed, then upgraded) names the old path, and is undone by the
# function where it is now. Kept as long as such journals may exist; a move adds a line.
MOVED = {
    # libvirt's support went to its target's package (vmtax.targets.libvirt).
    "vmtax.host.libvirt:destroy_domain": "vmtax.targets.libvirt.virsh:destroy_domain",
    "vmtax.host.libvirt:delete_host_tap": "vmtax.targets.libvirt.virsh:delete_host_tap",
    "vmtax.host.libvirt:remove_guest_dir": "vmtax.targets.libvirt.virsh:remove_guest_dir",
    "vmtax.host.libvirt:close_guest_file": "vmtax.targets.libvirt.virsh:close_guest_file",
    "vmtax.host.libvirt:remove_chains": "vmtax.targets.libvirt.virsh:remove_chains",
    "vmtax.host.libvirt:destroy_network": "vmtax.targets.libvirt.nat:destroy_network",
    "vmtax.host.libvirt:restore_forwarding": "vmtax.targets.libvirt.nat:restore_forwarding",
}

# What an entry of each type leaves on the host while it is not undone (`describe`).
LEFT = {"kill": "process", "rmtree": "directory", "rmdir": "cgroup", "umount": "mount",
        "write": "setting", "ksm": "KSM setting", "hugepages": "huge page lease",
        "remote": "remote directory", "unlink": "temporary file"}
# The temporary names of the files vmtax writes for a user (vmtax.host.outputs), the only
# files an "unlink" entry removes.
TEMPORARY_FILE = re.compile(r"\..+\.[0-9a-f]{8}\.tmp")
JOURNAL_NAME = re.compile(r"journal-\d+-\d+\.json")
# A journal lists a few changes per target: a file far larger is none of vmtax's.
MAX_JOURNAL = 16 << 20


def undone_by(handler: UndoHandler) -> str:
    """What an entry records in its "undo" field to be undone by handler, a module-level
    function of vmtax: "vmtax.host.hugepages:end_lease"."""
    return f"{handler.__module__}:{handler.__qualname__}"


def _handler(name: str) -> UndoHandler:
    """The function an entry's "undo" names; only vmtax's own modules are imported, so a
    journal file cannot make vmtax run other code. A path that moved is followed (MOVED)."""
    module, _, function = MOVED.get(name, name).partition(":")
    if not module.startswith("vmtax.") or not function:
        raise Refused(f"journal entry undone by {name!r}, which is not a function of vmtax")
    try:
        handler: UndoHandler = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError):
        raise Refused(f"journal entry undone by {name!r}, which this vmtax does not "
                      "have") from None
    return handler


class Journal:
    """The journal of the process (pid, start): its start time tells a live owner from a
    dead one whose pid was reused, whatever program the owner is (vmtax, a script, tests)."""

    def __init__(self, directory: Path | None = None, pid: int | None = None,
                 start: int | None = None):
        self.dir = directory or paths.runtime_dir()
        if os.path.lexists(self.dir):   # else made private on the first write
            paths.check_private(self.dir)
        self.pid = pid or os.getpid()
        self.start = start if start is not None else (process_start_time(self.pid) or 0)
        self.path = self.dir / f"journal-{self.pid}-{self.start}.json"
        self.entries = _read(self.path)
        self._ids = itertools.count(max(self.entries, default=0) + 1)
        # Guests of a factory boot in threads: one writer of the file at a time.
        self._lock = threading.RLock()
        # Entries undone whose removal from the file failed (a full disk): the file lists
        # more than is left, which undoing again leaves as it is.
        self._stale = False
        self._failed: set[int] = set()   # entries whose last undo failed (undo_all)

    @classmethod
    def at(cls, path: Path) -> "Journal":
        """The journal stored at path (journal-PID-START.json)."""
        pid, start = (int(x) for x in path.stem.split("-")[1:3])
        return cls(path.parent, pid, start)

    def _write(self) -> None:
        if not self.entries:
            self.path.unlink(missing_ok=True)
            return
        paths.private_dir(self.dir)
        tmp = self.path.with_suffix(".tmp")
        try:
            with open(tmp, "w") as f:
                f.write(json.dumps(self.entries))
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def _record(self, token: int, entry: dict[str, Any]) -> None:
        """Make entry the journal's entry token, on disk first: if the file cannot be
        written, nothing changes and the change it records must not be made."""
        with self._lock:
            before = self.entries.get(token)
            self.entries[token] = entry
            try:
                self._write()
            except (OSError, VmtaxError) as exc:
                if before is None:
                    del self.entries[token]
                else:
                    self.entries[token] = before
                if isinstance(exc, VmtaxError):   # its directory is no longer private
                    raise
                raise VmtaxError(f"cannot write the undo journal {self.path} ({exc.strerror}); "
                                 "stopped before changing the host") from None
            self._stale = False

    def add(self, **entry: Any) -> int:
        """Record a change about to be made; returns a token for `undo`/`forget`. Raises
        VmtaxError, recording nothing, when the journal cannot be written."""
        with self._lock:
            token = next(self._ids)
            self._record(token, entry)
        return token

    def update(self, token: int, **fields: Any) -> None:
        """A recorded change grew or shrank (a huge page lease): record its new extent."""
        with self._lock:
            self._record(token, {**self.entries[token], **fields})

    def make_dir(self, parent: Path, prefix: str) -> tuple[Path, int]:
        """A new directory in parent, named prefix + an unpredictable suffix (as mkdtemp
        names it), mode 0700, journaled (rmtree) before it is made; with its token."""
        for _ in range(100):
            path = parent / f"{prefix}{_suffix()}"
            token = self.add(type="rmtree", path=str(path))
            try:
                path.mkdir(mode=0o700)
                return path, token
            except FileExistsError:       # not ours: it must not be removed
                self.forget(token)
            except OSError as exc:
                self.forget(token)
                raise VmtaxError(f"cannot create a directory in {parent}: "
                                 f"{exc.strerror}") from None
        raise VmtaxError(f"cannot create a directory in {parent}: every name taken")

    def process(self, pid: int) -> int:
        return self.add(type="kill", pid=pid, start=process_start_time(pid))

    def forget(self, token: int) -> None:
        """The change was undone by its owner: drop it from the journal. On a full disk
        the file keeps listing it until a later write, or the last forget, succeeds."""
        self.forget_all([token])

    def forget_all(self, tokens: list[int]) -> None:
        """forget each of tokens, with one write of the file."""
        with self._lock:
            dropped = [self.entries.pop(token, None) for token in tokens]
            if any(entry is not None for entry in dropped) or self._stale:
                try:
                    self._write()
                    self._stale = False
                except (OSError, VmtaxError):
                    self._stale = True

    def undo(self, token: int) -> None:
        entry = self.entries.get(token)
        if entry is not None:
            _undo(entry, self)
            self.forget(token)

    def undo_all(self) -> list[str]:
        """Undo every entry, newest first. Returns a description of each failure. An entry
        whose undo failed stays listed, for a later undo (the guardian's, the next vmtax
        start's, `vmtax cleanup`'s) to retry, unless it was refused (ValueError: not an
        entry vmtax writes), which no retry would carry out.

        Quick at scale (a 200-guest density run leaves ~800 entries: ~15 s one by one
        here, past issue #37's 10 s): a device in a network namespace this journal also
        deletes goes with the namespace, with no `ip` of its own (the kernel takes ~20 ms
        to delete each device by name, and all of a namespace's at once); directory trees
        wait while processes are killed, then go several at a time, the deepest first
        (each waits ~25 ms on the filesystem here; together they overlap). A tree still
        goes after every newer entry (a mount in it), and before any older entry but a
        process's kill: a daemon, a container manager's `rm` or a mount older than a tree
        is undone after it, as one by one would (a daemon took over 5 s to stop with its
        trees still there)."""
        errors: list[str] = []
        doomed = {ns: t for t, e in self.entries.items() if (ns := _deleted_namespace(e))}
        in_doomed: list[int] = []
        trees: list[int] = []
        for token in sorted(self.entries, reverse=True):
            entry = self.entries.get(token, {})
            if _device_namespace(entry) in doomed:
                in_doomed.append(token)
            elif entry.get("type") == "rmtree" and "undo" not in entry:
                trees.append(token)
            else:
                if entry.get("type") != "kill":
                    self._remove_trees(trees, errors)
                    trees = []
                if entry.get("type") == "daemon":
                    # A daemon stays while a newer change is listed: the devices of an
                    # older namespace go by name before it, as one by one would.
                    for device in in_doomed:
                        self._undo_noting(device, errors)
                    in_doomed = []
                self._undo_noting(token, errors)
                if (ns := _deleted_namespace(entry)) and token not in self.entries:
                    # Its devices went with it: forgotten now, or a daemon older than
                    # them would count them as changes still needing it, and stay.
                    gone = [t for t in in_doomed
                            if _device_namespace(self.entries[t]) == ns]
                    self.forget_all(gone)
                    in_doomed = [t for t in in_doomed if t not in gone]
        self._remove_trees(trees, errors)
        # A namespace that could not be deleted keeps its devices: those go by name.
        for token in in_doomed:
            self._undo_noting(token, errors)
        return errors

    def _remove_trees(self, trees: list[int], errors: list[str]) -> None:
        """Undo these rmtree entries TREES_AT_ONCE at a time, the deepest first, forgotten
        a level per write."""
        if not trees:   # most entries of a journal flush none: no pool for them
            return
        depth = {t: len(Path(str(self.entries[t].get("path"))).parts) for t in trees}
        from concurrent.futures import ThreadPoolExecutor   # ~5 ms: most commands need none

        with ThreadPoolExecutor(TREES_AT_ONCE) as pool:
            for level in sorted(set(depth.values()), reverse=True):
                tokens = [t for t in trees if depth[t] == level]
                list(pool.map(lambda t: self._undo_noting(t, errors, forget=False), tokens))
                self.forget_all([t for t in tokens if t not in self._failed])

    def _undo_noting(self, token: int, errors: list[str], forget: bool = True) -> None:
        """undo(token) (forget: also drop it; else the caller does, unless it failed),
        a failure added to errors."""
        entry = self.entries.get(token)
        if entry is None:
            return
        try:
            _undo(entry, self)
            self._failed.discard(token)
            if forget:
                self.forget(token)
        except Exception as exc:  # keep undoing the rest
            errors.append(f"{describe(entry)}: {exc}")
            self._failed.add(token)
            if isinstance(exc, ValueError):
                self.forget(token)


# Directory trees a whole journal's undo removes at once (undo_all).
TREES_AT_ONCE = 8


def _suffix() -> str:
    """An unpredictable name suffix, as mkdtemp's (secrets costs ~3 ms to import)."""
    return os.urandom(6).hex()


def _deleted_namespace(entry: dict[str, Any]) -> str | None:
    """NS of an entry `ip netns delete NS`."""
    argv = entry.get("argv") if entry.get("type") == "argv" else None
    return argv[3] if isinstance(argv, list) and len(argv) == 4 and \
        argv[:3] == ["ip", "netns", "delete"] else None


def _device_namespace(entry: dict[str, Any]) -> str | None:
    """NS of an entry `ip -n NS link delete DEV`."""
    argv = entry.get("argv") if entry.get("type") == "argv" else None
    return argv[2] if isinstance(argv, list) and len(argv) == 6 and argv[:2] == ["ip", "-n"] \
        and argv[3:5] == ["link", "delete"] else None


def _read(path: Path) -> dict[int, dict[str, Any]]:
    """The entries of the journal file at path (none if there is none); VmtaxError naming
    it if it is not a journal file of vmtax's user (a symbolic link, another's, not one)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:   # no changes yet, or all undone
        return {}
    except OSError as exc:
        raise VmtaxError(f"undo journal {path}: cannot be read ({exc.strerror})") from None
    with open(fd) as f:
        found = os.fstat(f.fileno())
        if not stat.S_ISREG(found.st_mode) or found.st_uid != os.geteuid():
            raise VmtaxError(f"undo journal {path} is not a file of uid {os.geteuid()}: "
                             "vmtax will not trust it (remove it)")
        try:
            entries = json.loads(f.read(MAX_JOURNAL))
            return {int(token): dict(entry) for token, entry in entries.items()
                    if isinstance(entry, dict)}
        except (ValueError, AttributeError, UnicodeDecodeError) as exc:
            raise VmtaxError(f"undo journal {path} is damaged ({str(exc)[:80]}): undo what "
                             "it lists by hand, then remove it") from None


class Refused(ValueError):
    """An entry that vmtax does not write: it is not carried out."""


def _absolute(value: Any) -> str:
    """value as a path an entry may name: absolute, normal, below a top-level directory."""
    if (not isinstance(value, str) or not os.path.isabs(value)
            or os.path.normpath(value) != value or len(Path(value).parts) < 3):
        raise Refused(f"path {value!r} is not one vmtax journals")
    return value


def _check_tree(path: str, journal: Journal) -> bool:
    """May the tree at path be removed? False when it is gone already."""
    home = Path(os.path.expanduser("~"))
    if Path(path) in {home, *home.parents, journal.dir, *journal.dir.parents}:
        raise Refused(f"{path} holds the home or runtime directory")
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(found.st_mode):
        raise Refused(f"{path} is a symbolic link")
    if found.st_uid != os.geteuid():
        raise Refused(f"{path} is owned by uid {found.st_uid}: not a directory vmtax made")
    return True


def _check_argv(argv: Any) -> list[str]:
    """argv as vmtax journals an undo command: `ip netns delete NS`, `ip -n NS link delete
    DEV`, or a container runtime's delete (through env(1) setting its configuration)."""
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise Refused(f"argv {argv!r} is not a list of strings")
    words = list(argv)
    if os.path.basename(words[0]) == "env":
        words = words[1:]
        while words and words[0].startswith("CONTAINERS_CONF="):   # podman's
            words = words[1:]
    program = os.path.basename(words[0]) if words else ""
    shape = words[1:]
    if program == "ip" and (len(shape) == 3 and shape[:2] == ["netns", "delete"]
                            or len(shape) == 5 and shape[0] == "-n"
                            and shape[2:4] == ["link", "delete"]):
        return argv
    # A runtime's global flags (each with its value, if any), then its delete command of
    # one container: no other command of the runtime.
    delete = 3 if shape[-3:-1] in (["delete", "-f"], ["delete", "--force"]) else \
        5 if shape[-5:-1] == ["rm", "--force", "--time=0", "--ignore"] else 0
    if delete and _only_flags(shape[:-delete]) and program in _container_runtimes():
        return argv
    raise Refused(f"command {' '.join(argv)[:120]!r} is not one vmtax journals")


def _only_flags(words: list[str]) -> bool:
    """Are words options only, each "--name VALUE", "--name=VALUE" or a flag? (Never "--",
    after which a program could run a command of its own.)"""
    for i, word in enumerate(words):
        takes_value = i > 0 and words[i - 1].startswith("--") and "=" not in words[i - 1]
        if not (word.startswith("-") and word != "--" or takes_value):
            return False
    return True


def _container_runtimes() -> set[str]:
    """The container runtimes whose containers outlive their processes (they remove them in
    `finish`): the programs whose delete command a journal may hold."""
    from vmtax.core.runtime import Runtime, runtimes

    return {name for name, cls in runtimes().items() if cls.finish is not Runtime.finish}


def _refusal(entry: dict[str, Any]) -> None:
    """Raise Refused unless entry is one vmtax writes, and safe to carry out."""
    kind = entry.get("type")
    if "undo" in entry:
        return          # _handler imports only vmtax's own modules
    if kind == "kill":
        if not isinstance(entry.get("pid"), int) or entry["pid"] <= 1 or not isinstance(
                entry.get("start"), (int, type(None))):
            raise Refused(f"process {entry.get('pid')!r} is not one vmtax journals")
    elif kind == "rmtree":
        _absolute(entry.get("path"))
    elif kind == "unlink":
        if not TEMPORARY_FILE.fullmatch(os.path.basename(_absolute(entry.get("path")))):
            raise Refused(f"removing {entry['path']} is not something vmtax does")
    elif kind == "write":
        path = _absolute(entry.get("path"))
        if not path.startswith(("/sys/", "/proc/sys/")) or not isinstance(entry.get("value"),
                                                                          str):
            raise Refused(f"writing {path} is not a setting vmtax changes")
    elif kind == "rmdir":
        paths_ = entry.get("paths")
        if not isinstance(paths_, list):
            raise Refused(f"directories {paths_!r} are not a list")
        for path in paths_:
            _absolute(path)
    elif kind == "umount":
        path = _absolute(entry.get("path"))
        if path.startswith(("/proc/", "/sys/", "/dev/")):
            raise Refused(f"unmounting {path} is not something vmtax does")
    elif kind == "argv":
        _check_argv(entry.get("argv"))
    elif kind not in PREVIOUS_VERSION_UNDO:
        raise Refused(f"unknown journal entry type {kind!r}")


def _undo(entry: dict[str, Any], journal: Journal) -> None:
    _refusal(entry)
    if "undo" in entry:   # a change of a module's own (a lease): that module undoes it
        _handler(entry["undo"])(journal, entry)
        return
    kind = entry["type"]
    if kind == "kill":
        pid = entry["pid"]
        if entry.get("start") is not None and process_start_time(pid) == entry["start"]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    elif kind == "rmtree":
        if _check_tree(entry["path"], journal):
            shutil.rmtree(entry["path"], ignore_errors=True)
    elif kind == "unlink":
        _remove_temporary(entry["path"])
    elif kind == "write":
        Path(entry["path"]).write_text(entry["value"])
    elif kind == "rmdir":
        _rmdir_all(entry["paths"])
    elif kind == "umount":
        subprocess.run(["umount", "-l", entry["path"]], capture_output=True)
    elif kind == "argv":
        subprocess.run(entry["argv"], capture_output=True, timeout=30)
    else:
        _handler(PREVIOUS_VERSION_UNDO[kind])(journal, entry)


def _remove_temporary(path: str) -> None:
    """A temporary file of vmtax's user's, where a kill left it: never what a link names."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(found.st_mode) and found.st_uid == os.geteuid():
        os.unlink(path)


def _rmdir_all(paths: list[str], within: float = 2.0) -> None:
    """Remove empty directories that may still be busy for a moment (a cgroup whose last
    task is exiting refuses rmdir with EBUSY); missing ones are already gone."""
    deadline = time.monotonic() + within
    for path in paths:
        while True:
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)


@contextlib.contextmanager
def _undoing(directory: Path) -> Iterator[None]:
    """One undoer of left journals at a time: a guardian, a starting vmtax and `vmtax
    cleanup` may find the same journal at once, and a lease must not be given back twice."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def undo_left(path: Path) -> str | None:
    """Undo what the journal at `path` still lists, in its owner's stead (the owner is dead
    or done); one line saying so, or None if nothing was left."""
    with _undoing(path.parent):
        journal = Journal.at(path)
        if not journal.entries:
            return None
        n = len(journal.entries)
        errors = journal.undo_all()
        if not journal.entries:
            path.unlink(missing_ok=True)
    kept = f", {len(journal.entries)} kept to retry" if journal.entries else ""
    return (f"undid {n} host change(s) left by vmtax process {journal.pid}"
            + (f" ({len(errors)} failed{kept}, first {errors[0][:200]})" if errors else ""))


def left_behind(directory: Path | None = None) -> list[Journal]:
    """Journals of dead processes, not undone yet."""
    directory = directory or paths.runtime_dir(create=False)
    found = [Journal.at(path) for path in sorted(directory.glob("journal-*-*.json"))
             if JOURNAL_NAME.fullmatch(path.name)]
    return [j for j in found if j.entries and not running(j.pid, j.start)]


def describe(entry: dict[str, Any]) -> str:
    """What an entry, while not undone, leaves on the host: "network namespace"."""
    kind = entry.get("type")
    if kind == "argv":
        argv = entry.get("argv") or []
        return ("network namespace" if argv[1:3] == ["netns", "delete"]
                else "network device" if "link" in argv else "container")
    # A plugin's own kind of change names itself: "libvirt-domain" is a libvirt domain.
    return LEFT.get(str(kind), str(kind).replace("-", " "))


def _plural(noun: str, n: int) -> str:
    if n == 1:
        return noun
    return noun[:-1] + "ies" if noun.endswith("y") else noun + ("es" if noun.endswith("s") else "s")


def left_behind_warning(directory: Path | None = None) -> str | None:
    """One line about changes dead vmtax processes left on this host (what they are), and
    how to undo them."""
    dead = left_behind(directory)
    if not dead:
        return None
    who = "vmtax process" + ("es " if len(dead) > 1 else " ") + ", ".join(str(j.pid) for j in dead)
    counts: dict[str, int] = {}
    for entry in (e for j in dead for e in j.entries.values()):
        counts[describe(entry)] = counts.get(describe(entry), 0) + 1
    what = ", ".join(f"{n} {_plural(noun, n)}" for noun, n in sorted(counts.items()))
    return (f"{who} died leaving {what} in place; `vmtax cleanup` undoes them, as does the "
            "next `vmtax run`")


def recover(directory: Path | None = None) -> list[str]:
    """Undo what crashed vmtax processes left behind. Returns one line per recovered journal."""
    return [line for j in left_behind(directory or paths.runtime_dir())
            if (line := undo_left(j.path))]
