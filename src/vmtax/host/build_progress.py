"""Progress of what vmtax builds on first use (the minimal guest kernel, the compile
workload's kernel tree, the Go tools): a bar counting the build's own steps, and the time
left at the pace of the steps so far.

A step is a line the build tool prints per unit of work: kbuild's `  CC      init/main.o`,
a recipe line of make. (Go's builds, a minute or two, show what runs and for how long.)
The bar's total is the count of
the same build's last run on this host (the cache's build-steps.json), else a default
measured on a 2-core Debian 12 host. A build's whole output goes to its log in the cache's
logs/; a failed step is one line naming the log, never the output itself.

Only one live display can draw on a terminal: inside `vmtax run`, whose progress bar is
live while targets prepare, a build's bar is a task of that display (`shown_in`).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from vmtax.core import paths
from vmtax.core.errors import VmtaxError

STEPS_FILE = "build-steps.json"
# kbuild's quiet output: one line per step ("  CC      init/main.o", "  HOSTCC  ...").
KBUILD_STEP = re.compile(r"^  [A-Z][A-Z0-9_]{1,9} +\S")

_shared: Progress | None = None


@contextlib.contextmanager
def shown_in(progress: Progress) -> Iterator[None]:
    """Builds started inside show their bar as a task of this live display; it must have
    the columns `{task.description}` and `{task.fields[eta]}`, as vmtax run's has."""
    global _shared
    before, _shared = _shared, progress
    try:
        yield
    finally:
        _shared = before


def log_path(slug: str) -> Path:
    logs = paths.cache_dir() / "logs"
    logs.mkdir(exist_ok=True)
    return logs / f"{slug}.log"


def _known_steps() -> dict[str, int]:
    try:
        data = json.loads((paths.cache_dir() / STEPS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _remember_steps(key: str, count: int) -> None:
    known = {**_known_steps(), key: count}
    path = paths.cache_dir() / STEPS_FILE
    tmp = path.with_suffix(f".{time.monotonic_ns()}.tmp")
    tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
    tmp.replace(path)


def time_left(done: int, total: int | None, elapsed: float) -> str:
    """"~3 min left" at the pace so far; empty until a step has been seen or with no total."""
    if not done or not total:
        return ""
    seconds = max(elapsed * (total - done) / done, 0.0)
    if seconds >= 90:
        return f"~{seconds / 60:.0f} min left"
    return f"~{seconds:.0f} s left"


class Build:
    """One build shown as one bar; `run` runs its commands one after another."""

    def __init__(self, name: str, slug: str, note: str = "", logged: bool = True) -> None:
        self.name = name                 # "minimal guest kernel from linux-source-6.12"
        self.note = note                 # said once, when it starts
        self.log = log_path(slug)
        self.logged = logged             # False: its steps report failures themselves
        self.started = time.monotonic()
        self._progress: Progress | None = None
        self._own = False
        self._task: TaskID | None = None

    def __enter__(self) -> Build:
        if self.logged:
            self.log.write_text("")   # this build's output only
        progress = _shared
        if progress is None:
            console = Console(stderr=True, highlight=False)
            progress = Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False),
                                BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                TextColumn("{task.fields[eta]}"), console=console,
                                transient=True, disable=not console.is_terminal)
            progress.start()
            self._own = True
        self._progress = progress
        where = f"; log: {self.log}" if self.logged else ""
        progress.console.print(f"vmtax: building the {self.name} (once{self.note}{where})",
                               markup=False, highlight=False, soft_wrap=True)
        self._task = progress.add_task(f"building the {self.name}", total=None, eta="")
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        assert self._progress is not None and self._task is not None
        self._progress.remove_task(self._task)
        if kind is None:
            self._progress.console.print(
                f"vmtax: built the {self.name} in {time.monotonic() - self.started:.0f} s",
                markup=False, highlight=False, soft_wrap=True)
        if self._own:
            self._progress.stop()

    def describe(self, what: str) -> None:
        """A step of the build that `run` does not run (a download, a Go build)."""
        assert self._progress is not None and self._task is not None
        self._progress.update(self._task, description=f"{self.name}: {what}", total=None,
                              completed=0, eta="")

    def run(self, argv: list[str], cwd: Path, what: str, *, timeout: float,
            steps: re.Pattern[str] | None = None, key: str | None = None,
            expected: int | None = None, env: dict[str, str] | None = None) -> None:
        """Run one command of the build, its output appended to the log; with `steps`, each
        line it matches advances the bar, whose total is what the same `key` counted last
        time, else `expected`. VmtaxError, one line with the log's path, if it fails."""
        assert self._progress is not None and self._task is not None
        total = _known_steps().get(key, expected) if key and steps else expected
        self.describe(what)
        self._progress.update(self._task, total=total if steps else None)
        with open(self.log, "a") as log:
            log.write(f"$ {' '.join(argv)}  (in {cwd})\n")
            log.flush()
            try:
                child = subprocess.Popen(argv, cwd=cwd, env=env, text=True, errors="replace",
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            except FileNotFoundError:
                raise VmtaxError(f"{self.name}: {argv[0]} is not installed") from None
            expired = threading.Event()

            def stop() -> None:
                expired.set()
                child.kill()
            timer = threading.Timer(timeout, stop)
            timer.start()
            started, count = time.monotonic(), 0
            try:
                assert child.stdout is not None
                for line in child.stdout:
                    log.write(line)
                    if steps is not None and steps.match(line):
                        count += 1
                        if total is not None and count >= total:
                            total = count + 1    # more steps than last time: keep going
                        self._progress.update(self._task, completed=count, total=total,
                                              eta=time_left(count, total,
                                                            time.monotonic() - started))
                code = child.wait()
            finally:
                timer.cancel()
                if child.poll() is None:
                    child.kill()
                    child.wait()
        if code != 0:
            why = (f"took longer than {timeout:g} s" if expired.is_set()
                   else f"failed (exit code {code})")
            raise VmtaxError(f"{self.name}: {what} {why}; log: {self.log}")
        if steps is not None and key and count:
            _remember_steps(key, count)
