"""Host huge pages that back guest RAM: reserve what the guests need, check what the kernel
granted, give it back.

A page size's pool (`/sys/kernel/mm/hugepages/hugepages-<kB>kB/nr_hugepages`; for 2 MiB the
same number as /proc/sys/vm/nr_hugepages) is raised by exactly the pages this vmtax's guests
need, so pages someone else reserved are never taken, and lowered by as many once each guest
is gone: at cleanup, and on Ctrl-C or SIGTERM (the same path). Concurrent runs share the
pool, so each holds a lease: its journal records what it added (never less), and after a
crash the pool is lowered by exactly that, never below what other runs' leases hold; with
every run's changes undone the pool is what it was before the first. Each change is made
holding an flock on the pool's own nr_hugepages file, so two processes' read-modify-writes
do not interleave, whatever runtime directory they use. Guest RAM is a file on a private
hugetlbfs mount of that page size; QEMU unlinks it at once, so its pages go back to the
pool when QEMU exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from vmtax.core.errors import VmtaxError
from vmtax.host import proc
from vmtax.host.journal import Journal, undone_by

SIZES = {"2M": 2 << 20, "1G": 1 << 30}
SYSFS = Path("/sys/kernel/mm/hugepages")
MEMINFO = Path("/proc/meminfo")
COMPACT = Path("/proc/sys/vm/compact_memory")
# Memory the host keeps for itself beyond the pages reserved: a plan that would leave it
# less is refused up front rather than pushing the host into swapping or the OOM killer.
HOST_HEADROOM = 1 << 30


def label(size: str) -> str:
    return f"{SIZES[size] >> 20} MiB" if SIZES[size] < 1 << 30 else f"{SIZES[size] >> 30} GiB"


def human(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.1f} GiB" if nbytes >= 1 << 30 else f"{nbytes >> 20} MiB"


def pool_dir(size: str, sysfs: Path = SYSFS) -> Path:
    return sysfs / f"hugepages-{SIZES[size] >> 10}kB"


def pages_needed(memory: int, size: str) -> int:
    """Pages of `size` that hold `memory` bytes of guest RAM exactly."""
    if memory % SIZES[size]:
        raise VmtaxError(f"guest memory of {human(memory)} is not a whole number of "
                         f"{label(size)} huge pages")
    return memory // SIZES[size]


def meminfo(path: Path = MEMINFO) -> dict[str, int]:
    """/proc/meminfo as name -> number (kB for the sized lines, a count for HugePages_*)."""
    values = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        if rest.split():
            values[name.strip()] = int(rest.split()[0])
    return values


def capacity_problem(wanted: dict[str, int], sysfs: Path = SYSFS,
                     meminfo_path: Path = MEMINFO) -> str | None:
    """Why this host cannot reserve `wanted` (page size -> pages, all held at once) on top
    of what it has reserved now; None if it looks able to. Only the kernel knows for sure
    (fragmentation): Pool.reserve checks what it granted."""
    for size in wanted:
        nr = pool_dir(size, sysfs) / "nr_hugepages"
        if not nr.parent.is_dir():
            return f"this host has no {label(size)} huge pages ({nr.parent} is missing)"
        if not os.access(nr, os.W_OK):
            return f"reserving huge pages needs root (write access to {nr})"
    available = meminfo(meminfo_path).get("MemAvailable")
    total = sum(pages * SIZES[size] for size, pages in wanted.items())
    if available is not None and total > available * 1024 - HOST_HEADROOM:
        pages = " and ".join(f"{pages} {label(size)}" for size, pages in wanted.items())
        return (f"{pages} huge pages ({human(total)}) do not fit in the "
                f"{human(available * 1024)} this host has available while keeping "
                f"{human(HOST_HEADROOM)} for itself")
    return None


@contextlib.contextmanager
def locked(nr: Path) -> Iterator[None]:
    """The pool behind nr_hugepages `nr` to this process alone (until the block ends)."""
    with open(nr) as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def persistent(nr: Path) -> int:
    """The pool's size as set through nr_hugepages: without surplus pages, which are those
    still in use after it was lowered (a killed QEMU not yet gone) and leave by themselves."""
    surplus = nr.parent / "surplus_hugepages"
    return int(nr.read_text().split()[0]) - (int(surplus.read_text()) if surplus.exists() else 0)


def held_elsewhere(journal: Journal, pool: str) -> int:
    """Pages of the huge page pool at `pool` that the leases in the other journals of
    journal's directory hold (live runs, and dead ones not undone yet)."""
    held = 0
    for path in journal.dir.glob("journal-*-*.json"):
        if path != journal.path:
            with contextlib.suppress(OSError, ValueError):   # undone meanwhile
                held += sum(e["added"] for e in json.loads(path.read_text()).values()
                            if e.get("type") == "hugepages" and e["path"] == pool)
    return held


def end_lease(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo a journaled lease (its owner is done or dead): lower the pool by what the owner
    added, never below what the other leases hold, never raise it."""
    nr = Path(entry["path"])
    with locked(nr):
        now = persistent(nr)
        pages = max(now - entry["added"], min(now, held_elsewhere(journal, entry["path"])))
        if pages != now:
            nr.write_text(f"{pages}\n")


def mount_hugetlbfs(journal: Journal, size: str) -> tuple[Path, list[int]]:
    """A private hugetlbfs of `size` pages; returns its mount point and the journal tokens
    that unmount and remove it (undo them newest first)."""
    directory, made = journal.make_dir(Path(tempfile.gettempdir()), f"vmtax-hugetlbfs-{size}-")
    tokens = [made, journal.add(type="umount", path=str(directory))]
    done = proc.run(["mount", "-t", "hugetlbfs", "-o", f"pagesize={size},mode=0700",
                     "vmtax", str(directory)], timeout=30)
    if done.exit_code != 0:
        for token in reversed(tokens):
            journal.undo(token)
        raise VmtaxError(f"mounting hugetlbfs ({label(size)} pages) on {directory} failed: "
                         f"{done.stderr.strip()[-300:] or 'no error output'}")
    return directory, tokens


@dataclass
class Reservation:
    """Pages one guest holds in a pool; release() gives them back (idempotent)."""
    pool: "Pool"
    requested: int
    granted: int
    released: bool = False

    @property
    def mountpoint(self) -> Path:
        # The pool stays mounted while any reservation holds pages.
        if self.pool.mountpoint is None:
            raise VmtaxError("huge pages: the reservation was released")
        return self.pool.mountpoint

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.pool.release(self.requested)


class Pool:
    """One page size's pool as this process uses it: raised by what its guests hold.

    Changes are relative (read, add, read back), so pages someone else reserved meanwhile,
    another vmtax included, are left alone. `mount` makes the hugetlbfs the guests' RAM
    files live on (a parameter so tests can use a fake sysfs without mounting anything)."""

    def __init__(self, journal: Journal, size: str, sysfs: Path = SYSFS,
                 mount: Callable[[Journal, str], tuple[Path, list[int]]] = mount_hugetlbfs,
                 compact: Path = COMPACT):
        self.journal = journal
        self.size = size
        self.path = pool_dir(size, sysfs) / "nr_hugepages"
        self.mount = mount
        self.compact = compact
        self.held = 0                   # pages this process's guests hold
        self.added = 0                  # by how much this process changed the pool
        self.mountpoint: Path | None = None
        self._lease: int | None = None     # journal token: what `added` was at most
        self._mount_tokens: list[int] = []

    def _read(self) -> int:
        return persistent(self.path)

    def _write(self, pages: int) -> None:
        self.path.write_text(f"{pages}\n")

    def _add(self, pages: int) -> int:
        """Change the pool by `pages`; returns by how much the kernel changed it. The lease
        never says less than was added (raised before a raise, lowered after a lowering):
        a crash in between costs at most a few pages too many given back, never a leak."""
        lease = self._open_lease()
        with locked(self.path):
            if pages > 0:
                self.journal.update(lease, added=self.added + pages)
            before = self._read()
            self._write(max(before + pages, 0))
            changed = self._read() - before
            self.added += changed
            self.journal.update(lease, added=self.added)
        return changed

    def _open_lease(self) -> int:
        """The journal token of the lease, which _open takes before the pool changes."""
        assert self._lease is not None, "the pool is changed only while its lease is open"
        return self._lease

    def reserve(self, pages: int) -> Reservation:
        """Raise the pool by `pages`; if the kernel grants fewer, give them back and fail."""
        if not self.path.exists():
            raise VmtaxError(f"this host has no {label(self.size)} huge pages "
                             f"({self.path.parent} is missing)")
        if self.held == 0:
            self._open()
        granted = 0
        try:
            granted = self._add(pages)
            if granted < pages and self.compact.exists():
                # Free memory may be there but scattered: compaction assembles whole huge
                # pages (what 1 GiB pages usually need), then the kernel is asked again.
                self.compact.write_text("1\n")
                granted += self._add(pages - granted)
        except OSError as exc:
            self._give_back(granted)
            raise VmtaxError(f"cannot reserve huge pages: writing {self.path} failed "
                             f"({exc.strerror or exc})") from None
        if granted < pages:
            self._give_back(granted)
            raise VmtaxError(
                f"the kernel granted only {max(granted, 0)} of the {pages} {label(self.size)} "
                f"huge pages asked for ({self.path}): too little free or too fragmented "
                "memory; free some, or give the guest less memory")
        self.held += pages
        return Reservation(self, pages, granted)

    def _give_back(self, granted: int) -> None:
        with contextlib.suppress(OSError):   # already failing: the journal retries at exit
            self._add(-granted)
            if self.held == 0:
                self._close()

    def release(self, pages: int) -> None:
        self.held -= pages
        self._add(-pages)
        if self.held == 0:
            self._close()

    def _open(self) -> None:
        self._lease = self.journal.add(type="hugepages", undo=undone_by(end_lease),
                                       path=str(self.path), added=0)
        try:
            self.mountpoint, self._mount_tokens = self.mount(self.journal, self.size)
        except BaseException:
            self._close()
            raise

    def _close(self) -> None:
        # Newest first: the mount, then the lease, which gives back anything the kernel
        # would not take back before (nothing, normally).
        for token in reversed(self._mount_tokens):
            self.journal.undo(token)
        self._mount_tokens = []
        self.mountpoint = None
        self.journal.undo(self._open_lease())
        self.added = 0


# The pools of one invocation (one journal), shared by its VM targets: two guests on 2 MiB
# pages raise one pool and share one hugetlbfs mount, unmounted when both are gone.
_POOLS: "weakref.WeakKeyDictionary[Journal, dict[str, Pool]]" = weakref.WeakKeyDictionary()


def pool(journal: Journal, size: str) -> Pool:
    pools = _POOLS.setdefault(journal, {})
    if size not in pools:
        pools[size] = Pool(journal, size)
    return pools[size]


def reserve_guest_ram(journal: Journal, name: str, memory: int,
                      size: str | None) -> Reservation | None:
    """Host huge pages of `size` for a guest's `memory` bytes of RAM, before its QEMU
    starts (None when it asks for none); a one-line error naming the target when the host
    cannot give them."""
    if size is None:
        return None
    pages = pages_needed(memory, size)
    problem = capacity_problem({size: pages})
    if problem:
        raise VmtaxError(f"{name}: hugepages = {size}: {problem}")
    return pool(journal, size).reserve(pages)


# -- the guest side ---------------------------------------------------------------------

GUEST_PAGE = SIZES["2M"]         # hugepages=N on an x86 guest's command line: 2 MiB pages


def host_free() -> int:
    """Free 2 MiB pages on the host: what a workload on the host (native, containers) gets."""
    try:
        return int((pool_dir("2M") / "free_hugepages").read_text())
    except (OSError, ValueError):
        return 0
