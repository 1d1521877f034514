"""Fuzzed outputs for the parser of every registered workload (issue #16), mutated from
the tools' real outputs kept as test fixtures."""

from __future__ import annotations

import math
import random
import re

from torture_kit.env import ROOT, Env, Outcome
from torture_kit.registry import Attack


def seeds_for(cls: type) -> list[str]:
    """Real outputs of the workload's tool kept as test fixtures (by its module's name),
    and a few of no tool at all."""
    module = cls.__module__.rsplit(".", 1)[-1]
    found = []
    for path in sorted((ROOT / "tests" / "fixtures").glob(f"{module}/**/*")):
        if path.is_file() and path.suffix in (".txt", ".json", ".log", ""):
            try:
                found.append(path.read_text(errors="replace"))
            except OSError:
                continue
    named = [text for text in found if cls.name in text] or found
    return named[:20] + ["", "0", "events per second: 1\n", '{"end": {}}']


def mutate(rng: random.Random, text: str) -> str:

    lines = text.splitlines(keepends=True)
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.35 and text:
            numbers = list(re.finditer(r"-?\d+(\.\d+)?", text))
            if numbers:
                m = rng.choice(numbers)
                text = text[:m.start()] + rng.choice(
                    ["inf", "nan", "-1", "0", "1e999", "9" * 5000, "1" * 30, "0.0", "-0",
                     "NaN", "ω", ""]) + text[m.end():]
        elif roll < 0.5 and lines:
            del lines[rng.randrange(len(lines))]
            text = "".join(lines)
        elif roll < 0.6 and lines:
            line = rng.choice(lines)
            lines.insert(rng.randrange(len(lines) + 1), line)
            text = "".join(lines)
        elif roll < 0.75:
            text = text[:rng.randint(0, len(text))]
        elif roll < 0.9:
            at = rng.randint(0, len(text))
            text = text[:at] + rng.choice(["\x00", "\u202e", "\r", "{", "}", "\"", ":", "ü",
                                           "\n\n", "[", "]", ","]) + text[at:]
        else:
            text = "".join(chr(rng.randrange(1, 0x2FF)) for _ in range(rng.randint(0, 300)))
        lines = text.splitlines(keepends=True)
    return text


def parser_attack(env: Env, outcome: Outcome, count: int) -> None:
    from vmtax.core import workload as workloads
    from vmtax.core.errors import ParseError, VmtaxError

    for name, cls in sorted(workloads.registered().items()):
        try:
            workload = cls.make({}, 2, strict=False)
        except VmtaxError as exc:
            outcome.note(f"{name}: not made with defaults ({str(exc)[:60]})")
            continue
        seeds = seeds_for(cls)
        parsers = [("parse", workload.parse)]
        if cls.parse_prepare is not workloads.Workload.parse_prepare:
            parsers.append(("parse_prepare", workload.parse_prepare))
        manifest = {spec.name for spec in cls.metrics}
        for _ in range(count):
            text = mutate(env.rng, env.rng.choice(seeds))
            for label, parse in parsers:
                outcome.cases += 1
                try:
                    metrics = parse(text)
                except ParseError:
                    outcome.note("ParseError")
                    continue
                except Exception as exc:   # noqa: BLE001 - the attack looks for these
                    # The runner stores such a repetition as failed with its output (issue
                    # #16, defect 6), so no traceback: counted, the first one named.
                    outcome.note(f"{name}.{label} raised {type(exc).__name__} (stored as "
                                 "failed)")
                    continue
                bad = [m for m in metrics if not math.isfinite(m.value)
                       or (label == "parse" and m.name not in manifest)]
                if bad:
                    outcome.fail(f"{name}.{label}: returned {bad[0]}")
                else:
                    outcome.note("metrics")


ATTACK = Attack(
    "fuzzed parser outputs", "every registered workload's parse and parse_prepare",
    "ParseError or finite metrics of the workload's manifest (another exception is stored "
    "as a failed repetition, and counted)",
    lambda env, o, quick: parser_attack(env, o, 50 if quick else 1000))
