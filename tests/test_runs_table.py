"""`vmtax runs` on many runs: the table laid out once per shape of row (report.runs_table
_RunsTable) prints byte for byte what rich prints laying out every row."""

from __future__ import annotations

import io
import random

import pytest
from rich.console import Console

from vmtax.report import runs_table

NAMES = ["nightly", "a-much-longer-name-that-has-to-fold-somewhere-in-a-narrow-table",
         "[bold]x[/bold]", "tab\there", None]
TARGETS = [["native"], ["container", "native", "vm"], ["vm:tcg", "container:runc", "native"]]
WORKLOADS = [["cpu"], ["cpu", "fileio", "memory", "mutex", "threads"], ["compile", "http"]]


def runs(count: int, seed: int = 1) -> list[dict]:
    """Runs of a store a nightly plan fills: most alike, some of every other kind."""
    rng = random.Random(seed)
    return [{"id": f"20261128-{rng.randrange(10 ** 6):06d}-{rng.randrange(16 ** 4):04x}",
             "created": 1.79e9 + rng.randrange(10 ** 7), **(
                 {"name": "nightly", "status": "done", "targets": TARGETS[1],
                  "workloads": WORKLOADS[1], "reps": 75, "failed": 0}
                 if rng.random() < 0.8 else
                 {"name": rng.choice(NAMES), "status": rng.choice(["done", "interrupted"]),
                  "targets": rng.choice(TARGETS), "workloads": rng.choice(WORKLOADS),
                  "reps": rng.choice([5, 1250]), "failed": rng.choice([0, 12])})}
            for _ in range(count)]


def printed(width: int, color: bool, renderable) -> str:
    console = Console(width=width, file=io.StringIO(), force_terminal=color,
                      color_system="truecolor" if color else None, highlight=False)
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined]


@pytest.mark.parametrize("width", [14, 40, 80, 120, 200])
@pytest.mark.parametrize("color", [False, True])
@pytest.mark.parametrize("started", [False, True])
def test_rows_laid_out_once_per_shape_print_as_rich_prints_every_row(width, color, started,
                                                                    monkeypatch):
    rows = [runs_table._run_cells(r) for r in runs(200)]
    shapes = len({runs_table._shape(row) for row in rows})
    assert shapes < len(rows) / 2
    expected = printed(width, color, runs_table._runs_table(rows, started))
    laid_out = []
    table = runs_table._runs_table
    monkeypatch.setattr(runs_table, "_runs_table",
                        lambda rows, started: laid_out.append(len(rows)) or table(rows, started))
    assert printed(width, color, runs_table._RunsTable(rows, started)) == expected
    # Wide enough for whole ids, rich laid out one row per shape; too narrow, every row.
    if width >= 80:
        assert laid_out == [shapes]
    elif width < 20:
        assert laid_out == [shapes, len(rows)]


def test_a_value_that_is_not_plain_text_is_laid_out_by_rich():
    rows = [runs_table._run_cells(r) for r in runs(5)]
    rows[2]["id"] = "[red]odd[/red]"
    assert (printed(80, True, runs_table._RunsTable(rows, True))
            == printed(80, True, runs_table._runs_table(rows, True)))


def test_the_runs_command_prints_every_run(tmp_path):
    many = runs(30, seed=2)
    console = Console(width=80, file=io.StringIO(), highlight=False)
    runs_table.print_runs(console, many, "store")
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert [line.split()[0] for line in text.splitlines() if line.startswith("2026")] == [
        r["id"] for r in many]
