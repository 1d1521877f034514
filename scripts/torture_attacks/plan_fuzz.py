"""Fuzzed plan files (issue #16): shipped plans with a value replaced, plans made of
random keys and hostile values, broken TOML, and devices, FIFOs, huge and binary files as
plans; through the plan's checks and a few through `vmtax plan`."""

from __future__ import annotations

import json
import math
import os
import random
import re
from pathlib import Path
from typing import Any

from torture_kit.env import ROOT, Env, Outcome, check_output
from torture_kit.registry import Attack


NASTY = ["", " ", "\u0000", "max\u0000", "\u202e", "\x1b[31m", "\n", "ü", "🦀" * 40,
         "$(touch {sentinel})", "`touch {sentinel}`", "; touch {sentinel}", "| touch {sentinel}",
         "../../../../etc/passwd", "/dev/zero", "-rf", "--help", "a" * 5000, "none", "auto",
         "2M", "1G", "99T", "0-1", "0,1", "-1", "%s%n", "{}", "[", "'", '"']
NUMBERS = [0, -1, 1, 2, 3, 2**31, 2**63 - 1, -(2**63), 10**18, 0.5, -0.0, 1e308,
           math.inf, -math.inf, math.nan, True, False]


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)   # a valid TOML basic string, escapes included
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"


def fuzz_value(rng: random.Random, sentinel: Path) -> Any:
    roll = rng.random()
    if roll < 0.4:
        return rng.choice(NASTY).replace("{sentinel}", str(sentinel))
    if roll < 0.8:
        return rng.choice(NUMBERS)
    if roll < 0.9:
        return [fuzz_value(rng, sentinel) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "name", "kind", "zip"]): fuzz_value(rng, sentinel)}


def mutate_shipped_plan(rng: random.Random, sentinel: Path) -> str:
    """A shipped plan with one value replaced: mostly valid, so what follows validation
    (the estimate, the plan as stored) is attacked too."""

    text = rng.choice(sorted((ROOT / "plans").glob("*.toml"))).read_text()
    lines = text.splitlines()
    values = [i for i, line in enumerate(lines) if re.match(r"^[\w-]+ = ", line)]
    if values and rng.random() < 0.8:
        i = rng.choice(values)
        lines[i] = lines[i].split(" = ", 1)[0] + " = " + toml_value(fuzz_value(rng, sentinel))
    return "\n".join(lines) + "\n"


def fuzz_plan(rng: random.Random, sentinel: Path) -> str:
    from vmtax.core import plugin
    from vmtax.core import target as targets
    from vmtax.core import workload as workloads
    from vmtax.studies import planfile

    if rng.random() < 0.4:
        return mutate_shipped_plan(rng, sentinel)

    settings = list(planfile.SETTINGS)
    kinds = list(targets.kinds())
    names = list(workloads.registered())
    lines = []
    for key in rng.sample(settings, rng.randint(0, 3)):
        lines.append(f"{key} = {toml_value(fuzz_value(rng, sentinel))}")
    for _ in range(rng.randint(0, 2)):
        kind = rng.choice(kinds + ["bogus"])
        lines.append(f"[targets.{json.dumps(kind + rng.choice(['', '-x', ' ü']))}]")
        lines.append(f"kind = {json.dumps(kind)}")
        options = (list(plugin.option_infos(targets.get(kind).Options))
                   if kind in kinds else ["x"])
        for key in rng.sample(options, min(len(options), rng.randint(0, 3))):
            lines.append(f"{json.dumps(key)} = {toml_value(fuzz_value(rng, sentinel))}")
    for _ in range(rng.randint(0, 2)):
        name = rng.choice(names + ["bogus"])
        lines.append("[[workloads]]")
        lines.append(f"name = {json.dumps(name)}")
        options = (list(plugin.option_infos(workloads.get(name).Options))
                   if name in names else ["x"])
        params = {key: fuzz_value(rng, sentinel)
                  for key in rng.sample(options, min(len(options), rng.randint(0, 3)))}
        lines.append(f"params = {toml_value(params)}")
    text = "\n".join(lines) + "\n"
    if rng.random() < 0.1:   # broken TOML: cut anywhere, or bytes that are no text
        text = text[:rng.randint(0, len(text))] + rng.choice(["", "\x00", "=", "[[", "\ud800"])
    return text


def plan_attack(env: Env, outcome: Outcome, count: int, through_cli: int) -> None:
    from vmtax.core.errors import VmtaxError
    from vmtax.studies import estimate, planfile

    sentinel = env.work / "INJECTED"
    plans = env.work / "plans"
    plans.mkdir()
    special = [Path("/dev/zero"), Path("/dev/urandom"), plans, plans / "fifo",
               plans / "huge.toml", plans / "missing.toml", plans / "binary.toml"]
    os.mkfifo(plans / "fifo")
    (plans / "huge.toml").write_text("# x\n" * (1 << 19))
    (plans / "binary.toml").write_bytes(bytes(env.rng.randrange(256) for _ in range(4096)))
    paths = list(special)
    for i in range(count - len(special)):
        path = plans / f"plan-{i}.toml"
        path.write_bytes(fuzz_plan(env.rng, sentinel).encode("utf-8", "surrogatepass"))
        paths.append(path)
    before = sorted(p.name for p in env.work.iterdir())
    for path in paths:
        outcome.cases += 1
        try:
            plan = planfile.load(str(path))
            estimate.estimate(plan)
            plan.to_dict()
            outcome.note("valid")
        except VmtaxError:
            outcome.note("refused")
        except Exception as exc:   # noqa: BLE001 - what the attack looks for
            outcome.fail(f"{path.name}: {type(exc).__name__}: {str(exc)[:150]}")
    for path in env.rng.sample(paths, min(through_cli, len(paths))):
        done = env.run("plan", str(path), timeout=60)
        outcome.cases += 1
        check_output(outcome, f"vmtax plan {path.name}", done.stderr)
        if done.returncode not in (0, 2):
            outcome.fail(f"vmtax plan {path.name}: exit {done.returncode}")
    if sentinel.exists():
        outcome.fail("a plan value ran a shell command")
    if sorted(p.name for p in env.work.iterdir()) != before:
        outcome.fail("checking plans created files")


ATTACK = Attack(
    "fuzzed plan files", "plan files: planfile.load, the estimate, `vmtax plan`",
    "valid or refused as VmtaxError, never another exception; no shell command run; no file "
    "made by checking", lambda env, o, quick: plan_attack(env, o, 100 if quick else 1200,
                                                          1 if quick else 30))
