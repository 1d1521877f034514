"""A guardian stopped or killed with its run (issue #29, defect 9)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from torture_kit.env import VMTAX, Env, Outcome, check_output, vmtax_with
from torture_kit.host import descendants, journal_entries, leftovers
from torture_kit.registry import Attack


def guardian_of(pid: int) -> int | None:
    return next((p for (p, _), c in descendants(pid).items() if "vmtax.host.guardian" in c),
                None)


def guardian_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Issue #29, defect 9: a stopped guardian does not hang vmtax; what a run and its
    guardian, both killed, left is named by any command and `doctor`, undone by
    `cleanup`."""
    runtime = env.work / "runtime-guardian"
    runtime.mkdir(mode=0o700)
    common = ["run", "--targets", "native", "--workloads", "cpu", "--runs", "1", "--warmup",
              "0", "--results", str(env.work / "guardian-r")]
    for stop in ([] if quick else [signal.SIGSTOP]) + [signal.SIGKILL]:
        proc = subprocess.Popen([*VMTAX, *common, "--time", "2" if stop == signal.SIGSTOP
                                 else "20"], env={**env.env, "VMTAX_RUNTIME": str(runtime)},
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        env.started.append(proc)
        outcome.cases += 1
        name = f"guardian {signal.Signals(stop).name}"
        # Killed once its journal lists a change; stopped while it measures, to end soon.
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and not (
                any("sysbench" in c for c in descendants(proc.pid).values())
                if stop == signal.SIGSTOP else journal_entries(runtime)):
            time.sleep(0.05)
        watcher = guardian_of(proc.pid)
        entries = journal_entries(runtime)
        if watcher is None or proc.poll() is not None:
            outcome.fail(f"{name}: the run ended before it was measuring")
            continue
        os.kill(watcher, stop)
        if stop == signal.SIGKILL:
            proc.kill()
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            outcome.fail(f"{name}: vmtax hung at its end")
            proc.kill()
            _, err = proc.communicate()
        check_output(outcome, name, err)
        if stop == signal.SIGSTOP:
            if "was stopped: killed it" not in err or list(runtime.glob("journal-*")):
                outcome.fail(f"{name}: {err.strip()[-200:]}")
            continue
        warned = vmtax_with(env, runtime, "runs", "--results", str(env.work / "guardian-r"))
        if "died leaving" not in warned.stderr:
            outcome.fail(f"{name}: `vmtax runs` did not warn: {warned.stderr.strip()[-200:]}")
        if not quick:
            doctor = vmtax_with(env, runtime, "doctor", "--json")
            checks = {c["name"]: c for c in json.loads(doctor.stdout or "{}").get("checks", [])}
            if "died leaving" not in checks.get("undo journal", {}).get("detail", ""):
                outcome.fail(f"{name}: `vmtax doctor` did not name what was left")
        cleaned = vmtax_with(env, runtime, "cleanup")
        check_output(outcome, f"{name} (cleanup)", cleaned.stderr)
        left = leftovers(entries) + (["a journal"] if list(runtime.glob("journal-*")) else [])
        if left:
            outcome.fail(f"{name}: `vmtax cleanup` left {', '.join(left[:3])}")
        else:
            outcome.note("warned, then cleaned up")


ATTACK = Attack(
    "guardian stopped or killed", "the guardian process of a run",
    "a stopped guardian does not hang vmtax; what a killed run and guardian left is named "
    "by `runs` and `doctor` and undone by `cleanup`", guardian_attack)
