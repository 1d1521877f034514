"""A sandbox to run vmtax in, and what an attack records of it.

Env is one per torture: a private work directory and runtime directory (so only what the
torture's own runs made is looked at: other vmtax may run on the host meanwhile), and the
vmtax processes started, which are stopped after each attack. Outcome is one per attack:
its cases, the notes counted of what was seen, and its problems (any one fails the
torture). The helpers below check a command's output as every attack does.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
VMTAX = [sys.executable, "-m", "vmtax"]
TRACEBACK = "Traceback (most recent call last)"
# Within this long after kill -9 the guardian must have undone the run (issue #16).
CLEAN_WITHIN = 5.0
OTHER_UID = 4344   # "another local user": any uid but ours


@dataclass
class Outcome:
    attack: str
    cases: int = 0
    problems: list[str] = field(default_factory=list)
    notes: dict[str, int] = field(default_factory=dict)

    def note(self, what: str) -> None:
        self.notes[what] = self.notes.get(what, 0) + 1

    def fail(self, what: str) -> None:
        self.problems.append(what)



class Env:
    def __init__(self, work: Path, seed: int):
        self.work = work
        self.runtime = work / "runtime"
        self.runtime.mkdir()
        # Each attack draws from its own (the driver's attack_rng), so adding one changes
        # no other's draws.
        self.rng = random.Random(seed)
        self.env = {**os.environ, "VMTAX_RUNTIME": str(self.runtime)}
        self.started: list[subprocess.Popen] = []

    def start(self, *args: str) -> subprocess.Popen:
        # SIGINT as at a terminal: a background job of a shell starts with it ignored.
        proc = subprocess.Popen([*VMTAX, *args], env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        """Ctrl-C, then kill, what an attack that went wrong left running."""
        for proc in self.started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()
        self.started.clear()

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([*VMTAX, *args], env=self.env, text=True, capture_output=True,
                              timeout=timeout)


def in_python_startup(stderr: str) -> bool:
    """A Ctrl-C that landed while the interpreter itself started (site, runpy), before any
    of vmtax's code ran: nothing vmtax can catch, and nothing it had done yet."""
    return (TRACEBACK in stderr and stderr.rstrip().endswith("KeyboardInterrupt")
            and "/vmtax/" not in stderr)


def check_output(outcome: Outcome, what: str, stderr: str) -> None:
    if in_python_startup(stderr):
        outcome.note("interrupted in Python's own start-up")
    elif TRACEBACK in stderr:
        outcome.fail(f"{what}: traceback: {stderr.strip().splitlines()[-1][:200]}")



def vmtax_with(env: Env, runtime: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*VMTAX, *args], env={**env.env, "VMTAX_RUNTIME": str(runtime)},
                          text=True, capture_output=True, timeout=300)


def one_line_refusal(outcome: Outcome, what: str, done: subprocess.CompletedProcess,
                     names: str) -> None:
    check_output(outcome, what, done.stderr)
    lines = done.stderr.strip().splitlines()
    if done.returncode != 2 or len(lines) != 1 or names not in lines[0]:
        outcome.fail(f"{what}: exit {done.returncode}, expected one line naming {names}: "
                     f"{done.stderr.strip()[-200:]}")



def in_process(*args: str) -> tuple[int, str, BaseException | None]:
    """A vmtax command run inside this process (no Python start-up): its exit code, its
    output and the exception it ended with, as `vmtax` would have printed it in one line."""
    from click.testing import CliRunner

    from vmtax.cli.main import cli

    done = CliRunner().invoke(cli, list(args), env=None, catch_exceptions=True)
    return done.exit_code, done.output, done.exception
