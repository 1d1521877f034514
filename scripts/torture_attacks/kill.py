"""kill -9 and SIGINT at random moments of runs on VMs, containers and huge pages (issue
#16): then everything the run's journal listed (processes, cgroups, mounts, network
devices and namespaces, huge page leases), and the host's huge pages and KSM, are checked
against a snapshot taken before. One attack per target, signal and moment; the quick form
has two: SIGINT of a native run at a moment the seed draws, SIGKILL of a runc one while
it measures."""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Any

from torture_kit.env import CLEAN_WITHIN, Env, Outcome, check_output, in_python_startup
from torture_kit.host import changed, descendants, host_state, journal_entries, leftovers
from torture_kit.host import processes, run_stored
from torture_kit.registry import FULL, QUICK, Attack


# Kill attacks: (target or plan TOML, workload); VMs boot under TCG, so their runs are long.
KILL_TARGETS: list[tuple[str, str]] = [
    ("native", "cpu"),
    ("container:runc", "cpu"),
    ("container:crun", "cpu"),
    ("vm:tcg", "cpu"),
    ('[targets.vm]\naccel = "tcg"\nmemory = "256M"\nhugepages = "2M"\n', "cpu"),
    # A server in the target: a network namespace, a bridge and a veth pair.
    ("container:runc", "iperf3"),
]


def kill_attack(env: Env, outcome: Outcome, target: str, workload: str, sig: int,
                moment: str, index: int) -> None:
    """Start a run, send sig at moment (starting: while Python imports and vmtax checks;
    preparing: once the journal lists a first change to the host; measuring: while a
    benchmark runs), then check that nothing the run made outlives it."""
    results = env.work / f"kill-{index}"
    if target.startswith("["):
        plan = env.work / f"kill-{index}.toml"
        plan.write_text(f'time = 20\nruns = 2\nwarmup = 0\n{target}\n[[workloads]]\n'
                        f'name = "{workload}"\n')
        args = ["run", str(plan)]
        label = "vm:tcg huge pages"
    else:
        args = ["run", "--targets", target, "--workloads", workload, "--runs", "2",
                "--warmup", "0", "--time", "20"]
        label = target
    before = host_state()
    proc = env.start(*args, "--results", str(results))
    started = time.monotonic()
    deadline = started + 300
    entries: list[dict[str, Any]] = []
    payload: dict[tuple[int, int], str] = {}
    while proc.poll() is None and time.monotonic() < deadline:
        entries = journal_entries(env.runtime) or entries
        payload = {k: c for k, c in descendants(proc.pid).items() if "vmtax.host.guardian" not in c}
        # A guest's benchmark is no host process: a run is stored once its targets are up.
        measuring = (any(c.startswith(("sysbench", "iperf3 -c")) for c in payload.values())
                     or run_stored(results))
        if (moment == "starting" and time.monotonic() - started > env.rng.uniform(0.5, 2.5)
                or moment == "preparing" and entries
                or moment == "measuring" and measuring):
            time.sleep(env.rng.uniform(0, 1.5))
            break
        time.sleep(0.05)
    entries = journal_entries(env.runtime) or entries
    payload.update({k: c for k, c in descendants(proc.pid).items()
                    if "vmtax.host.guardian" not in c})
    outcome.cases += 1
    name = f"{label} {signal.Signals(sig).name} while {moment}"
    if proc.poll() is not None:
        out, err = proc.communicate()
        check_output(outcome, name, err)
        outcome.note("finished before the signal")
        return
    proc.send_signal(sig)
    sent = time.monotonic()
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        outcome.fail(f"{name}: vmtax did not exit within 120 s of the signal")
    check_output(outcome, name, err)
    if sig == signal.SIGINT and proc.returncode != 130 and not in_python_startup(err):
        outcome.fail(f"{name}: exit status {proc.returncode}, expected 130: {err[-200:]}")
    while True:
        table = processes()
        alive = [c for (pid, start), c in payload.items()
                 if pid in table and table[pid][1] == start]
        left = leftovers(entries) + [f"process {c[:60]}" for c in alive]
        if list(env.runtime.glob("journal-*-*.json")):
            left.append("a journal still lists changes")
        left += changed(before, entries)
        if not left:
            outcome.note(f"clean within {CLEAN_WITHIN:g} s")
            break
        if time.monotonic() - sent > CLEAN_WITHIN + (60 if sig == signal.SIGINT else 0):
            outcome.fail(f"{name}: left {', '.join(sorted(set(left))[:4])}")
            break
        time.sleep(0.1)
    if sig == signal.SIGKILL:
        cleaned = env.run("cleanup")   # and whatever was left is now undone for the next
        check_output(outcome, name + " (cleanup)", cleaned.stderr)


MOMENTS = ("starting", "preparing", "measuring")
_EXPECTS = ("exit 130 after SIGINT; within 5 s of the signal nothing the run's journal "
            "listed is left, nor a process it started, nor a change to huge pages or KSM")


def _label(target: str, workload: str) -> str:
    label = target if not target.startswith("[") else "vm:tcg huge pages"
    return label + ("" if workload == "cpu" else f" {workload}")


def _attack(index: int, target: str, workload: str, sig: signal.Signals, moment: str | None,
            forms: frozenset[str]) -> Attack:
    def run(env: Env, outcome: Outcome, quick: bool) -> None:
        kill_attack(env, outcome, target, workload, sig, moment or env.rng.choice(MOMENTS),
                    index)
    when = f"while {moment}" if moment else "at a moment the seed draws"
    return Attack(f"{sig.name} {_label(target, workload)} {when}",
                  f"`vmtax run` on {_label(target, workload)}", _EXPECTS, run, forms)


ATTACKS = [_attack(i, target, workload, sig, moment,
                   frozenset({FULL, QUICK}) if (target, sig, moment) == (
                       "container:runc", signal.SIGKILL, "measuring") and workload == "cpu"
                   else frozenset({FULL}))
           for i, ((target, workload), sig, moment) in enumerate(
               ((t, s, m) for t in KILL_TARGETS for s in (signal.SIGKILL, signal.SIGINT)
                for m in MOMENTS))]
ATTACKS.append(_attack(len(ATTACKS), "native", "cpu", signal.SIGINT, None,
                       frozenset({QUICK})))
