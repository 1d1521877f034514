"""`vmtax lab`, the host's side: boot the lab (vmtax.guest.lab), run vmtax commands in it
in turn (one, or a session's several) with their output on this terminal, and bring the
runs they stored into the host's store.

The lab's QEMU and its share (the job in; exit statuses, timings and the results database
out) are journaled before they exist, so Ctrl-C, kill -9 of vmtax (its guardian) or a
crash leave neither behind; and so is bringing the results home (`keep_results`), which
the guardian does too before the share goes: the lab's database lives in the share (one
writer, the lab's vmtax), and its runs are copied into the host's store as ordinary runs
(Store.import_runs), with their host facts saying they were made in the lab. A run cut
short is resumable from the host's store (`vmtax lab run --resume ID`): its repetitions
are copied into the new lab's store first.

A lab that stops making progress is noticed (vmtax.studies.lab_watch): no heartbeat and no
output for `hang_timeout` seconds (its kernel hung, or its QEMU was stopped), or its
kernel died. Its console is kept beside the results, a new lab is booted, and the command
cut short goes on there (a run is resumed, another command is run again), at most
`restarts` times; then the lab fails in one line naming the fault and the kept console.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from vmtax.core import hints, paths
from vmtax.core.errors import VmtaxError
from vmtax.guest import lab
from vmtax.guest.agent_session import make_scratch_disk
from vmtax.guest.qemu import find_qemu, parse_size
from vmtax.host.journal import Journal, undone_by
from vmtax.results.store import DB_NAME, Store
from vmtax.studies.lab_watch import (BOOT_TIMEOUT, HANG_TIMEOUT, Ended, console_tail,
                                     fault_of, watch)

DEFAULT_VCPUS = 2
DEFAULT_MEMORY = "4G"
# The lab's disk: sparse, so it takes on the host only what the lab writes.
DEFAULT_DISK = "16G"
# A lab hung while booting (seen in a CI run here at low load: QEMU busy for 15 min, not a
# console line) is booted again, BOOT_TRIES times in all.
BOOT_TRIES = 2
# New labs booted for commands cut short by a lab that hung or died, in one `vmtax lab`.
RESTARTS = 2
# Where a lab's commands' stdout and stderr go, as they come.
Echo = tuple[Callable[[bytes], None], Callable[[bytes], None]]
# A run's flags that shape its output: kept when the run is resumed in a new lab.
RUN_OUTPUT_FLAGS = ("--json", "--all")


@dataclass(frozen=True)
class LabConfig:
    """What `vmtax lab` is asked for: the lab's machine and how long it may stall."""
    vcpus: int = DEFAULT_VCPUS
    memory: str = DEFAULT_MEMORY
    disk: str = DEFAULT_DISK
    qemu: str = "qemu-system-x86_64"
    cpu: str = lab.CPU
    kernel: str | None = None            # a Debian kernel package; None: the guests' kernel
    tb_size: int | None = None
    tcg_thread: str = "multi"
    hang_timeout: float = HANG_TIMEOUT
    restarts: int = RESTARTS


@dataclass
class CommandOutcome:
    argv: list[str]                      # the vmtax command, without "vmtax"
    exit_code: int | None = None         # None: it never ran to its end
    stdout: bytes = b""
    stderr: bytes = b""


@dataclass
class LabOutcome:
    exit_code: int
    commands: list[CommandOutcome] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    interrupted: bool = False    # Ctrl-C or SIGTERM: the lab was stopped
    # Seconds: "prepare" (kernel, checks), "boot" (QEMU start to the commands' start in
    # the last lab), "command" (its commands), "lab" (all labs), "wall" (all of it).
    seconds: dict[str, float] = field(default_factory=dict)
    # The nested faults the run outlived, each as the user was told ("its kernel
    # panicked: …"), and the loads the host had (1-minute load average, sampled).
    faults: list[str] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)


def check(config: LabConfig) -> lab.Machine:
    """The lab's size, CPU and QEMU, checked before anything is built or booted."""
    size = parse_size(config.memory)
    if parse_size(config.disk) < 4 << 30:
        raise VmtaxError(f"lab: --disk {config.disk}: at least 4G (the lab's writes, its "
                         "guests' scratch disks)")
    if size < 1 << 30:
        raise VmtaxError(f"lab: --memory {config.memory}: at least 1G (the lab holds vmtax's "
                         "writes and its own guests)")
    if config.vcpus > (os.cpu_count() or 1):
        raise VmtaxError(f"lab: --vcpus {config.vcpus}: this host has {os.cpu_count()} CPUs")
    problem = lab.memory_problem(size) or lab.svm_problem(config.qemu, config.cpu)
    if problem:
        raise VmtaxError(f"lab: {problem}")
    return lab.Machine(config.vcpus, size, config.cpu, config.tb_size, config.tcg_thread)


def _keep_console(share: Path, results: Path) -> Path:
    """A lab's console before a new lab is booted (which overwrites it), kept beside the
    results."""
    kept = results / f"lab-console-{time.strftime('%Y%m%d-%H%M%S')}.log"
    results.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        shutil.copyfile(share / lab.CONSOLE_LOG, kept)
    return kept


def _fresh_lab(share: Path, disk: str) -> None:
    """What a lab leaves in the share but its results, gone before the next one boots; an
    empty disk for its overlay. QEMU empties its logs only once it opens them: a watch
    begun before would echo the last lab's output again, then skip as many bytes of this
    one's (seen in CI: the resumed run's report lost its title)."""
    for name in (lab.UPPER, lab.CONSOLE_LOG, lab.OUT_LOG, lab.ERR_LOG, lab.STARTED,
                 lab.HEARTBEAT, lab.COMMANDS, lab.RC, lab.TIMINGS):
        (share / name).unlink(missing_ok=True)
    make_scratch_disk(share / lab.UPPER, disk, lab.UPPER_BYTES_PER_INODE)


def import_results(results: Path, share: Path) -> list[str]:
    """The runs the lab stored, copied into the host's store (those it has, once)."""
    if not (share / lab.RESULTS / DB_NAME).is_file():
        return []
    store = Store(results)
    try:
        return store.import_runs(share / lab.RESULTS)
    finally:
        store.close()


def keep_results(journal: Journal, entry: dict[str, Any]) -> None:
    """The journal's undo of a lab's share (kill -9 of `vmtax lab`, by its guardian): what
    the lab stored reaches the host's store before the share is removed."""
    import_results(Path(entry["results"]), Path(entry["share"]))


def _seeded(argv: list[str], share: Path, results: Path) -> list[str]:
    """A `run --resume RUN` of a run in the host's store: its repetitions copied into the
    lab's store first, and RUN named by its id there."""
    if argv[:1] != ["run"] or "--resume" not in argv[:-1]:
        return argv
    at = argv.index("--resume") + 1
    host_store = Store(results, readonly=True)
    try:
        run_id = host_store.resolve(argv[at])
    finally:
        host_store.close()
    lab_store = Store(share / lab.RESULTS)
    try:
        lab_store.import_runs(results, only=run_id)
    finally:
        lab_store.close()
    return [*argv[:at], run_id, *argv[at + 1:]]


def _resumed(argv: list[str], share: Path) -> list[str]:
    """The command to go on with, in a new lab, from one a lab cut short: a `vmtax run`
    that stored a run resumes it, keeping its output flags; any other runs again."""
    if argv[:1] != ["run"] or not (share / lab.RESULTS / DB_NAME).is_file():
        return argv
    store = Store(share / lab.RESULTS, readonly=True)
    try:
        unfinished = [r["id"] for r in store.list_runs() if r["status"] != "done"]
    finally:
        store.close()
    if not unfinished:
        return argv
    return ["run", "--resume", unfinished[-1], *(f for f in RUN_OUTPUT_FLAGS if f in argv)]


def _outputs(share: Path, commands: list[CommandOutcome]) -> int:
    """Each command's output and exit status in this lab (commands: those it was given,
    in order), added to what earlier labs gave; how many it ran to their end."""
    try:
        records = json.loads((share / lab.COMMANDS).read_text())
    except (OSError, ValueError):
        return 0
    logs = {}
    for name in (lab.OUT_LOG, lab.ERR_LOG):
        try:
            logs[name] = (share / name).read_bytes()
        except OSError:
            logs[name] = b""
    for record, command in zip(records, commands):
        (out_start, out_end), (err_start, err_end) = record["out"], record["err"]
        command.stdout += logs[lab.OUT_LOG][out_start:out_end]
        command.stderr += logs[lab.ERR_LOG][err_start:err_end]
        command.exit_code = record["rc"]
    return sum(1 for record in records if record["rc"] is not None)


def _read_timings(share: Path, outcome: LabOutcome) -> None:
    with contextlib.suppress(OSError, ValueError, KeyError):
        timings = json.loads((share / lab.TIMINGS).read_text())
        outcome.seconds.update(boot=timings["boot"], command=timings["command"])


def _no_status(share: Path, qemu_status: int | None) -> str:
    """A lab that ended without its commands' exit status, and without a fault named."""
    try:
        qemu_said = (share / "qemu.log").read_text(errors="replace").strip().splitlines()
    except OSError:
        qemu_said = []
    return (f"ended without the command's exit status (QEMU exit status {qemu_status}"
            f"{'; ' + qemu_said[-1] if qemu_said else ''})")


class _Lab:
    """One `vmtax lab`: its share, journal entries, QEMU command line and output."""

    def __init__(self, config: LabConfig, share: Path, results: Path, journal: Journal,
                 qemu_argv: list[str], echo: Echo,
                 say: Callable[[str], None], outcome: LabOutcome) -> None:
        self.config, self.share, self.results, self.journal = config, share, results, journal
        self.qemu_argv, self.echo, self.say, self.outcome = qemu_argv, echo, say, outcome
        self.tokens: list[int] = []

    def boot(self, commands: list[list[str]]) -> Ended:
        """A lab for these commands, watched until its QEMU is gone: how it ended. A lab
        hung while booting is stopped and booted again, BOOT_TRIES times in all."""
        for attempt in range(1, BOOT_TRIES + 1):
            _fresh_lab(self.share, self.config.disk)
            qemu_proc = lab.spawn(self.qemu_argv, self.share / "qemu.log")
            self.tokens.append(self.journal.process(qemu_proc.pid))
            try:
                ended = watch(qemu_proc, self.share, *self.echo, self._started(commands),
                              self.config.hang_timeout, self.outcome.loads)
            finally:
                self.stop()
                qemu_proc.wait()
            if ended.how != "boot hang":
                return ended
            if attempt == BOOT_TRIES:
                raise VmtaxError(f"lab: did not boot within {BOOT_TIMEOUT:g} s, "
                                 f"{BOOT_TRIES} times; its console: "
                                 f"{_keep_console(self.share, self.results)}")
            self.fault(f"no sign of its vmtax within {BOOT_TIMEOUT:g} s (hung while "
                       "booting)", "booting it again")
        raise AssertionError("unreachable")

    def _started(self, commands: list[list[str]]) -> Callable[[int], None]:
        """Told each command's index as it starts: a session says which one."""
        def started(index: int) -> None:
            if len(commands) > 1 or self.outcome.faults:
                self.say(f"lab: vmtax {shlex.join(commands[index])}")
        return started

    def fault(self, what: str, then: str) -> None:
        """A nested fault outlived: said with the kept console, and counted."""
        kept = _keep_console(self.share, self.results)
        last = " ".join(console_tail(self.share, 1).split()) or "(its console is empty)"
        self.outcome.faults.append(what)
        self.say(f"lab: {what} (its console's last line: {last}; all of it: {kept}); {then}")

    def stop(self) -> None:
        while self.tokens:   # the lab's QEMU, so nothing writes the share
            self.journal.undo(self.tokens.pop())


def run(commands: list[list[str]], config: LabConfig, *, results: Path, journal: Journal,
        echo: Echo, say: Callable[[str], None], env: dict[str, str] | None = None,
        tty: bool = False, program: Sequence[str] = (sys.executable, "-m", "vmtax")
        ) -> LabOutcome:
    """Run each `vmtax ARGV` of commands in a new lab, in turn until one fails; their
    stdout and stderr go to echo (out, err) as they come (as to a terminal when tty).
    Interrupted (Ctrl-C, SIGTERM), the lab is stopped and what it stored is kept all the
    same. program: what each command's ARGV is given to, vmtax itself but for a live test
    that must look inside the lab (a script of its own)."""
    wall = time.monotonic()
    machine = check(config)
    kernel = lab.lab_kernel(paths.cache_dir(), config.kernel)
    share, share_token = journal.make_dir(Path(tempfile.gettempdir()), "vmtax-lab-")
    keep_token = journal.add(type="lab-results", undo=undone_by(keep_results),
                             share=str(share), results=str(results))
    outcome = LabOutcome(exit_code=1, commands=[CommandOutcome(list(c)) for c in commands])
    the_lab = _Lab(config, share, results, journal,
                   lab.lab_argv(find_qemu(config.qemu), kernel, machine, share,
                                paths.cache_dir()), echo, say, outcome)
    try:
        os.chmod(share, 0o700)
        todo = [_seeded(list(c), share, results) for c in commands]
        outcome.seconds["prepare"] = round(time.monotonic() - wall, 2)
        say(f"lab: booting {machine.vcpus} vCPUs, {machine.memory >> 20} MiB, "
            f"{lab.LAB_LABEL} (kernel {kernel.version})")
        started, first = time.monotonic(), 0
        while todo:
            lab.write_job(share, [[*program, *c] for c in todo],
                          os.getcwd(), kernel.modules_tree, kernel.version,
                          _lab_env(results, env), tty)
            ended = the_lab.boot(todo)
            finished = _outputs(share, outcome.commands[first:])
            if ended.how == "interrupted":
                outcome.interrupted = True
                break
            if (share / lab.RC).exists():
                _read_timings(share, outcome)
                outcome.exit_code = int((share / lab.RC).read_text() or 1)
                break
            what = fault_of(ended, share) or _no_status(share, ended.qemu_status)
            restarted = len(outcome.faults)
            if restarted >= config.restarts:
                raise VmtaxError(
                    f"lab: {what}, {restarted + 1} times; the last lab's console: "
                    f"{_keep_console(share, results)}")
            first += finished
            todo = [_resumed(todo[finished], share), *todo[finished + 1:]]
            the_lab.fault(what, f"booting a new lab for vmtax {shlex.join(todo[0])}")
        outcome.seconds["lab"] = round(time.monotonic() - started, 2)
    finally:
        the_lab.stop()
        try:
            outcome.run_ids = import_results(results, share)
            journal.forget(keep_token)
        finally:
            journal.undo(share_token)
    outcome.seconds["wall"] = round(time.monotonic() - wall, 2)
    return outcome


def _lab_env(results: Path, env: dict[str, str] | None) -> dict[str, str]:
    """The environment of the lab's commands."""
    return {lab.LAB_ENV: lab.LAB_LABEL, "VMTAX_RESULTS": lab.LAB_RESULTS,
            # The host's store, which the runs come into: what hints printed there name.
            hints.LAB_RESULTS_ENV: str(results),
            "VMTAX_WORK": lab.WORK,
            # This vmtax's cache: guest kernels and images built, shared.
            "VMTAX_CACHE": str(paths.cache_dir()),
            "HOME": os.path.expanduser("~"), **(env or {})}
