"""A cache others planted or garbled (issue #45, defects 4 and 5): a cache directory of
another user's or writable by all; a plugin index naming a module of someone else's, or
with a group lost or an entry null; a FIFO or /dev/zero as the plugin index, as doctor's
version cache and as the stamp of a checked database; a kernel record that is garbled,
lacks its path, gives it as a list or claims another file's hash; a trojan program in a
cached rootfs. Each is refused in one line, at once, or made again; nothing planted runs."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any, Callable

from torture_kit.env import OTHER_UID, VMTAX, Env, Outcome, check_output
from torture_kit.registry import Attack
from torture_kit.stores import traversal_store

SENTINEL_MODULE = "torture_planted_plugin"


def _vmtax(env: Env, cache: Path, *args: str, extra: dict[str, str] | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run([*VMTAX, *args], text=True, capture_output=True,
                              timeout=timeout, env={**env.env, "VMTAX_CACHE": str(cache),
                                                    **(extra or {})})
    except subprocess.TimeoutExpired:
        return None


def _expect(outcome: Outcome, what: str, done: subprocess.CompletedProcess | None,
            refused: bool) -> None:
    """done refused in one line (refused) or through (not refused), never a traceback."""
    outcome.cases += 1
    if done is None:
        outcome.fail(f"{what}: still running after 60 s")
        return
    check_output(outcome, what, done.stderr)
    lines = done.stderr.strip().splitlines()
    if refused and (done.returncode != 2 or len(lines) != 1):
        outcome.fail(f"{what}: exit {done.returncode}, not refused in one line: "
                     f"{done.stderr.strip()[-200:]}")
    elif not refused and done.returncode != 0:
        outcome.fail(f"{what}: exit {done.returncode}: {done.stderr.strip()[-200:]}")
    else:
        outcome.note("refused in one line" if refused else "made again")


def _untrusted_caches(env: Env, outcome: Outcome) -> None:
    spoils: dict[str, Callable[[Path], None]] = {"writable by all": lambda c: c.chmod(0o777)}
    if os.geteuid() == 0:
        spoils["of another user"] = lambda c: os.chown(c, OTHER_UID, OTHER_UID)
    for n, (what, spoil) in enumerate(spoils.items()):
        cache = env.work / f"cache-untrusted-{n}"
        cache.mkdir()
        spoil(cache)
        _expect(outcome, f"a cache directory {what}", _vmtax(env, cache, "list", "targets"),
                refused=True)


def _index(env: Env, cache: Path) -> Path:
    """The plugin index vmtax keeps in cache (made by a first command)."""
    _vmtax(env, cache, "list", "targets")
    [index] = cache.glob("plugin-index-*.json")
    return index


def _garbled_indexes(env: Env, outcome: Outcome, quick: bool) -> None:
    sentinel = env.work / "planted-plugin-ran"
    planted = env.work / "planted-modules"
    planted.mkdir()
    (planted / f"{SENTINEL_MODULE}.py").write_text(
        f"open({str(sentinel)!r}, 'w').write('ran')\n")

    def foreign(index: dict[str, Any]) -> None:
        index["groups"]["target"]["native"][0] = SENTINEL_MODULE

    def lost_group(index: dict[str, Any]) -> None:
        del index["groups"]["target"]

    def null_entry(index: dict[str, Any]) -> None:
        index["groups"]["target"]["native"] = None

    spoils = {"naming a module of someone else's": foreign, "that lost a group": lost_group,
              "with a null entry": null_entry}
    for n, (what, spoil) in enumerate(list(spoils.items())[:1 if quick else 3]):
        cache = env.work / f"cache-index-{n}"
        index = _index(env, cache)
        kept = json.loads(index.read_text())
        spoil(kept)
        index.write_text(json.dumps(kept))
        path = os.pathsep.join(filter(None, [str(planted), env.env.get("PYTHONPATH")]))
        done = _vmtax(env, cache, "list", "targets", extra={"PYTHONPATH": path})
        if done is not None and done.returncode == 0 and "native" not in done.stdout:
            outcome.fail(f"a plugin index {what}: `vmtax list targets` lacks native")
        _expect(outcome, f"a plugin index {what}", done, refused=False)
        if sentinel.exists():
            outcome.fail(f"a plugin index {what}: vmtax imported the module it named")
            sentinel.unlink()


def _odd_files(env: Env, outcome: Outcome, quick: bool) -> None:
    """A FIFO and /dev/zero where vmtax keeps a file it reads back."""
    makers: dict[str, Callable[[Path], None]] = {"a FIFO": os.mkfifo}
    if os.geteuid() == 0 and not quick:
        makers["/dev/zero"] = lambda p: os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    results = env.work / "cache-odd-r"
    traversal_store(results)
    for n, (what, make) in enumerate(makers.items()):
        cache = env.work / f"cache-odd-{n}"
        index = _index(env, cache)
        _vmtax(env, cache, "runs", "--results", str(results))   # its stamp, once checked
        places = {"the plugin index": (index, ["list", "targets"]),
                  "the stamp of a checked database": (
                      next((cache / "checked").glob("*.json")), ["runs", "--results",
                                                                str(results)])}
        for where, (path, command) in places.items():
            path.unlink()
            make(path)
            _expect(outcome, f"{what} as {where}", _vmtax(env, cache, *command),
                    refused=True)
            path.unlink()
    if quick:
        return
    cache = env.work / "cache-odd-doctor"
    cache.mkdir()
    os.mkfifo(cache / "doctor-versions.json")
    _expect(outcome, "a FIFO as doctor's version cache",
            _vmtax(env, cache, "doctor", "--json", timeout=120), refused=True)


def planted_caches(env: Env, outcome: Outcome, quick: bool) -> None:
    _untrusted_caches(env, outcome)
    _garbled_indexes(env, outcome, quick)
    _odd_files(env, outcome, quick)


def _kernel_records(env: Env, outcome: Outcome) -> None:
    """A kernel's record garbled, without its path, with its path as a list, or claiming
    the hash of another file: refused in one line, and out of the cache."""
    import hashlib

    from vmtax.core.errors import VmtaxError
    from vmtax.guest.kernel_cache import load_kernel

    elf = b"\x7fELF" + bytes(1000)
    good = {"path": "vmlinux", "version": "6.1.0", "sha256": hashlib.sha256(elf).hexdigest(),
            "modules": {}, "hz": 1000}
    records = {"garbled": "{ not json", "without its path": {**good, "path": None},
               "with its path a list": {**good, "path": ["vmlinux"]},
               "claiming another file's hash": {**good, "sha256": "0" * 64}}
    for n, (what, record) in enumerate(records.items()):
        kdir = env.work / "kernel-records" / "kernels" / f"linux-image-{n}"
        kdir.mkdir(parents=True)
        (kdir / "vmlinux").write_bytes(elf)
        (kdir / "meta.json").write_text(record if isinstance(record, str)
                                        else json.dumps(record))
        outcome.cases += 1
        try:
            load_kernel(kdir)
            outcome.fail(f"a kernel record {what}: used")
        except VmtaxError as exc:
            if "\n" in str(exc) or kdir.exists():
                outcome.fail(f"a kernel record {what}: {exc} (still in the cache: "
                             f"{kdir.exists()})")
            else:
                outcome.note("refused in one line, removed")
        except Exception as exc:   # noqa: BLE001 - what the attack looks for
            outcome.fail(f"a kernel record {what}: {type(exc).__name__}: {exc}")


def _trojan_rootfs(env: Env, outcome: Outcome) -> None:
    """The sysbench of a cached rootfs swapped for a script: the next build() makes it
    again, so what runs is the host's sysbench."""
    import shutil

    from vmtax.guest import rootfs

    if shutil.which("sysbench") is None:
        outcome.note("no sysbench: no trojan")
        return
    cache = env.work / "rootfs-cache"
    tree = rootfs.build(["sysbench"], cache)
    program = tree / str(rootfs.which("sysbench")).lstrip("/")
    program.unlink()
    program.write_text("#!/bin/sh\necho 'events per second: 999999999'\n")
    program.chmod(0o755)
    outcome.cases += 1
    again = rootfs.build(["sysbench"], cache)
    inside = again / str(rootfs.which("sysbench")).lstrip("/")
    if inside.read_bytes() != rootfs.which("sysbench").read_bytes():
        outcome.fail("a trojan sysbench in a cached rootfs was used")
    else:
        outcome.note("the rootfs built again")


def verified_records(env: Env, outcome: Outcome, quick: bool) -> None:
    _kernel_records(env, outcome)
    _trojan_rootfs(env, outcome)


ATTACKS = [
    Attack("a cache others planted or garbled (#45.4, #45.5)",
           "the cache directory, its plugin index, doctor's versions, a checked database's "
           "stamp",
           "an untrusted cache or a FIFO/device there is refused in one line at once; a "
           "garbled index is made again; no module it names runs", planted_caches),
    Attack("cached kernels and rootfs verified (#45.4, #45.5)",
           "a kernel's meta.json, a cached rootfs's programs",
           "a garbled record or a file that is not what it claims is refused in one line "
           "and removed, or built again; nothing planted runs", verified_records),
]
