"""Report and export of an imported perf kvm stat report (issue #29, defect 10)."""

from __future__ import annotations

from torture_kit.env import ROOT, Env, Outcome, in_process
from torture_kit.registry import Attack


def imported_run_attack(env: Env, outcome: Outcome) -> None:
    """Defect 10: report and export of an imported perf kvm stat report say what it holds
    (or work), never that it has no successful repetitions."""
    report = ROOT / "tests" / "fixtures" / "perf_kvm" / "classic-vmx.txt"
    results = str(env.work / "imported-r")
    code, _, exc = in_process("exits", "import", str(report), "--label", "capture",
                              "--results", results)
    if code != 0:
        outcome.fail(f"exits import: exit {code}: {exc}")
        return
    for args in (("report", "capture", "--html", str(env.work / "imported.html")),
                 ("export", "capture", "--csv", str(env.work / "imported.csv")),
                 ("export", "capture", "--format", "benchstat")):
        outcome.cases += 1
        code, output, exc = in_process(*args, "--results", results)
        said = str(exc) if exc and not isinstance(exc, SystemExit) else ""
        if "no successful repetitions" in said or (code != 0 and "imported" not in said):
            outcome.fail(f"vmtax {args[0]} of an imported run: {said or output[-200:]}")
        outcome.note(f"{args[0]}: {'works' if code == 0 else 'says what it holds'}")


ATTACK = Attack(
    "report and export of an imported run", "`report`, `export` of `exits import`'s run",
    "they work, or say what it holds; never 'no successful repetitions'",
    lambda env, o, quick: imported_run_attack(env, o))
