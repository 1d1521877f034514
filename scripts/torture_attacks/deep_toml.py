"""Arrays and tables nested deep, to every command that reads a plan (issue #35, item 9)."""

from __future__ import annotations

from torture_kit.env import Env, Outcome, one_line_refusal
from torture_kit.registry import Attack


def deep_toml_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Item 9: arrays and tables nested 100,000 deep, and 1,000 inside a workload's
    params, given to every command that reads a plan: one line each."""
    texts = {"100,000 nested arrays": "x = " + "[" * 100_000 + "]" * 100_000 + "\n",
             "1,000 levels in params": '[targets.native]\n[[workloads]]\nname = "cpu"\n'
                                       "params = { threads = " + "[" * 1000 + "1" + "]" * 1000
                                       + " }\n",
             "300 nested tables": "a = " + "{ b = " * 300 + "1" + " }" * 300 + "\n"}
    commands = [["plan"], ["run", "--dry-run"], ["tune", "--dry-run"], ["density"]]
    for what, text in texts.items():
        path = env.work / "deep.toml"
        path.write_text(text)
        for command in commands[:2] if quick else commands:
            outcome.cases += 1
            args = [command[0], str(path), *command[1:]]
            done = env.run(*args, *(["--results", str(env.work / "deep-r")]
                                    if command[0] != "plan" else []), timeout=60)
            one_line_refusal(outcome, f"vmtax {command[0]} with {what}", done, "nested")


ATTACK = Attack(
    "deeply nested TOML (#35)", "`plan`, `run`, `tune`, `density` of a deeply nested plan",
    "one line naming the nesting", deep_toml_attack)
