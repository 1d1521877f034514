"""The Otava export escapes as the CSV export does (issue #45, defect 8): a series of runs
whose targets are named as formulas and with terminal escapes, exported with `--format
otava`: no raw control character, and no text cell a spreadsheet would run."""

from __future__ import annotations

import csv
import io

from torture_kit.env import Env, Outcome, in_process
from torture_kit.registry import Attack
from torture_kit.stores import ESCAPES, HOSTILE_NAMES, raw_controls, series_store


def otava_escapes(env: Env, outcome: Outcome, quick: bool) -> None:
    results = env.work / "otava-r"
    series_store(results, "t", runs=3, targets=("native", HOSTILE_NAMES[0], ESCAPES[0],
                                               HOSTILE_NAMES[1]))
    outcome.cases += 1
    code, output, exc = in_process("export", "t", "--format", "otava", "--results",
                                   str(results))
    if code != 0:
        outcome.fail(f"export --format otava: exit {code}: {exc}")
        return
    if raw_controls(output):
        outcome.fail(f"export --format otava: raw control characters {raw_controls(output)[:3]!r}")
    for cell in (c for row in csv.reader(io.StringIO(output)) for c in row):
        if cell.startswith(("=", "+", "-", "@", "\t", "\r")):
            try:
                float(cell)
            except ValueError:
                outcome.fail(f"export --format otava: a cell a spreadsheet runs: {cell[:60]!r}")
                break
    else:
        outcome.note("escaped as the CSV export")


ATTACK = Attack(
    "the Otava export's cells (#45.8)", "`export NAME --format otava` of hostile target names",
    "no raw control character; a text cell that begins as a formula gets a leading quote",
    otava_escapes)
