"""The progress of a study on stderr (vmtax.studies.runner.Reporter): a bar with the time
left at a terminal, one line per finished cell elsewhere."""

from __future__ import annotations

import threading
import time

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from vmtax.cli.consoles import err
from vmtax.core.text import printable
from vmtax.core.text import markup as escape  # control characters too
from vmtax.host import build_progress
from vmtax.studies.runner import STORED_BEFORE


# Without a terminal, a step still going after this many seconds is said.
SLOW_STEP = 30.0


def _eta_text(seconds: float | None) -> str:
    if seconds is None:
        return ""
    from vmtax.studies.estimate import duration

    return f"~{duration(max(seconds, 0))} left"


class _StepTime(ProgressColumn):
    """How long the current step has run, so a long one (a 2 GiB prepare under TCG) shows
    it is moving while the bar stands still."""

    def __init__(self, reporter: "ProgressReporter") -> None:
        super().__init__()
        self.reporter = reporter

    def render(self, task: Task) -> Text:
        seconds = time.monotonic() - self.reporter.step_started
        return Text(f"({seconds:.0f} s)" if seconds >= 5 else "", style="dim")


class ProgressReporter:
    """Progress on stderr, so stdout stays clean for tables and --json: a bar with the
    time left at a terminal; elsewhere (a log, CI) one line per finished cell.

    The time left starts as the plan's estimate and moves to the pace measured so far as
    the run advances (weighted by the share done), so a slow host corrects it early and a
    slow VM start-up does not dominate it."""

    def __init__(self, estimate: float | None = None, per_cell: int | None = None) -> None:
        self.step_started = time.monotonic()
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False),
                                 _StepTime(self), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[eta]}"),
                                 console=err,
                                 transient=True, disable=not err.is_terminal)
        self.task: TaskID | None = None
        self.estimate = estimate
        self.per_cell = per_cell          # repetitions of one target × workload configuration
        self.total = self.done = 0
        self.started = time.monotonic()
        self.cell: tuple[str, str] | None = None
        self.stored_before = False
        self.cells: dict[tuple[str, str], int] = {}
        self.begun: set[tuple[str, str]] = set()   # cells said to start (piped)
        self._slow: threading.Timer | None = None   # says a slow step (piped)
        self._entered = False
        # Warnings for when measuring starts: once the targets are up, not before an error
        # that stops the run from starting at all.
        self.before_first: list[str] = []

    def __enter__(self):
        self._entered = True
        self.progress.__enter__()
        # What a plan first needs built (a guest kernel, the compile tree) shows its own
        # bar here: a terminal has room for one live display.
        self.builds = build_progress.shown_in(self.progress)
        self.builds.__enter__()
        return self

    def __exit__(self, *exc):
        self._entered = False
        if self._slow is not None:
            self._slow.cancel()
        self.builds.__exit__(*exc)
        self.progress.__exit__(*exc)

    def eta(self) -> float | None:
        """Seconds left: the estimate's share not done, blended into the measured pace."""
        elapsed = time.monotonic() - self.started
        share = self.done / self.total if self.total else 0.0
        measured = elapsed * (1 - share) / share if share else None
        if self.estimate is None:
            return measured
        planned = self.estimate * (1 - share)
        return planned if measured is None else (1 - share) * planned + share * measured

    def start(self, total: int) -> None:
        self.total = total
        self.started = time.monotonic()
        self.task = self.progress.add_task("starting", total=total, eta=_eta_text(self.eta()))

    def step(self, text: str) -> None:
        self.step_started = time.monotonic()
        parts = text.split(" · ")
        self.cell = (parts[0], parts[1]) if len(parts) == 3 else None
        self.stored_before = parts[-1] == STORED_BEFORE
        if self.cell is not None and not self.stored_before:
            for warning in self.before_first:
                self.warn(warning)
            self.before_first = []
        if self.progress.disable:
            self._said_begun(text)
            if self._entered:   # and so cancelled on the way out
                self._watch_slow(text)
        if self.task is not None:
            # Names come from plans and stores: their control characters are shown escaped.
            self.progress.update(self.task, description=printable(text))
            if text.endswith("(adaptive)"):   # a repetition beyond the plan's: grow the bar
                self.total += 1
                self.progress.update(self.task, total=self.total)
                self.advance()

    def _watch_slow(self, text: str) -> None:
        """Without a terminal: a step still going after SLOW_STEP seconds is said once (a
        guest's boot, a 2 GiB prepare under TCG), so a log shows what the run waits for."""
        if self._slow is not None:
            self._slow.cancel()
        self._slow = threading.Timer(SLOW_STEP, lambda: err.print(
            f"{escape(printable(text))}: {SLOW_STEP:g} s so far", highlight=False,
            soft_wrap=True))
        self._slow.daemon = True
        self._slow.start()

    def _said_begun(self, text: str) -> None:
        """Without a terminal: a line as each cell starts, beside the one as it is done."""
        if self.cell is not None and not self.stored_before and self.cell not in self.begun:
            self.begun.add(self.cell)
            err.print(f"[{self.done}/{self.total}] {escape(printable(' · '.join(self.cell)))} "
                      "starts", highlight=False, soft_wrap=True)

    def advance(self) -> None:
        self.done += 1
        if self.task is not None:
            self.progress.update(self.task, advance=1, eta=_eta_text(self.eta()))
        if self.cell is None or self.per_cell is None or not self.progress.disable:
            return
        self.cells[self.cell] = self.cells.get(self.cell, 0) + 1
        # A cell the resumed run had whole is no news; one finished now is, however many
        # of its repetitions were stored before.
        if self.cells[self.cell] == self.per_cell and not self.stored_before:
            from vmtax.studies.estimate import duration

            err.print(f"[{self.done}/{self.total}] {escape(printable(' · '.join(self.cell)))} "
                      "done, "
                      f"{duration(time.monotonic() - self.started)} in, "
                      f"{_eta_text(self.eta())}", highlight=False, soft_wrap=True)

    def warn(self, text: str) -> None:
        self.progress.console.print("[yellow]warning:[/yellow] "
                                    + escape(printable(text, newlines=True)))
