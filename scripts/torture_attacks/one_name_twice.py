"""One name spelt twice: composed and decomposed (issue #35, item 12), full-width beside
ASCII and with a trailing space (issue #45, defect 17)."""

from __future__ import annotations

from torture_kit.env import Env, Outcome, one_line_refusal
from torture_kit.registry import Attack

# (a name, another spelling of it that looks the same, what the refusal says)
SPELLINGS = (("caf\u00e9", "cafe\u0301", "NFC"), ("vm1", "\uff56\uff4d\uff11", "NFKC"),
             ("native1", "native1 ", "space"))


def one_name_twice_attack(env: Env, outcome: Outcome) -> None:
    """Each pair of SPELLINGS as two targets of a plan, two labels of --qemu and two
    targets of a density plan: refused in one line, saying why."""
    for n, (name, other, why) in enumerate(SPELLINGS):
        plan = env.work / f"twice-{n}.toml"
        plan.write_text(f'[targets."{name}"]\nkind = "native"\n[targets."{other}"]\n'
                        'kind = "native"\n[[workloads]]\nname = "cpu"\n')
        density = env.work / f"twice-{n}-density.toml"
        density.write_text(f'[targets."{name}"]\nkind = "container"\n[targets."{other}"]\n'
                           'kind = "container"\n')
        for args in (["plan", str(plan)], ["run", str(plan), "--dry-run"],
                     ["run", "--targets", "vm", "--workloads", "cpu", "--qemu",
                      f"{name}=/bin/true", "--qemu", f"{other}=/bin/true", "--dry-run"],
                     ["density", str(density)]):
            outcome.cases += 1
            done = env.run(*args, timeout=60)
            one_line_refusal(outcome, f"vmtax {args[0]} with {why}: {args[1][-20:]}", done, why)


ATTACK = Attack(
    "one name spelt twice (#35, #45.17)",
    "target names and --qemu labels in NFC and NFD, full-width and ASCII, with and without a "
    "trailing space", "refused in one line saying why",
    lambda env, o, quick: one_name_twice_attack(env, o))
