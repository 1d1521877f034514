"""The host as seen before and after an attack: processes, the run's journal entries and
what of them is still in place, huge pages and KSM, and the repetitions a results
directory holds."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any


def processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent, start time, command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found[int(entry.name)] = int(stat[1]), int(stat[19]), cmdline
        except (OSError, ValueError, IndexError):
            continue
    return found


def descendants(pid: int) -> dict[tuple[int, int], str]:
    table, found, todo = processes(), {}, [pid]
    while todo:
        parent = todo.pop()
        for child, (ppid, start, cmd) in table.items():
            if ppid == parent and (child, start) not in found:
                found[child, start] = cmd
                todo.append(child)
    return found


def host_state() -> dict[str, str]:
    """The host-wide state a run may change: huge page pools and KSM (by the journal entry
    type that changes each)."""
    state = {}
    for pool in Path("/sys/kernel/mm/hugepages").glob("hugepages-*"):
        state[f"hugepages {pool.name}"] = (pool / "nr_hugepages").read_text().strip()
    ksm = Path("/sys/kernel/mm/ksm")
    for name in ("run", "merge_across_nodes"):
        if (ksm / name).exists():
            state[f"ksm {name}"] = (ksm / name).read_text().strip()
    return state


def changed(before: dict[str, str], entries: list[dict[str, Any]]) -> list[str]:
    """What of the host-wide state differs from before, among what the run's journal
    changed: other sessions on a shared host may change the rest meanwhile."""
    touched = {e.get("type") for e in entries}
    now = host_state()
    return [f"{key} = {now.get(key)} (was {value})" for key, value in before.items()
            if key.split()[0] in touched and now.get(key) != value]


def journal_entries(runtime: Path) -> list[dict[str, Any]]:
    entries = []
    for path in runtime.glob("journal-*-*.json"):
        try:
            entries += json.loads(path.read_text()).values()
        except (OSError, ValueError):
            continue
    return entries


def netns_names() -> set[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return {line.split()[0] for line in done.stdout.splitlines() if line.strip()}


def links(netns: str | None = None) -> set[str]:
    done = subprocess.run(["ip", *(["-n", netns] if netns else []), "-o", "link"],
                          capture_output=True, text=True)
    return {line.split(":")[1].strip().split("@")[0] for line in done.stdout.splitlines()
            if line.count(":") >= 2}


def left_over(entry: dict[str, Any], table: dict[int, tuple[int, int, str]],
              mountinfo: str, nets: set[str], devices: set[str]) -> str | None:
    """What of a journal entry is still on the host (None: it is undone)."""
    kind = entry.get("type")
    if kind == "kill":
        pid = entry["pid"]
        if pid in table and table[pid][1] == entry.get("start"):
            return f"process {pid} ({table[pid][2][:60]})"
    elif kind == "rmtree" and Path(entry["path"]).exists():
        return f"directory {entry['path']}"
    elif kind == "rmdir":
        alive = [p for p in entry["paths"] if Path(p).exists()]
        if alive:
            return f"cgroup {alive[0]}"
    elif kind == "umount" and f" {entry['path']} " in mountinfo:
        return f"mount {entry['path']}"
    elif kind == "argv":
        argv = entry["argv"]
        name = argv[-1]
        if argv[:3] == ["ip", "netns", "delete"] and name in nets:
            return f"network namespace {name}"
        if argv[:1] == ["ip"] and "link" in argv and {"del", "delete"} & set(argv):
            # A device in a namespace (ip -n NS link del DEV) goes with its namespace.
            netns = argv[argv.index("-n") + 1] if "-n" in argv else None
            if (netns is None and name in devices
                    or netns in nets and name in links(netns)):
                return f"network device {name}" + (f" in {netns}" if netns else "")
    return None


def leftovers(entries: list[dict[str, Any]]) -> list[str]:
    table = processes()
    mountinfo = Path("/proc/self/mountinfo").read_text()
    nets, devices = netns_names(), links()
    return [what for e in entries if (what := left_over(e, table, mountinfo, nets, devices))]



def stored_reps(results: Path) -> dict[str, list[tuple]]:
    """run id -> its repetitions' identities, straight from SQLite (none while the
    database is missing or has no schema yet)."""
    found: dict[str, list[tuple]] = {}
    try:
        db = sqlite3.connect(f"file:{results / 'vmtax.sqlite'}?mode=ro", uri=True, timeout=5)
        try:
            for run_id, target, workload, params, phase, idx in db.execute(
                    "SELECT run_id, target, workload, params, phase, idx FROM reps"):
                found.setdefault(run_id, []).append((target, workload, params, phase, idx))
        finally:
            db.close()
    except sqlite3.Error:
        return {}
    return found


def run_stored(results: Path) -> bool:
    if not (results / "vmtax.sqlite").exists():
        return False
    try:
        db = sqlite3.connect(f"file:{results / 'vmtax.sqlite'}?mode=ro", uri=True, timeout=1)
        try:
            return db.execute("SELECT count(*) FROM runs").fetchone()[0] > 0
        finally:
            db.close()
    except sqlite3.Error:    # not created yet, or mid-creation
        return False


def duplicates(reps: dict[str, list[tuple]]) -> list[str]:
    return [f"run {run_id}: {len(ids) - len(set(ids))} repetitions stored twice"
            for run_id, ids in reps.items() if len(ids) != len(set(ids))]

