"""`vmtax lab`, the host's side: boot the lab (vmtax.guest.lab), run one vmtax command in
it with its output on this terminal, and bring the runs it stored into the host's store.

The lab's QEMU and its share (the job in; exit status, timings and the results database
out) are journaled before they exist, so Ctrl-C, kill -9 of vmtax (its guardian) or a
crash leave neither behind. Results come back when the command ends, or is stopped: the
lab's database lives in the share (one writer, the lab's vmtax) and its runs are copied
into the host's store as ordinary runs (Store.import_runs), with their host facts saying
they were made in the lab.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.guest import lab
from vmtax.guest.agent_session import make_scratch_disk
from vmtax.guest.qemu import find_qemu, parse_size
from vmtax.host.journal import Journal
from vmtax.results.store import DB_NAME, Store

DEFAULT_VCPUS = 2
DEFAULT_MEMORY = "4G"
# The lab's disk: sparse, so it takes on the host only what the lab writes.
DEFAULT_DISK = "16G"
# Lines of the lab's kernel console shown when it ends without the command's status.
CONSOLE_TAIL = 15
# A lab whose vmtax has not started by then has hung while booting (seen in a CI run here
# at low load: QEMU busy for 15 min, not a console line): booted again, once. A lab's boot
# took 15-55 s of the host's time at load 16, and its Python 8-13 s more.
BOOT_TIMEOUT = 300.0
BOOT_TRIES = 2


@dataclass
class LabOutcome:
    exit_code: int
    run_ids: list[str] = field(default_factory=list)
    interrupted: bool = False    # Ctrl-C or SIGTERM: the lab was stopped
    # Seconds: "prepare" (kernel, checks), "boot" (QEMU start to the command's start in
    # the lab), "command" (the command in the lab), "wall" (all of `vmtax lab`).
    seconds: dict[str, float] = field(default_factory=dict)


def check(vcpus: int, memory: str, disk: str, qemu: str) -> int:
    """The lab's size and QEMU, checked before anything is built or booted: bytes of RAM."""
    size = parse_size(memory)
    if parse_size(disk) < 4 << 30:
        raise VmtaxError(f"lab: --disk {disk}: at least 4G (the lab's writes, its guests' "
                         "scratch disks)")
    if size < 1 << 30:
        raise VmtaxError(f"lab: --memory {memory}: at least 1G (the lab holds vmtax's "
                         "writes and its own guests)")
    if vcpus > (os.cpu_count() or 1):
        raise VmtaxError(f"lab: --vcpus {vcpus}: this host has {os.cpu_count()} CPUs")
    problem = lab.memory_problem(size) or lab.svm_problem(qemu)
    if problem:
        raise VmtaxError(f"lab: {problem}")
    return size


def _tail(path: Path, offset: int, echo: Callable[[bytes], None]) -> int:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return offset
    if data:
        echo(data)
    return offset + len(data)


def _console_tail(share: Path) -> str:
    try:
        lines = (share / "console.log").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-CONSOLE_TAIL:])


def _keep_console(share: Path, results: Path) -> str:
    """A lab's console before it is booted again (the next boot overwrites it), kept beside
    the results: its last line and where the whole of it is, said to the user."""
    kept = results / f"lab-console-{time.strftime('%Y%m%d-%H%M%S')}.log"
    results.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        shutil.copyfile(share / "console.log", kept)
    last = _console_tail(share).splitlines()[-1:] or ["(its console is empty)"]
    return f"its console's last line: {last[0]}; all of it: {kept}"


def _fresh_upper(share: Path, disk: str) -> None:
    """An empty disk for the lab's overlay, before it is booted (again)."""
    with contextlib.suppress(FileNotFoundError):
        (share / lab.UPPER).unlink()
    make_scratch_disk(share / lab.UPPER, disk, lab.UPPER_BYTES_PER_INODE)


def _watch(qemu_proc: subprocess.Popen, share: Path, echo: Callable[[bytes], None]) -> bool:
    """Echo the lab's output until its QEMU exits: True; False when its vmtax has not
    started within BOOT_TIMEOUT (QEMU still running)."""
    deadline = time.monotonic() + BOOT_TIMEOUT
    offset = 0
    while qemu_proc.poll() is None:
        offset = _tail(share / "out.log", offset, echo)
        if time.monotonic() > deadline and not (share / lab.STARTED).exists():
            return False
        time.sleep(0.2)
    _tail(share / "out.log", offset, echo)
    return True


def _read_outcome(share: Path, qemu_status: int | None, outcome: LabOutcome) -> None:
    """The command's exit status and timings, as the lab left them in its share."""
    try:
        timings = json.loads((share / lab.TIMINGS).read_text())
        outcome.seconds.update(boot=timings["boot"], command=timings["command"])
    except (OSError, ValueError, KeyError):
        pass
    try:
        outcome.exit_code = int((share / lab.RC).read_text())
    except (OSError, ValueError):
        qemu_said = (share / "qemu.log").read_text(errors="replace").strip().splitlines()
        raise VmtaxError(
            f"lab: ended without the command's exit status (QEMU exit status {qemu_status}"
            f"{'; ' + qemu_said[-1] if qemu_said else ''}); its console's last lines:\n"
            + _console_tail(share)) from None


def _boot(qemu_argv: list[str], share: Path, disk: str, results: Path, journal: Journal,
          tokens: list[int], echo: Callable[[bytes], None],
          say: Callable[[str], None]) -> subprocess.Popen | None:
    """Boot the lab and echo its output until its QEMU exits; a lab hung while booting is
    stopped and booted again, BOOT_TRIES times in all. None: interrupted (Ctrl-C)."""
    for attempt in range(1, BOOT_TRIES + 1):
        # QEMU empties its logs only once it opens them: a watch begun before would echo the
        # last lab's output again, then skip as many bytes of this one's (seen in CI: the
        # resumed run's report lost its title).
        for log in ("out.log", "console.log"):
            (share / log).unlink(missing_ok=True)
        qemu_proc = lab.spawn(qemu_argv, share / "qemu.log")
        tokens.append(journal.process(qemu_proc.pid))
        try:
            if _watch(qemu_proc, share, echo):
                return qemu_proc
        except KeyboardInterrupt:
            return None
        journal.undo(tokens.pop())   # hung at boot: stop it, and boot a new one
        if attempt == BOOT_TRIES:
            raise VmtaxError(f"lab: did not boot within {BOOT_TIMEOUT:g} s, "
                             f"{BOOT_TRIES} times; its console's last lines:\n"
                             + _console_tail(share))
        say(f"lab: no sign of its vmtax within {BOOT_TIMEOUT:g} s (hung while booting; "
            f"{_keep_console(share, results)}); booting it again")
        _fresh_upper(share, disk)
    raise AssertionError("unreachable")


def _resumable(argv: list[str], share: Path) -> str | None:
    """The run a `vmtax run` in the lab left unfinished in its share, if any."""
    if argv[:1] != ["run"] or not (share / lab.RESULTS / DB_NAME).is_file():
        return None
    store = Store(share / lab.RESULTS, readonly=True)
    try:
        unfinished = [r["id"] for r in store.list_runs() if r["status"] != "done"]
    finally:
        store.close()
    return unfinished[-1] if unfinished else None


def run(argv: list[str], *, vcpus: int, memory: str, disk: str, qemu: str, results: Path,
        journal: Journal, echo: Callable[[bytes], None], say: Callable[[str], None],
        env: dict[str, str] | None = None, tty: bool = False) -> LabOutcome:
    """Run `vmtax ARGV` in a new lab; its output goes to echo as it comes (as to a
    terminal when tty). Interrupted (Ctrl-C, SIGTERM), the lab is stopped and what it
    stored is kept all the same."""
    wall = time.monotonic()
    size = check(vcpus, memory, disk, qemu)
    kernel = lab.lab_kernel(paths.cache_dir())
    share, share_token = journal.make_dir(Path(tempfile.gettempdir()), "vmtax-lab-")
    tokens = [share_token]
    outcome = LabOutcome(exit_code=1)
    try:
        os.chmod(share, 0o700)

        def write(args: list[str]) -> None:
            lab.write_job(share, [sys.executable, "-m", "vmtax", *args], os.getcwd(),
                          kernel.modules_tree, kernel.version,
                          {lab.LAB_ENV: lab.LAB_LABEL, "VMTAX_RESULTS": lab.LAB_RESULTS,
                           # This vmtax's cache, guest kernels and images built (read-only
                           # there)
                           "VMTAX_CACHE": str(paths.cache_dir()),
                           "HOME": os.path.expanduser("~"), **(env or {})}, tty)

        write(argv)
        _fresh_upper(share, disk)
        qemu_argv = lab.lab_argv(find_qemu(qemu), kernel, vcpus, size, share, paths.cache_dir())
        outcome.seconds["prepare"] = round(time.monotonic() - wall, 2)
        say(f"lab: booting {vcpus} vCPUs, {size >> 20} MiB, {lab.LAB_LABEL} "
            f"(kernel {kernel.version})")
        started = time.monotonic()
        resumed = False
        while True:
            qemu_proc = _boot(qemu_argv, share, disk, results, journal, tokens, echo, say)
            if qemu_proc is None:
                outcome.interrupted = True
                break
            resume = None if resumed or (share / lab.RC).exists() else _resumable(argv, share)
            if resume is None:
                break
            # The lab's kernel died mid-run (CI saw a stack overflow in an interrupt under
            # TCG's emulated SVM): what it stored is in the share; a new lab resumes it, once.
            resumed = True
            say(f"lab: ended mid-run without the command's exit status "
                f"({_keep_console(share, results)}); booting it again to resume run {resume}")
            journal.undo(tokens.pop())
            write(["run", "--resume", resume])
            _fresh_upper(share, disk)
        outcome.seconds["lab"] = round(time.monotonic() - started, 2)
        if qemu_proc is not None:
            _read_outcome(share, qemu_proc.returncode, outcome)
    finally:
        for token in reversed(tokens[1:]):   # the lab's QEMU, so nothing writes the share
            journal.undo(token)
        try:
            # What the lab stored, also when it was interrupted: each finished repetition.
            if (share / lab.RESULTS / DB_NAME).is_file():
                store = Store(results)
                try:
                    outcome.run_ids = store.import_runs(share / lab.RESULTS)
                finally:
                    store.close()
        finally:
            journal.undo(share_token)
    outcome.seconds["wall"] = round(time.monotonic() - wall, 2)
    return outcome
