"""Kernel same-page merging (KSM) as a measured setting: turned on for a study, then put
back exactly as the host had it.

KSM merges identical pages of memory areas marked mergeable (QEMU marks guest RAM so by
default, mem-merge=on); idle guests of one image share much of theirs, which is E4's
"KSM on" density. Its knobs (/sys/kernel/mm/ksm/run, pages_to_scan, sleep_millisecs) are
host-wide, and concurrent vmtax runs share them, so each run holds a lease, the way huge
page pools are leased (vmtax.host.hugepages): its journal entry (type "ksm") records the host's
settings from before the first lease. A run ending, normally or killed (its guardian or
the next start undoes the journal), gives them back only when no other journal in the
runtime directory still holds a lease; the last one out restores the host's settings.
Each change is made holding an flock on the `run` file, so two runs' read-modify-writes
do not interleave.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from vmtax.core import target
from vmtax.core.errors import VmtaxError
from vmtax.host.journal import Journal, undone_by

SYSFS = Path("/sys/kernel/mm/ksm")
# What a lease changes, written back in this order (run last: ksmd stops once the rest is
# back, so it never scans at the study's rate with the host's run setting).
SETTINGS = ("pages_to_scan", "sleep_millisecs", "run")
COUNTERS = ("pages_shared", "pages_sharing", "pages_unshared", "pages_volatile",
            "full_scans")


def read(name: str, sysfs: Path = SYSFS) -> int:
    return int((sysfs / name).read_text().split()[0])


def settings(sysfs: Path = SYSFS) -> dict[str, int]:
    return {name: read(name, sysfs) for name in SETTINGS}


def counters(sysfs: Path = SYSFS) -> dict[str, int]:
    """KSM's counters (pages); a counter this kernel lacks is left out."""
    found = {}
    for name in COUNTERS:
        with contextlib.suppress(OSError, ValueError):
            found[name] = read(name, sysfs)
    return found


def unavailable(sysfs: Path = SYSFS) -> str | None:
    """Why this host cannot turn KSM on (None: it can)."""
    run = sysfs / "run"
    if not run.exists():
        return f"this kernel has no KSM ({sysfs} is missing; CONFIG_KSM)"
    try:
        run.open("r+").close()
    except OSError as exc:
        return f"changing KSM needs root (write access to {run}: {exc.strerror})"
    return None


@contextlib.contextmanager
def locked(sysfs: Path) -> Iterator[None]:
    with open(sysfs / "run") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _write(sysfs: Path, values: dict[str, int]) -> None:
    for name in SETTINGS:
        if name in values:
            (sysfs / name).write_text(f"{values[name]}\n")


def other_leases(journal: Journal, sysfs: Path) -> list[dict[str, Any]]:
    """KSM leases on sysfs in the other journals of journal's directory (live runs, and
    dead ones not undone yet), oldest journal first."""
    found: list[dict[str, Any]] = []
    for path in sorted(journal.dir.glob("journal-*-*.json"), key=lambda p: p.stat().st_mtime
                       if p.exists() else 0):
        if path == journal.path:
            continue
        with contextlib.suppress(OSError, ValueError):   # undone meanwhile
            found += [e for e in json.loads(path.read_text()).values()
                      if e.get("type") == "ksm" and e.get("path") == str(sysfs)]
    return found


def end_lease(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo a journaled lease (its owner is done or dead): the host's settings come back
    unless another run still holds a lease, which then carries them."""
    sysfs = Path(entry["path"])
    with locked(sysfs):
        if not other_leases(journal, sysfs):
            _write(sysfs, entry["saved"])


@dataclass
class Lease:
    """KSM on for one run: release() (idempotent) hands the knobs back."""
    journal: Journal
    sysfs: Path
    token: int | None
    saved: dict[str, int]

    def release(self) -> None:
        if self.token is not None:
            self.journal.undo(self.token)
            self.token = None


def enable(journal: Journal, pages_to_scan: int, sleep_millisecs: int,
           sysfs: Path = SYSFS) -> Lease:
    """Turn KSM on (run = 1) at this scan rate; journaled before anything is written."""
    why = unavailable(sysfs)
    if why is not None:
        raise VmtaxError(f"KSM: {why}")
    with locked(sysfs):
        others = other_leases(journal, sysfs)
        # With another run's lease out, the knobs are not the host's any more: its record
        # of the host's settings is the one to give back.
        saved = others[0]["saved"] if others else settings(sysfs)
        token = journal.add(type="ksm", undo=undone_by(end_lease), path=str(sysfs), saved=saved)
        try:
            _write(sysfs, {"pages_to_scan": pages_to_scan, "sleep_millisecs": sleep_millisecs,
                           "run": 1})
        except OSError as exc:
            _write(sysfs, saved)
            journal.forget(token)
            raise VmtaxError(f"KSM: writing {sysfs} failed ({exc.strerror or exc})") from None
    return Lease(journal, sysfs, token, saved)


@dataclass
class Settled:
    settled: bool
    seconds: float
    counters: dict[str, int]
    # The merge curve while waiting: (seconds since the call, pages_sharing) per reading.
    curve: list[tuple[float, int]] = field(default_factory=list)


def _scanned(sysfs: Path) -> int | None:
    """Pages ksmd has scanned (Linux 6.1 or later), None where the counter is missing."""
    try:
        return read("pages_scanned", sysfs)
    except (OSError, ValueError):
        return None


def wait_merged(threshold: float = 0.02, window: float = 5.0, timeout: float = 120.0,
                sysfs: Path = SYSFS, clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> Settled:
    """Until merging has settled: pages_sharing changed by less than `threshold` (a
    fraction) over the last `window` seconds, and either two full scans were done since
    the call or ksmd scanned nothing over the window (no memory is mergeable: then it
    counts no full scans at all); or `timeout`."""
    start = clock()
    scans = read("full_scans", sysfs)
    history: list[tuple[float, int, int | None]] = []
    while True:
        now, sharing, scanned = clock(), read("pages_sharing", sysfs), _scanned(sysfs)
        history.append((now, sharing, scanned))
        curve = [(round(t - start, 2), pages) for t, pages, _ in history]
        old = [h for h in history if h[0] <= now - window]
        if old:
            _, base, base_scanned = old[-1]
            idle = scanned is not None and scanned == base_scanned
            if ((idle or read("full_scans", sysfs) >= scans + 2)
                    and abs(sharing - base) <= threshold * max(base, sharing, 1)):
                return Settled(True, now - start, counters(sysfs), curve)
        if now - start >= timeout:
            return Settled(False, now - start, counters(sysfs), curve)
        sleep(min(1.0, window / 4))


# prctl(PR_SET_MEMORY_MERGE) (Linux 6.4) marks all of a process's memory mergeable; before
# it, only madvise(MADV_MERGEABLE) on each area does, which QEMU makes on guest RAM and
# nginx (or any ordinary program) never makes.
MEMORY_MERGE_SINCE = (6, 4)


def kernel_version(release: str) -> tuple[int, int] | None:
    """(major, minor) of a kernel release string like "6.1.0-56-amd64"."""
    found = re.match(r"(\d+)\.(\d+)", release)
    return (int(found[1]), int(found[2])) if found else None


def unmarked_note(kinds: Iterable[str], release: str) -> str | None:
    """Why KSM on does not change what containers cost, for a host running kernel
    `release`: of `kinds` (stored ones too), those whose target says its memory is not
    KSM-mergeable; None when no such kind was measured (or its plugin is gone)."""
    known = target.kinds()
    names = sorted({k for k in kinds if k in known and not known[k].ksm_mergeable})
    if not names:
        return None
    version = kernel_version(release)
    has_prctl = version is not None and version >= MEMORY_MERGE_SINCE
    since = ".".join(map(str, MEMORY_MERGE_SINCE))
    return (f"KSM and {', '.join(names)}: KSM merges only memory a process marked "
            "MADV_MERGEABLE; QEMU marks guest RAM, nginx in a container marks nothing, so "
            "KSM on leaves containers' memory as it is; "
            + (f"this kernel ({release}) has prctl(PR_SET_MEMORY_MERGE), which would mark "
               "a whole process, but vmtax does not set it for container processes."
               if has_prctl else
               f"this kernel ({release}) has no prctl(PR_SET_MEMORY_MERGE) to mark a whole "
               f"process (Linux {since} and later)."))
