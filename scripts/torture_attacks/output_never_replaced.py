"""An output path is written, never replaced (issue #45, defect 1): every option that writes
a FILE (export's five formats, compare --junit, report --html, --png and --svg, trend
--html) given a character device, a FIFO being read, a symbolic link to a file of the
user's or to the device, or a directory. Each is written through, or refused in one line;
afterwards each path is what it was (the same kind of file, the same device, the link
pointing where it did) and the file a link points to is still there."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any

from torture_kit.env import Env, Outcome, in_process
from torture_kit.registry import Attack
from torture_kit.stores import series_store


def _kinds(where: Path) -> dict[str, Path]:
    """What the user's path is, by kind, made in where (a device only as root)."""
    where.mkdir(parents=True)
    made = {}
    if os.geteuid() == 0:
        os.mknod(where / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        made["a character device"] = where / "null"
        (where / "to-null").symlink_to(where / "null")
        made["a link to the device"] = where / "to-null"
    os.mkfifo(where / "fifo")
    made["a FIFO being read"] = where / "fifo"
    (where / "mine.txt").write_text("the user's own\n")
    (where / "to-mine").symlink_to(where / "mine.txt")
    made["a link to a file of the user's"] = where / "to-mine"
    (where / "dir").mkdir()
    made["a directory"] = where / "dir"
    return made


def _state(path: Path) -> tuple[Any, ...]:
    st = os.lstat(path)
    return (stat.S_IFMT(st.st_mode), st.st_rdev, st.st_ino,
            os.readlink(path) if stat.S_ISLNK(st.st_mode) else None)


def _drain(fifo: Path) -> threading.Thread:
    """A reader of fifo from the moment a writer opens it until it closes it."""
    os.link(fifo, fifo.with_name("fifo-alias"))    # to end the reader if fifo is replaced

    def read() -> None:
        with open(os.open(fifo, os.O_RDONLY), "rb") as f:
            while f.read(1 << 16):
                pass
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader


def _end(reader: threading.Thread, fifo: Path) -> bool:
    """Whether the FIFO's reader had to be ended: nothing opened it for writing."""
    reader.join(5)
    if not reader.is_alive():
        return False
    os.close(os.open(fifo.with_name("fifo-alias"), os.O_WRONLY | os.O_NONBLOCK))
    reader.join(5)
    return True


def _commands(results: str, out: str, quick: bool) -> list[list[str]]:
    r = ["--results", results]
    commands = [["export", "last", "--csv", out, *r], ["report", "last", "--html", out, *r],
                ["compare", "last:native", "last:other", "--junit", out, *r]]
    if not quick:
        commands += [["export", "last", f"--{fmt}", out, *r]
                     for fmt in ("json", "jsonl", "benchstat", "markdown")]
        commands += [["trend", "t", "--html", out, *r]]
    return commands


def _figures(env: Env, outcome: Outcome, results: str, kinds: dict[str, Path]) -> None:
    """--png and --svg DIR: each figure file already in DIR as a device or a link."""
    from vmtax.core.errors import VmtaxError

    scratch = env.work / "figures-scratch"
    in_process("report", "last", "--html", str(env.work / "scratch.html"), "--png",
               str(scratch), "--results", results)
    names = sorted(p.name for p in scratch.iterdir()) if scratch.is_dir() else []
    if not names:
        outcome.fail("report --png wrote no figure to attack")
        return
    for what, user in kinds.items():
        if what == "a directory" or what == "a FIFO being read":
            continue
        figures = env.work / f"figures-{len(outcome.notes)}-{user.name}"
        figures.mkdir()
        for name in names:
            (figures / name).symlink_to(user)
        before = [_state(figures / n) for n in names] + [_state(user)]
        outcome.cases += 1
        code, _, exc = in_process("report", "last", "--html", str(env.work / "f.html"),
                                  "--png", str(figures), "--results", results)
        if code != 0 and not isinstance(exc, VmtaxError):
            outcome.fail(f"report --png with figures as {what}: {type(exc).__name__}: {exc}")
        if [_state(figures / n) for n in names] + [_state(user)] != before:
            outcome.fail(f"report --png DIR: a figure that was {what} was replaced")


def never_replaced(env: Env, outcome: Outcome, quick: bool) -> None:
    from vmtax.core.errors import VmtaxError

    results = env.work / "outputs-r"
    series_store(results, "t", runs=2)
    for n, command in enumerate(_commands(str(results), "{out}", quick)):
        kinds = _kinds(env.work / f"outputs-{n}")
        for what, user in kinds.items():
            outcome.cases += 1
            before = _state(user)
            reader = _drain(user) if what == "a FIFO being read" else None
            args = [user.as_posix() if a == "{out}" else a for a in command]
            code, _, exc = in_process(*args)
            said = " ".join(a for a in command[:3] if a != "{out}")
            if reader is not None and _end(reader, user) and code == 0:
                outcome.fail(f"{said} to {what}: exit 0, and the FIFO never opened")
            if code != 0 and not isinstance(exc, VmtaxError):
                outcome.fail(f"{said} to {what}: {type(exc).__name__}: {exc}")
                continue
            if _state(user) != before:
                outcome.fail(f"{said} FILE, FILE {what}: replaced (now "
                             f"{stat.filemode(os.lstat(user).st_mode)})")
            elif not (kinds["a link to a file of the user's"].parent / "mine.txt").exists():
                outcome.fail(f"{said} to {what}: the user's file is gone")
            else:
                outcome.note("written through" if code == 0 else "refused in one line")
    _figures(env, outcome, str(results), _kinds(env.work / "outputs-figures"))


ATTACK = Attack(
    "an output path is written, never replaced (#45.1)",
    "every FILE option: export --csv/--json/--jsonl/--benchstat/--markdown, compare "
    "--junit, report --html/--png, trend --html",
    "a device, FIFO, link or directory given as FILE is written through or refused in one "
    "line; it stays what it was, and nothing of the user's is deleted", never_replaced)
