"""`vmtax runs`: the stored runs as one table (rich), laid out once per shape of row."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from vmtax.core.text import printable

if TYPE_CHECKING:   # analysis loads numpy and the plugins: `vmtax runs` needs neither
    pass
from vmtax.report.terminal import fits, shown_text


def print_runs(console: Console, runs: list[dict], source: str) -> None:
    """One row per stored run, every value whole at 80 columns: lists wrap between their
    items, and the start time, which the id spells already (YYYYMMDD-HHMMSS-…), is left
    out when the table would not fit with it."""
    console.print(Text(f"stored runs in {source}", style="bold"))
    rows = [_run_cells(r) for r in runs]
    shapes = {_shape(row): row for row in rows}
    # Whether it fits is seen on one run of each shape (ids and times are all as wide):
    # rendering hundreds of runs twice took seconds.
    started = fits(console, _runs_table(list(shapes.values()), started=True))
    console.print(_RunsTable(rows, started))


# The cells of a run's row that every run has its own of: the rest (name, status, targets,
# workloads) is what runs of one shape share.
_OWN = ("id", "started", "reps", "failed")
# Stand-ins for those cells while rich lays out one row of each shape: one character a
# cell, from Unicode's private use area (no value holds one), each as wide as a digit.
_STAND_IN = dict(zip(_OWN, "\ue000\ue001\ue002\ue003"))


def _run_cells(r: dict) -> dict[str, str]:
    """A run's row as the table's cells (rich markup)."""
    return {"id": r["id"], "name": shown_text(r.get("name") or ""),
            "started": time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"])),
            "status": r["status"], "targets": shown_text(", ".join(r["targets"])),
            "workloads": shown_text(", ".join(r["workloads"])), "reps": str(r["reps"]),
            "failed": str(r["failed"])}


def _shape(row: dict[str, str]) -> tuple:
    """What decides how a row is laid out: its shared cells, and where its own ones have
    characters (their words' lengths)."""
    return tuple(re.sub(r"\S", "x", text) if key in _OWN else text for key, text in row.items())


class _RunsTable:
    """The runs table as rich prints it, laid out once per shape of row: rows of one shape
    take the same lines, but for their own cells (_OWN), which no_wrap keeps whole on one
    line. Rich lays out one row of each shape, its own cells stood in for (_STAND_IN), and
    every run's row is its shape's lines with its own values put back; laying out each of
    400 runs took 0.3 s. Where a stand-in does not come out whole (a console too narrow
    for an id) or a value is not plain text, rich lays out every row."""

    def __init__(self, rows: list[dict[str, str]], started: bool):
        self.rows, self.started = rows, started

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        plain = all(escape(row[key]) == row[key] == printable(row[key]) and row[key].isascii()
                    for row in self.rows for key in _OWN)
        shapes = {_shape(row): row for row in self.rows} if plain else {}
        stand_ins = [{**row, **{key: re.sub(r"\S", _STAND_IN[key], row[key]) for key in _OWN}}
                     for row in shapes.values()]
        lines = list(Segment.split_lines(console.render(
            _runs_table(stand_ins, self.started), options)))
        starts = [n for n, line in enumerate(lines)
                  if any(_STAND_IN["id"] in segment.text for segment in line)]
        groups = [lines[a:b] for a, b in zip(starts, [*starts[1:], len(lines)])]
        if not plain or len(groups) != len(stand_ins) or not all(
                _whole(group, stand_in, self.started)
                for group, stand_in in zip(groups, stand_ins)):
            yield from console.render(_runs_table(self.rows, self.started), options)
            return
        by_shape = {shape: [_merged(line) for line in group]
                    for shape, group in zip(shapes, groups)}
        for line in lines[:starts[0]] if starts else lines:
            yield from line
            yield Segment.line()
        for row in self.rows:
            own = {re.sub(r"\S", _STAND_IN[key], row[key]): row[key] for key in _OWN}
            for line in by_shape[_shape(row)]:
                for segment in line:
                    if not segment.control and any(c in segment.text
                                                   for c in _STAND_IN.values()):
                        text = segment.text
                        for stand_in, value in own.items():
                            text = text.replace(stand_in, value)
                        segment = Segment(text, segment.style)
                    yield segment
                yield Segment.line()


def _merged(line: list[Segment]) -> list[Segment]:
    """The line with each run of unstyled segments as one segment: printed alike (rich
    writes no codes for them), and rich's work per segment done for a few, not dozens."""
    merged: list[Segment] = []
    for segment in line:
        if segment.style or segment.control:
            merged.append(segment)
        elif merged and merged[-1].style is None and not merged[-1].control:
            merged[-1] = Segment(merged[-1].text + segment.text)
        else:
            merged.append(Segment(segment.text))
    return merged


def _whole(lines: list[list[Segment]], stand_in: dict[str, str], started: bool) -> bool:
    """Whether each own cell of a row's stand-in came out once, whole, in one segment."""
    texts = [segment.text for line in lines for segment in line]
    return all(sum(text.count(stand_in[key]) for text in texts) == 1
               and sum(text.count(_STAND_IN[key]) for text in texts) == len(
                   stand_in[key].replace(" ", ""))
               for key in _OWN if key != "started" or started)


def _runs_table(rows: list[dict[str, str]], started: bool) -> Table:
    named = any(row["name"] for row in rows)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), collapse_padding=True,
                  show_edge=False)
    table.add_column("id", no_wrap=True)
    if named:
        table.add_column("name", overflow="fold")
    if started:
        table.add_column("started", no_wrap=True)
    table.add_column("status", overflow="fold")
    # Names wrap between each other; only a table too wide even so folds one.
    table.add_column("targets", overflow="fold")
    table.add_column("workloads", overflow="fold")
    table.add_column("runs", justify="right", no_wrap=True)
    table.add_column("failed", justify="right", no_wrap=True)
    for row in rows:
        table.add_row(row["id"], *([row["name"]] if named else []),
                      *([row["started"]] if started else []), row["status"], row["targets"],
                      row["workloads"], row["reps"], row["failed"])
    return table
