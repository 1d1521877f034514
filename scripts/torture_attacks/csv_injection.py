"""Names a spreadsheet would run as formulas, exported as CSV (issue #29, defect 4)."""

from __future__ import annotations

from torture_kit.env import Env, Outcome, in_process
from torture_kit.registry import Attack
from torture_kit.stores import hostile_store


def csv_injection_attack(env: Env, outcome: Outcome) -> None:
    """Defect 4: names a spreadsheet would run as formulas, exported as CSV."""
    import csv
    import io

    results = hostile_store(env, "csv-injection")
    code, output, exc = in_process("export", "last", "--csv", "-", "--results", str(results))
    outcome.cases += 1
    if code != 0:
        outcome.fail(f"export --csv of hostile names: exit {code}: {exc}")
        return
    cells = [cell for row in csv.reader(io.StringIO(output)) for cell in row]
    for cell in cells:
        if cell.startswith(("=", "+", "-", "@", "\t", "\r")):
            try:
                float(cell)
            except ValueError:
                outcome.fail(f"export --csv: a cell a spreadsheet runs: {cell[:60]!r}")
    if "-1.5" not in cells:
        outcome.fail("export --csv: the number -1.5 is no longer a number")
    outcome.note(f"{sum(c.startswith(chr(39)) for c in cells)} cells neutralised")


ATTACK = Attack(
    "formulas in CSV cells", "`vmtax export --csv` of targets named as formulas",
    "every text cell a spreadsheet would run gets a leading quote; -1.5 stays a number",
    lambda env, o, quick: csv_injection_attack(env, o))
