"""Narrow terminals (issue #45, defect 16): a run of six targets with long names, shown at
80 columns (`show`, `show --all`, `compare`): every target's name shows whole, and every
number a wide terminal shows is there whole too (a fifth target's column once vanished, a
value was cut to "0."); `report --png` of target names of up to 130 characters prints no
matplotlib warning (one had said the axes collapsed, and drew the figure without its
layout)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from torture_kit.env import VMTAX, Env, Outcome, check_output
from torture_kit.registry import Attack

TARGETS = ("native", "container:runc", "container:crun", "vm:tcg@stock",
           "vm:tcg@patched-build", "libvirt:my-guest")
LONG = ("native", "vm:tcg@" + "a-long-label-for-a-patched-qemu-build-" * 3,
        "container:runc@" + "x" * 100, *(f"vm:tcg@build-{n}-of-the-patched-qemu-tree"
                                          for n in range(3)))
NUMBER = re.compile(r"\d[\d.,]*\d|\d")


def _store(results: Path, targets: tuple[str, ...]) -> None:
    from vmtax.core.types import Metric
    from vmtax.results.store import Store

    store = Store(results)
    run_id = store.new_run({"name": "narrow", "baseline": "native",
                            "targets": [{"name": t, "kind": "native", "options": {}}
                                        for t in targets],
                            "workloads": [{"name": "cpu"}]}, {}, "0")
    for n, target in enumerate(targets):
        store.set_target(run_id, target, "native", {"bare_host": n == 0})
        for i in range(5):
            store.add_rep(run_id, target=target, workload="cpu", params={}, phase="measure",
                          idx=i, status="ok", argv=[], started=0.0, metrics=[
                              Metric("events/s", 12345.678 * (1 + n / 10) + i, "events/s", True),
                              Metric("latency-avg", 0.000123 * (1 + n) + i * 1e-6, "ms",
                                     False)])
    store.finish_run(run_id, "done")
    store.close()


def _shown(env: Env, columns: int, args: list[str]) -> str:
    done = subprocess.run([*VMTAX, *args], text=True, capture_output=True, timeout=120,
                          env={**env.env, "COLUMNS": str(columns)})
    return done.stdout + done.stderr


def narrow(env: Env, outcome: Outcome, quick: bool) -> None:
    results = env.work / "narrow-r"
    _store(results, TARGETS)
    r = ["--results", str(results)]
    commands = [["show", "last", *r], ["show", "last", "--all", *r]]
    if not quick:
        commands.append(["compare", "last:native", "last:vm:tcg@patched-build", *r])
    for command in commands:
        outcome.cases += 1
        what = f"vmtax {' '.join(command[:-2])} at 80 columns"
        wide, narrow_ = _shown(env, 250, command), _shown(env, 80, command)
        missing = set(NUMBER.findall(wide)) - set(NUMBER.findall(narrow_))
        names = [t for t in TARGETS if t in wide and t not in narrow_]
        if missing or names or "…" in narrow_:
            outcome.fail(f"{what}: cut {sorted(missing)[:4]}, names not whole "
                         f"{names[:3]}{', an ellipsis' if '…' in narrow_ else ''}")
        else:
            outcome.note("every name and number whole")
    outcome.cases += 1
    long_names = env.work / "long-names-r"
    _store(long_names, LONG)
    done = env.run("report", "last", "--html", str(env.work / "narrow.html"), "--png",
                   str(env.work / "narrow-figures"), "--results", str(long_names),
                   timeout=300)
    check_output(outcome, "report --png of long names", done.stderr)
    if "Warning" in done.stderr or done.returncode != 0:
        outcome.fail(f"report --png of long names: exit {done.returncode}: "
                     f"{done.stderr.strip()[-200:]}")


ATTACK = Attack(
    "six targets at 80 columns (#45.16)",
    "`show`, `show --all`, `compare` at COLUMNS=80, `report --png` of long target names",
    "every target's name and every number shown whole; no matplotlib warning", narrow)
