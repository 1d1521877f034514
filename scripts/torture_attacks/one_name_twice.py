"""One name spelt twice: composed and decomposed (issue #35, item 12)."""

from __future__ import annotations

from torture_kit.env import Env, Outcome, one_line_refusal
from torture_kit.registry import Attack


def one_name_twice_attack(env: Env, outcome: Outcome) -> None:
    """Item 12: "café" composed and decomposed, as two targets of a plan, two labels of
    --qemu and two targets of a density plan: refused in one line, naming both."""
    cafe, decomposed = "caf\u00e9", "cafe\u0301"
    plan = env.work / "cafe.toml"
    plan.write_text(f'[targets."{cafe}"]\nkind = "native"\n[targets."{decomposed}"]\n'
                    'kind = "native"\n[[workloads]]\nname = "cpu"\n')
    density = env.work / "cafe-density.toml"
    density.write_text(f'[targets."{cafe}"]\nkind = "container"\n[targets."{decomposed}"]\n'
                       'kind = "container"\n')
    for args in (["plan", str(plan)], ["run", str(plan), "--dry-run"],
                 ["run", "--targets", "vm", "--workloads", "cpu", "--qemu",
                  f"{cafe}=/bin/true", "--qemu", f"{decomposed}=/bin/true", "--dry-run"],
                 ["density", str(density)]):
        outcome.cases += 1
        done = env.run(*args, timeout=60)
        one_line_refusal(outcome, f"vmtax {args[0]} with {args[1][-20:]}", done, "NFC")


ATTACK = Attack(
    "one name spelt twice (#35)", "target names and --qemu labels in NFC and NFD",
    "refused in one line naming both", lambda env, o, quick: one_name_twice_attack(env, o))
