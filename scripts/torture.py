"""vmtax attacked as a hostile user would (issue #16), seeded and repeatable.

    python scripts/torture.py [--seed N] [--quick]

Attacks: kill -9 and SIGINT at random moments of runs on VMs, containers and huge pages,
then everything the run's journal listed (processes, cgroups, mounts, network devices and
namespaces, huge page leases) and the host's huge pages and KSM are checked against a
snapshot taken before; concurrent runs and resumes on one store; fuzzed plan files;
fuzzed outputs for the parser of every registered workload; corrupt databases, and a
database deleted in the middle of a run; (issue #29) a runtime directory and journal
entries another user planted, a serving client killed with -9, a full runtime directory,
and a guardian stopped or killed with its run. Prints a table of attacks and outcomes and exits
1 on any traceback, leak, lost or duplicated repetition or side effect.

The run's own journals live in a private runtime directory, so only what its own runs
made is looked at: other vmtax may run on the host at the same time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
VMTAX = [sys.executable, "-m", "vmtax"]
TRACEBACK = "Traceback (most recent call last)"
# Within this long after kill -9 the guardian must have undone the run (issue #16).
CLEAN_WITHIN = 5.0

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


@dataclass
class Outcome:
    attack: str
    cases: int = 0
    problems: list[str] = field(default_factory=list)
    notes: dict[str, int] = field(default_factory=dict)

    def note(self, what: str) -> None:
        self.notes[what] = self.notes.get(what, 0) + 1

    def fail(self, what: str) -> None:
        self.problems.append(what)


# -- the host as seen before and after --------------------------------------------------

def processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent, start time, command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found[int(entry.name)] = int(stat[1]), int(stat[19]), cmdline
        except (OSError, ValueError, IndexError):
            continue
    return found


def descendants(pid: int) -> dict[tuple[int, int], str]:
    table, found, todo = processes(), {}, [pid]
    while todo:
        parent = todo.pop()
        for child, (ppid, start, cmd) in table.items():
            if ppid == parent and (child, start) not in found:
                found[child, start] = cmd
                todo.append(child)
    return found


def host_state() -> dict[str, str]:
    """The host-wide state a run may change: huge page pools and KSM (by the journal entry
    type that changes each)."""
    state = {}
    for pool in Path("/sys/kernel/mm/hugepages").glob("hugepages-*"):
        state[f"hugepages {pool.name}"] = (pool / "nr_hugepages").read_text().strip()
    ksm = Path("/sys/kernel/mm/ksm")
    for name in ("run", "merge_across_nodes"):
        if (ksm / name).exists():
            state[f"ksm {name}"] = (ksm / name).read_text().strip()
    return state


def changed(before: dict[str, str], entries: list[dict[str, Any]]) -> list[str]:
    """What of the host-wide state differs from before, among what the run's journal
    changed: other sessions on a shared host may change the rest meanwhile."""
    touched = {e.get("type") for e in entries}
    now = host_state()
    return [f"{key} = {now.get(key)} (was {value})" for key, value in before.items()
            if key.split()[0] in touched and now.get(key) != value]


def journal_entries(runtime: Path) -> list[dict[str, Any]]:
    entries = []
    for path in runtime.glob("journal-*-*.json"):
        try:
            entries += json.loads(path.read_text()).values()
        except (OSError, ValueError):
            continue
    return entries


def netns_names() -> set[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return {line.split()[0] for line in done.stdout.splitlines() if line.strip()}


def links(netns: str | None = None) -> set[str]:
    done = subprocess.run(["ip", *(["-n", netns] if netns else []), "-o", "link"],
                          capture_output=True, text=True)
    return {line.split(":")[1].strip().split("@")[0] for line in done.stdout.splitlines()
            if line.count(":") >= 2}


def left_over(entry: dict[str, Any], table: dict[int, tuple[int, int, str]],
              mountinfo: str, nets: set[str], devices: set[str]) -> str | None:
    """What of a journal entry is still on the host (None: it is undone)."""
    kind = entry.get("type")
    if kind == "kill":
        pid = entry["pid"]
        if pid in table and table[pid][1] == entry.get("start"):
            return f"process {pid} ({table[pid][2][:60]})"
    elif kind == "rmtree" and Path(entry["path"]).exists():
        return f"directory {entry['path']}"
    elif kind == "rmdir":
        alive = [p for p in entry["paths"] if Path(p).exists()]
        if alive:
            return f"cgroup {alive[0]}"
    elif kind == "umount" and f" {entry['path']} " in mountinfo:
        return f"mount {entry['path']}"
    elif kind == "argv":
        argv = entry["argv"]
        name = argv[-1]
        if argv[:3] == ["ip", "netns", "delete"] and name in nets:
            return f"network namespace {name}"
        if argv[:1] == ["ip"] and "link" in argv and {"del", "delete"} & set(argv):
            # A device in a namespace (ip -n NS link del DEV) goes with its namespace.
            netns = argv[argv.index("-n") + 1] if "-n" in argv else None
            if (netns is None and name in devices
                    or netns in nets and name in links(netns)):
                return f"network device {name}" + (f" in {netns}" if netns else "")
    return None


def leftovers(entries: list[dict[str, Any]]) -> list[str]:
    table = processes()
    mountinfo = Path("/proc/self/mountinfo").read_text()
    nets, devices = netns_names(), links()
    return [what for e in entries if (what := left_over(e, table, mountinfo, nets, devices))]


# -- running vmtax -----------------------------------------------------------------------

class Env:
    def __init__(self, work: Path, seed: int):
        self.work = work
        self.runtime = work / "runtime"
        self.runtime.mkdir()
        self.rng = random.Random(seed)
        self.env = {**os.environ, "VMTAX_RUNTIME": str(self.runtime)}
        self.started: list[subprocess.Popen] = []

    def start(self, *args: str) -> subprocess.Popen:
        # SIGINT as at a terminal: a background job of a shell starts with it ignored.
        proc = subprocess.Popen([*VMTAX, *args], env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        """Ctrl-C, then kill, what an attack that went wrong left running."""
        for proc in self.started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()
        self.started.clear()

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([*VMTAX, *args], env=self.env, text=True, capture_output=True,
                              timeout=timeout)


def in_python_startup(stderr: str) -> bool:
    """A Ctrl-C that landed while the interpreter itself started (site, runpy), before any
    of vmtax's code ran: nothing vmtax can catch, and nothing it had done yet."""
    return (TRACEBACK in stderr and stderr.rstrip().endswith("KeyboardInterrupt")
            and "/vmtax/" not in stderr)


def check_output(outcome: Outcome, what: str, stderr: str) -> None:
    if in_python_startup(stderr):
        outcome.note("interrupted in Python's own start-up")
    elif TRACEBACK in stderr:
        outcome.fail(f"{what}: traceback: {stderr.strip().splitlines()[-1][:200]}")


def stored_reps(results: Path) -> dict[str, list[tuple]]:
    """run id -> its repetitions' identities, straight from SQLite (none while the
    database is missing or has no schema yet)."""
    found: dict[str, list[tuple]] = {}
    try:
        db = sqlite3.connect(f"file:{results / 'vmtax.sqlite'}?mode=ro", uri=True, timeout=5)
        try:
            for run_id, target, workload, params, phase, idx in db.execute(
                    "SELECT run_id, target, workload, params, phase, idx FROM reps"):
                found.setdefault(run_id, []).append((target, workload, params, phase, idx))
        finally:
            db.close()
    except sqlite3.Error:
        return {}
    return found


def run_stored(results: Path) -> bool:
    if not (results / "vmtax.sqlite").exists():
        return False
    try:
        db = sqlite3.connect(f"file:{results / 'vmtax.sqlite'}?mode=ro", uri=True, timeout=1)
        try:
            return db.execute("SELECT count(*) FROM runs").fetchone()[0] > 0
        finally:
            db.close()
    except sqlite3.Error:    # not created yet, or mid-creation
        return False


def duplicates(reps: dict[str, list[tuple]]) -> list[str]:
    return [f"run {run_id}: {len(ids) - len(set(ids))} repetitions stored twice"
            for run_id, ids in reps.items() if len(ids) != len(set(ids))]


# -- attack: kill -9 and SIGINT mid-run --------------------------------------------------

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


# -- attack: concurrent runs and resumes on one store --------------------------------------

def concurrency_attack(env: Env, outcome: Outcome, rounds: int, fresh: bool) -> None:
    results = env.work / "concurrent"
    common = ["--targets", "native", "--workloads", "cpu", "--warmup", "0", "--time", "1",
              "--results", str(results)]
    for _ in range(rounds):
        runs = [env.start("run", *common, "--runs", "1") for _ in range(2 if fresh else 0)]
        for proc in runs:
            _, err = proc.communicate(timeout=300)
            outcome.cases += 1
            check_output(outcome, "concurrent run", err)
            if proc.returncode != 0:
                outcome.fail(f"concurrent run: exit {proc.returncode}: {err.strip()[-200:]}")
        # kill -9 a run mid-measurement, then two resumes at once: one runs, one is refused.
        victim = env.start("run", *common, "--runs", "3")
        while not any("sysbench" in c for c in descendants(victim.pid).values()):
            if victim.poll() is not None:
                break
            time.sleep(0.05)
        time.sleep(env.rng.uniform(0, 1.0))
        victim.kill()
        victim.communicate()
        listed = env.run("runs", "--json", "--results", str(results))
        check_output(outcome, "runs", listed.stderr)
        try:
            run_id = json.loads(listed.stdout)[-1]["id"]
        except (ValueError, IndexError, KeyError, TypeError):
            outcome.note("killed before its run was stored")
            continue
        resumes = [env.start("run", "--resume", run_id, "--results", str(results))
                   for _ in range(2)]
        codes = []
        for proc in resumes:
            _, err = proc.communicate(timeout=300)
            outcome.cases += 1
            check_output(outcome, "concurrent resume", err)
            codes.append((proc.returncode, err))
        refused = [e for c, e in codes if c != 0]
        if any("in progress" not in e for e in refused):
            outcome.fail(f"resume failed otherwise: {refused[0].strip()[-200:]}")
        outcome.note(f"{len(refused)} of 2 concurrent resumes refused as in progress")
        reps = stored_reps(results)
        for problem in duplicates(reps):
            outcome.fail(problem)
        measured = [r for r in reps.get(run_id, []) if r[3] == "measure"]
        if len(measured) != 3:
            outcome.fail(f"resumed run {run_id}: {len(measured)} measured repetitions, "
                         "expected 3")


# -- attack: fuzzed plan files -------------------------------------------------------------

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
    import re

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


# -- attack: fuzzed outputs for every parser -------------------------------------------------

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
    import re

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


# -- attack: corrupt databases --------------------------------------------------------------

def store_attack(env: Env, outcome: Outcome, count: int) -> None:
    from vmtax.core.types import Metric
    from vmtax.results.store import DB_NAME, Store

    template = env.work / "db-template"
    store = Store(template)
    run_id = store.new_run({"targets": [], "workloads": []}, {}, "0")
    for i in range(200):
        store.add_rep(run_id, target="native", workload="cpu", params={}, phase="measure",
                      idx=i, status="ok", argv=["x"], started=1.0, stdout="x" * 300,
                      metrics=[Metric("events/s", 1.0, "events/s", True)])
    store.finish_run(run_id, "done")
    store.close()
    good = (template / DB_NAME).read_bytes()
    kinds = ["garbage header", "truncated", "garbage page", "empty", "zeros", "a directory"]
    for i in range(count):
        how = kinds[i % len(kinds)]
        results = env.work / f"db-{i}"
        results.mkdir()
        db = results / DB_NAME
        data = bytearray(good)
        if how == "garbage header":
            data[:env.rng.randint(1, 100)] = env.rng.randbytes(100)
        elif how == "truncated":
            data = data[:env.rng.randint(1, len(data) - 1)]
        elif how == "garbage page":
            at = env.rng.randrange(1, len(data) // 4096) * 4096
            data[at:at + 4096] = env.rng.randbytes(4096)
        elif how == "empty":
            data = bytearray()
        elif how == "zeros":
            data = bytearray(len(data))
        if how == "a directory":
            db.mkdir()
        else:
            db.write_bytes(bytes(data))
        for j, command in enumerate((["runs"], ["show", "last"], [
                "run", "--targets", "native", "--workloads", "cpu", "--runs", "1",
                "--warmup", "0", "--time", "1"])):
            # Each command starts a Python (seconds here): some of them on each database.
            if (i - j) % (3 if count > 3 else 2):
                continue
            done = env.run(*command, "--results", str(results), timeout=300)
            outcome.cases += 1
            check_output(outcome, f"vmtax {command[0]} on {how}", done.stderr)
            lines = done.stderr.strip().splitlines()
            if done.returncode != 0 and len(lines) != 1:
                outcome.fail(f"vmtax {command[0]} on {how}: {len(lines)} lines of error")
            outcome.note(f"exit {done.returncode}")


def deleted_store_attack(env: Env, outcome: Outcome) -> None:
    """The database deleted while a run measures: not one repetition may be lost."""
    results = env.work / "deleted"
    proc = env.start("run", "--targets", "native", "--workloads", "cpu", "--runs", "4",
                     "--warmup", "0", "--time", "1", "--results", str(results))
    db = results / "vmtax.sqlite"
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if db.exists() and stored_reps(results):
            break
        time.sleep(0.05)
    db.unlink(missing_ok=True)
    _, err = proc.communicate(timeout=300)
    outcome.cases += 1
    check_output(outcome, "run with its database deleted", err)
    last = (err.strip().splitlines() or [""])[-1]
    if proc.returncode != 2 or "vmtax.pending.jsonl" not in last:
        outcome.fail(f"run with its database deleted: exit {proc.returncode}: {last[-300:]}")
    listed = env.run("run", "--targets", "native", "--workloads", "cpu", "--runs", "1",
                     "--warmup", "0", "--time", "1", "--results", str(results))
    check_output(outcome, "the next run", listed.stderr)
    reps = stored_reps(results)
    first = min(reps, default=None)
    kept = len(reps.get(first, [])) if first else 0
    outcome.note(f"{kept} repetitions kept aside and imported")
    if kept < 1 or (results / "vmtax.pending.jsonl").exists():
        outcome.fail("the repetitions measured after the deletion were not imported")
    for problem in duplicates(reps):
        outcome.fail(problem)


# -- attacks: planted runtime files, a killed serving client, a full journal, the guardian ----

OTHER_UID = 4344   # "another local user": any uid but ours


def vmtax_with(env: Env, runtime: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*VMTAX, *args], env={**env.env, "VMTAX_RUNTIME": str(runtime)},
                          text=True, capture_output=True, timeout=300)


def one_line_refusal(outcome: Outcome, what: str, done: subprocess.CompletedProcess,
                     names: str) -> None:
    check_output(outcome, what, done.stderr)
    lines = done.stderr.strip().splitlines()
    if done.returncode != 2 or len(lines) != 1 or names not in lines[0]:
        outcome.fail(f"{what}: exit {done.returncode}, expected one line naming {names}: "
                     f"{done.stderr.strip()[-200:]}")


def planted_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Issue #29, defect 1: another user plants a journal whose undo runs a command; and
    entries vmtax never writes, in a journal of its own user's."""
    sentinel = env.work / "PLANTED"
    planted = env.work / "planted"
    planted.mkdir()
    (planted / "journal-1-0.json").write_text(json.dumps(
        {"1": {"type": "argv", "argv": ["sh", "-c", f"id > {sentinel}"]}}))
    if os.geteuid() == 0:
        for path in (planted, planted / "journal-1-0.json"):
            os.chown(path, OTHER_UID, OTHER_UID)
        outcome.note(f"runtime directory owned by uid {OTHER_UID}")
    else:
        os.chmod(planted, 0o770)
        outcome.note("runtime directory group-writable")
    commands = [["cleanup"]] if quick else [["cleanup"], ["runs"], [
        "run", "--targets", "native", "--workloads", "cpu", "--runs", "1", "--time", "1"]]
    for command in commands:
        outcome.cases += 1
        results = [] if command == ["cleanup"] else ["--results", str(env.work / "planted-r")]
        one_line_refusal(outcome, f"vmtax {command[0]} with a planted runtime directory",
                         vmtax_with(env, planted, *command, *results), str(planted))
    own = env.work / "runtime-entries"
    own.mkdir(mode=0o700)
    kept = env.work / "kept"
    kept.mkdir()
    (kept / "file").write_text("")
    (env.work / "kept-link").symlink_to(kept)
    entries = [{"type": "argv", "argv": ["sh", "-c", f"id > {sentinel}"]},
               {"type": "argv", "argv": ["env", "X=1", "sh", "-c", f"id > {sentinel}"]},
               {"type": "rmtree", "path": str(env.work / "kept-link")},
               {"type": "kill", "pid": -1, "start": 1},
               {"type": "write", "path": str(sentinel), "value": "x"},
               {"type": "lease", "undo": "subprocess:getoutput"}]
    (own / f"journal-{2**22 + 9}-1.json").write_text(json.dumps(dict(enumerate(entries, 1))))
    outcome.cases += 1
    done = vmtax_with(env, own, "cleanup")
    check_output(outcome, "vmtax cleanup of entries vmtax never writes", done.stderr)
    if done.returncode != 0 or f"({len(entries)} failed" not in done.stdout:
        outcome.fail(f"entries vmtax never writes: exit {done.returncode}, "
                     f"{(done.stdout + done.stderr).strip()[-200:]}")
    else:
        outcome.note(f"{len(entries)} entries refused")
    if sentinel.exists():
        outcome.fail("a planted journal ran a command")
    if not (kept / "file").exists():
        outcome.fail("a planted rmtree removed a directory through a symbolic link")


def serving_client_attack(env: Env, outcome: Outcome) -> None:
    """Issue #29, defect 3: a serving client killed with -9 leaves its scratch directory
    (no longer /tmp/vmtax-serving-<pid>) and journal for its guardian to undo at once."""
    vegeta = env.work / "vegeta"
    vegeta.write_text("#!/bin/sh\nexec sleep 60\n")
    vegeta.chmod(0o755)
    spec = {"mode": "workers", "vegeta": str(vegeta), "base": "http://127.0.0.1:9",
            "endpoints": [{"name": "x", "path": "/", "method": "GET"}], "requests": 1,
            "workers": 1, "request_timeout": 1}
    # As the runner starts it: PATH and vmtax's runtime settings.
    client = subprocess.Popen([sys.executable, "-m", "vmtax.helpers.serving_client",
                               json.dumps(spec)], text=True, stderr=subprocess.PIPE,
                              env={"PATH": env.env["PATH"], "VMTAX_RUNTIME": str(env.runtime)})
    outcome.cases += 1
    deadline = time.monotonic() + 60
    while not list(env.runtime.glob("vmtax-serving-*/targets")) and client.poll() is None:
        if time.monotonic() > deadline:
            outcome.fail("the serving client never started its attack")
            return
        time.sleep(0.05)
    scratch = list(env.runtime.glob("vmtax-serving-*"))
    if Path(tempfile.gettempdir(), f"vmtax-serving-{client.pid}").exists():
        outcome.fail("the serving client used a predictable directory")
    client.kill()
    client.communicate()
    deadline = time.monotonic() + CLEAN_WITHIN
    while (any(p.exists() for p in scratch) or list(env.runtime.glob("journal-*"))) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    if not scratch:
        outcome.fail("the serving client made no scratch directory in the runtime directory")
    elif any(p.exists() for p in scratch) or list(env.runtime.glob("journal-*")):
        outcome.fail(f"a killed serving client left {scratch[0].name} or its journal")
    else:
        outcome.note(f"clean within {CLEAN_WITHIN:g} s")


def full_journal_attack(env: Env, outcome: Outcome) -> None:
    """Issue #29, defect 7: a run whose runtime directory is full stops in one line before
    it changes the host; nothing (no work directory) is left."""
    full = env.work / "full-runtime"
    full.mkdir(mode=0o700)
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8k,mode=0700", "vmtax-torture", str(full)],
        capture_output=True).returncode == 0
    if not mounted:
        outcome.note("skipped: cannot mount a tmpfs")
        return
    try:
        with contextlib.suppress(OSError), open(full / "filler", "wb") as filler:
            filler.write(b"x" * 65536)
        results = env.work / "full-results"
        outcome.cases += 1
        done = vmtax_with(env, full, "run", "--targets", "native", "--workloads", "cpu",
                          "--runs", "1", "--warmup", "0", "--time", "1", "--results",
                          str(results))
        one_line_refusal(outcome, "vmtax run with a full runtime directory", done,
                         "cannot write the undo journal")
        outcome.note(f"exit {done.returncode}")
        if list(results.glob(".work-*")):
            outcome.fail("a run with a full runtime directory left its work directory")
    finally:
        subprocess.run(["umount", "-l", str(full)], capture_output=True)


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


# -- attacks of issue #35 (items 2, 3, 4, 5, 10, 11): readers against a writer, Docker's ----
# -- limits, an LXD container that cannot start, serving killed on the bare host ------------

WRITER = """
import sys, time
from vmtax.core.types import Metric
from vmtax.results.store import Store
store = Store(sys.argv[1])
run_id = store.new_run({"targets": [{"name": "native", "kind": "native"}],
                        "workloads": [{"name": "cpu"}]}, {}, "0")
store.set_target(run_id, "native", "native", {"kind": "native", "bare_host": True})
print(run_id, flush=True)
deadline, i = time.monotonic() + float(sys.argv[2]), 0
while time.monotonic() < deadline:
    store.add_rep(run_id, target="native", workload="cpu", params={}, phase="measure", idx=i,
                  status="ok", argv=["x"], started=float(i),
                  metrics=[Metric(f"m{k}", float(k), "u", True) for k in range(3)])
    i += 1
store.finish_run(run_id, "done")
print(i, flush=True)
"""
READER = """
import json, sys, time
from vmtax.results.store import Store
loads, half = 0, 0
store = Store(sys.argv[1], readonly=True)
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    run = store.load_run("last")
    loads += 1
    half += sum(len(rep.metrics) != 3 for rep in run.reps)
print(json.dumps({"loads": loads, "half": half}))
"""


def readers_writer_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Issue #35, item 5: `show last` and `runs` while a run writes. Readers load the run
    being written over and over, each in one moment of the database: none may crash (a
    KeyError in load_run was), nor see a repetition without all its metrics."""
    results = env.work / "readers-writer"
    seconds = 6 if quick else 20
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(results), str(seconds)],
                              env=env.env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    env.started.append(writer)
    assert writer.stdout is not None
    writer.stdout.readline()          # its run is stored: readers find it as `last`
    readers = [subprocess.Popen([sys.executable, "-c", READER, str(results), str(seconds - 1)],
                                env=env.env, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE) for _ in range(4 if quick else 8)]
    commands = [env.start(*command, "--results", str(results))
                for command in (["show", "last"], ["runs"]) * (2 if quick else 10)]
    loads = 0
    for reader in readers:
        out, err = reader.communicate(timeout=120)
        outcome.cases += 1
        if reader.returncode != 0:
            outcome.fail(f"a reader crashed: {err.strip().splitlines()[-1][:200]}")
            continue
        seen = json.loads(out)
        loads += seen["loads"]
        if seen["half"]:
            outcome.fail(f"a reader saw {seen['half']} repetitions without all their metrics")
    for proc in commands:
        _, err = proc.communicate(timeout=300)
        outcome.cases += 1
        check_output(outcome, f"vmtax {proc.args[3]} while a run writes", err)
        if proc.returncode != 0:
            outcome.fail(f"vmtax {proc.args[3]} while a run writes: exit {proc.returncode}: "
                         f"{err.strip()[-200:]}")
    out, err = writer.communicate(timeout=120)
    if writer.returncode != 0:
        outcome.fail(f"the writer failed: {err.strip()[-200:]}")
    else:
        outcome.notes[f"{loads} loads of a run while {out.split()[-1]} repetitions were "
                      "written"] = 0


def docker_limits_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Issue #35, items 3 and 4: Docker limits Docker refuses (more CPUs than the host's, a
    memory limit below 6M) or rounds to no limit at all (cpu_limit = 0.0000001) are refused
    by `vmtax plan` in one line; and a limit it applies is the one the fingerprint records."""
    from vmtax.targets import docker

    cpus = len(os.sched_getaffinity(0))
    for key, value in (("cpu_limit", f"{cpus + 0.5}"), ("cpu_limit", "0.0000001"),
                       ("memory_limit", '"5M"')):
        plan = env.work / "docker-limit.toml"
        plan.write_text(f'[targets.d]\nkind = "container"\nruntime = "docker"\n{key} = {value}\n'
                        '[[workloads]]\nname = "cpu"\n')
        outcome.cases += 1
        done = env.run("plan", str(plan))
        if os.geteuid() != 0:
            outcome.note("not root: docker options are refused as such")
            return
        one_line_refusal(outcome, f"{key} = {value}", done, f"targets.d.{key}: expected")
    if quick or docker.Docker.unavailable() is not None:
        outcome.note("no limited Docker run (quick, or Docker unavailable)")
        return
    plan = env.work / "docker-limited.toml"
    plan.write_text('runs = 1\nwarmup = 0\ntime = 1\n[targets.d]\nkind = "container"\n'
                    'runtime = "docker"\ncpu_limit = 0.05\nmemory_limit = "64M"\n'
                    '[[workloads]]\nname = "cpu"\n')
    results = env.work / "docker-limited"
    done = env.run("run", str(plan), "--results", str(results))
    outcome.cases += 1
    check_output(outcome, "a Docker run with limits", done.stderr)
    try:
        with sqlite3.connect(results / "vmtax.sqlite") as db:
            (stored,), = db.execute("SELECT fingerprint FROM targets").fetchall()
        enforced = json.loads(stored)["limits"]["enforced"]
    except (sqlite3.Error, ValueError, KeyError) as exc:
        outcome.fail(f"a Docker run with limits: no limits stored ({exc}): "
                     f"{done.stderr.strip()[-200:]}")
        return
    if enforced != {"cpus": 0.05, "memory": 64 << 20}:
        outcome.fail(f"a Docker run with limits: the fingerprint says {enforced}")
    else:
        outcome.note("the limits the cgroups enforce are stored")


LXD_LOGS = Path("/var/log/lxd")


def lxd_left(runtime: Path) -> list[str]:
    """What of vmtax's is in LXD (by its directories, with or without a daemon), in LXD's
    log directory, and in runtime's journals."""
    found = [str(p) for d in (Path("/var/lib/lxd/containers"), Path("/var/lib/lxd/storage-pools"),
                              LXD_LOGS) for p in d.glob("vmtax-*")]
    return found + [str(p) for p in runtime.glob("journal-*")]


def lxd_start_failure_attack(env: Env, outcome: Outcome) -> None:
    """Issue #35, items 2 and 11: an LXD container that cannot start (memory = "1K") is
    reported in LXD's own words in one line and leaves nothing: no instance, profile or
    pool, no journal, no log directory; `cleanup` then finds nothing. A container that
    starts leaves no log directory either."""
    from vmtax.targets.lxd import LxdTarget

    if os.geteuid() != 0 or LxdTarget.unavailable() is not None:
        outcome.note("skipped: LXD unavailable, or not root")
        return
    before = lxd_left(env.runtime)
    if before:
        outcome.note(f"skipped: vmtax's objects in LXD before the attack ({before[0]})")
        return
    for memory in ("1K", "64M"):
        plan = env.work / "lxd.toml"
        plan.write_text(f'runs = 1\nwarmup = 0\ntime = 1\n[targets.l]\nkind = "lxd"\n'
                        f'memory = "{memory}"\n[[workloads]]\nname = "cpu"\n')
        done = env.run("run", str(plan), "--results", str(env.work / "lxd-r"))
        outcome.cases += 1
        name = f"lxd memory = {memory}"
        check_output(outcome, name, done.stderr)
        lines = done.stderr.strip().splitlines()
        if memory == "1K" and (done.returncode == 0 or len(lines) != 1
                               or "Starting instance" not in lines[0]):
            outcome.fail(f"{name}: exit {done.returncode}, not LXD's reason in one line: "
                         f"{done.stderr.strip()[-300:]}")
        elif memory != "1K" and done.returncode != 0:
            outcome.fail(f"{name}: exit {done.returncode}: {done.stderr.strip()[-300:]}")
        left = lxd_left(env.runtime)
        if left:
            outcome.fail(f"{name}: left {', '.join(left[:3])}")
        cleaned = env.run("cleanup")
        if cleaned.stdout.strip() != "nothing to clean up":
            outcome.fail(f"{name}: `vmtax cleanup` found {cleaned.stdout.strip()[-200:]}")
    outcome.note("nothing left in LXD")


def serving_kill_attack(env: Env, outcome: Outcome) -> None:
    """Issue #35, item 10: a native serving run killed with -9 once its httpd runs leaves
    nothing in /dev/shm (the server's scratch directory is journaled before it is made)."""
    shm = Path("/dev/shm")
    before = set(shm.glob("vmtax-*"))
    results = env.work / "serving-kill"
    proc = env.start("run", "--targets", "native", "--workloads", "serving", "--runs", "1",
                     "--warmup", "0", "--time", "2", "--results", str(results))
    outcome.cases += 1
    # The first serving run builds its tools (minutes); then httpd starts and makes its
    # directory (in one of vmtax's, or, as it did, in /dev/shm itself).
    deadline = time.monotonic() + 900
    while proc.poll() is None and time.monotonic() < deadline and not (
            set(shm.glob("vmtax-httpd-*")) | set(shm.glob("vmtax-*/vmtax-httpd-*"))) - before:
        time.sleep(0.1)
    if proc.poll() is not None:
        _, err = proc.communicate()
        outcome.fail(f"the serving run ended before its server started: {err.strip()[-200:]}")
        return
    made = set(shm.glob("vmtax-*")) - before
    proc.kill()
    proc.communicate()
    deadline = time.monotonic() + CLEAN_WITHIN
    while (left := [p for p in made if p.exists()] + list(env.runtime.glob("journal-*"))) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    if not made:
        outcome.fail("the server made no directory in /dev/shm")
    elif left:
        outcome.fail(f"serving killed -9 left {', '.join(map(str, left[:3]))}")
    else:
        outcome.note(f"clean within {CLEAN_WITHIN:g} s")


# -- the table -----------------------------------------------------------------------------

# -- attacks: a full results disk, hostile names, unbounded files, a bad fleet address, ------
# -- imported runs, a run's password (issue #29, defects 2, 4, 5, 6, 8, 10, 11) -------------

def in_process(*args: str) -> tuple[int, str, BaseException | None]:
    """A vmtax command run inside this process (no Python start-up): its exit code, its
    output and the exception it ended with, as `vmtax` would have printed it in one line."""
    from click.testing import CliRunner

    from vmtax.cli.main import cli

    done = CliRunner().invoke(cli, list(args), env=None, catch_exceptions=True)
    return done.exit_code, done.output, done.exception


def _kept_aside(outcome: Outcome, message: str) -> int:
    """The repetitions a store's message says it kept aside, checked against the files it
    names: the count said of each must be the count there."""
    said = {Path(m[2]): int(m[1]) for m in re.finditer(
        r"(\d+) (?:repetitions of run \S+ are kept )?in (\S+\.jsonl)", message)}
    for path, n in said.items():
        held = sum(json.loads(line).get("kind") == "rep"
                   for line in path.read_text().splitlines()) if path.exists() else 0
        if held != n:
            outcome.fail(f"a full results disk: the message says {n} in {path}, which "
                         f"holds {held}: {message}")
    outcome.note(f"{sum(said.values())} repetitions kept in {len(said)} side file(s)")
    return sum(said.values())


def _check_copied(outcome: Outcome, results: Path, run_id: str, total: int) -> None:
    """results copied before anything imported what was kept aside; then the copy, the
    original and the copy again opened by a writer (which imports): no repetition stored
    twice, none shown `done` with fewer than total, and all of them in one of the two."""
    from vmtax.results.store import Store

    copy = results.with_name(results.name + "-copy")
    shutil.copytree(results, copy)
    counts = {}
    for where in (copy, results, copy):
        outcome.cases += 1
        store = Store(where)
        run = store.load_run(run_id)
        store.close()
        keys = [(r.target, r.workload, json.dumps(r.params), r.phase, r.idx) for r in run.reps]
        if len(keys) != len(set(keys)):
            outcome.fail(f"{where.name}: {len(keys) - len(set(keys))} repetitions stored twice")
        if run.status == "done" and len(keys) != total:
            outcome.fail(f"{where.name}: shown done with {len(keys)} of {total} repetitions")
        counts[where] = len(keys)
        outcome.note(f"{where.name}: {run.status}, {len(keys)} repetitions")
    if total not in counts.values():
        outcome.fail(f"a full results disk: {total} repetitions, found {counts} in the copy "
                     "and the original")


@contextlib.contextmanager
def _tiny_tmpfs(path: Path):
    path.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=300k", "vmtax-torture", str(path)],
            capture_output=True).returncode != 0:
        yield False
        return
    try:
        yield True
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def full_results_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Defect 2: a results directory on a disk (a 300 KiB tmpfs) that fills mid-run, copied
    elsewhere before anything imported what was kept aside: the count said is true, no
    repetition is lost or stored twice, and no copy shows the run `done` with repetitions
    missing. Quick: through the store; else also a real run whose fileio fills the disk."""
    from vmtax.core.types import Metric
    from vmtax.results.store import Store, StoreError

    old_runtime = os.environ.get("VMTAX_RUNTIME")
    os.environ["VMTAX_RUNTIME"] = str(env.runtime)    # the store's runtime side file
    try:
        with _tiny_tmpfs(env.work / "full-results-disk") as mounted:
            if not mounted:
                outcome.note("skipped: cannot mount a tmpfs")
                return
            results = env.work / "full-results-disk"
            store = Store(results)
            run_id = store.new_run({"targets": []}, {}, "0")
            store.set_target(run_id, "native", "native", {"bare_host": True})
            for idx in range(6):
                if idx == 1:   # the disk fills up
                    with contextlib.suppress(OSError), open(results / "filler", "wb") as f:
                        while True:
                            f.write(b"x" * 4096)
                            f.flush()
                if idx == 4:   # room again: the run's records must not split now
                    (results / "filler").unlink()
                store.add_rep(run_id, target="native", workload="cpu", params={},
                              phase="measure", idx=idx, status="ok", argv=["x"], started=1.0,
                              stdout="x" * 2000,
                              metrics=[Metric("events/s", 1.0, "events/s", True)])
            store.finish_run(run_id, "done")
            outcome.cases += 1
            try:
                store.set_flags(run_id, [])    # what the runner does next
                outcome.fail("a full results disk: nothing was kept aside")
                return
            except StoreError as exc:
                _kept_aside(outcome, str(exc))
            store.close()
            _check_copied(outcome, results, run_id, 6)
        if quick:
            return
        with _tiny_tmpfs(env.work / "full-results-run") as mounted:
            results = env.work / "full-results-run"
            outcome.cases += 1
            done = env.run("run", "--targets", "native", "--workloads", "fileio,cpu",
                           "--runs", "3", "--warmup", "0", "--time", "1", "--results",
                           str(results))
            check_output(outcome, "a run on a full results disk", done.stderr)
            last = (done.stderr.strip().splitlines() or [""])[-1]
            found = re.search(r"repetitions of run (\S+) are kept", last)
            if done.returncode != 2 or not found:
                outcome.fail(f"a run on a full results disk: exit {done.returncode}: "
                             f"{last[-300:]}")
                return
            stored = len(stored_reps(results).get(found[1], []))
            _check_copied(outcome, results, found[1], stored + _kept_aside(outcome, last))
    finally:
        if old_runtime is None:
            os.environ.pop("VMTAX_RUNTIME", None)
        else:
            os.environ["VMTAX_RUNTIME"] = old_runtime


HOSTILE_NAMES = ['=HYPERLINK("http://evil.example/","click")', "+1+cmd|' /C calc'!A0",
                 "@SUM(1+1)*cmd|' /C calc'!A0", "-2+3", "\t=1+1", "\r=1+1"]
ESCAPES = ["\x1b]0;pwned\x07", "\x1b[2J\x1b[H", "a\x1b[8mhidden", "\x9b31m", "x\u202eyz"]


def _hostile_store(env: Env, name: str) -> Path:
    """A results directory holding one run whose targets have hostile names, stored as an
    older vmtax (or another tool) could have: straight through the store."""
    from vmtax.core.types import Metric
    from vmtax.results.store import Store

    results = env.work / name
    store = Store(results)
    names = ["native", HOSTILE_NAMES[0], *ESCAPES[:2]]
    run_id = store.new_run({"targets": [{"name": n, "kind": "native", "options": {}}
                                        for n in names], "baseline": "native",
                            "name": "hostile" + ESCAPES[0]}, {}, "0")
    for n in names:
        store.set_target(run_id, n, "native", {"bare_host": n == "native"})
        for idx in range(3):
            store.add_rep(run_id, target=n, workload="cpu", params={"p": HOSTILE_NAMES[2]},
                          phase="measure", idx=idx, status="ok", argv=["x"], started=1.0,
                          error=None, metrics=[Metric("events/s", -1.5 + idx, "events/s",
                                                      True)])
    store.finish_run(run_id, "done")
    store.close()
    return results


def csv_injection_attack(env: Env, outcome: Outcome) -> None:
    """Defect 4: names a spreadsheet would run as formulas, exported as CSV."""
    import csv
    import io

    results = _hostile_store(env, "csv-injection")
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


def terminal_escape_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Defect 5: control characters in names are refused where names come in, and shown
    escaped where they were stored before (runs, show, compare, export's error lines)."""
    from vmtax.core.errors import VmtaxError
    from vmtax.studies import plan, planfile

    for escape in ESCAPES:
        toml = f'[targets.native]\n[targets."{json.dumps(escape)[1:-1]}"]\nkind = "native"\n' \
               '[[workloads]]\nname = "cpu"\n'
        for what, refuse, args in (
                ("a plan's target name", planfile.loads, (toml, "hostile.toml")),
                ("--qemu LABEL=PATH", plan.from_names, (
                    ["vm"], ["cpu"], {"qemu": [f"{escape}=/bin/true", "b=/bin/true"]})),
                ("--targets", plan.from_names, ([f"native{escape}"], ["cpu"])),
                ("--name", in_process, ("run", "--targets", "native", "--workloads", "cpu",
                                        "--name", escape, "--dry-run")),
                ("--label", in_process, ("exits", "import", "/dev/null", "--label",
                                         escape))):
            outcome.cases += 1
            try:
                result = refuse(*args)
            except VmtaxError as exc:
                result = (2, "", exc)
            if not isinstance(result, tuple) or not isinstance(result[2], VmtaxError):
                outcome.fail(f"{what} with {escape!r}: not refused")
            elif not str(result[2]).isprintable():
                outcome.fail(f"{what} with {escape!r}: the refusal holds it raw")
    results = _hostile_store(env, "terminal-escapes")
    commands = [["runs"], ["show", "last", "--all"]]
    if not quick:   # compare loads SciPy: seconds
        commands += [["show", "last"], ["show", "last:nope"],
                     ["compare", "last:native", "last:" + ESCAPES[0]]]
    for command in commands:
        outcome.cases += 1
        code, output, exc = in_process(*command, "--results", str(results))
        shown = output + (str(exc) if exc and not isinstance(exc, SystemExit) else "")
        raw = [c for c in shown if not (c.isprintable() or c == "\n")]
        if raw:
            outcome.fail(f"vmtax {' '.join(command)}: control characters reach the terminal: "
                         f"{raw[:5]!r}")
        outcome.note(f"exit {code}")


def unbounded_read_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Defect 6: a device, a FIFO and a huge file given as a perf report or a plan: one
    line each, at once, never a hang or a traceback."""
    fifo = env.work / "fifo"
    os.mkfifo(fifo)
    huge = env.work / "huge.txt"
    with open(huge, "wb") as f:
        f.truncate(64 << 20)     # sparse: no disk used
    cases = [("exits", "import", "/dev/zero", "--label", "x"),
             ("exits", "import", str(fifo), "--label", "x")]
    if not quick:
        cases += [("exits", "import", str(huge), "--label", "x"), ("plan", "/dev/zero"),
                  ("plan", str(fifo)), ("run", str(fifo), "--dry-run"),
                  ("density", str(fifo))]
    for args in cases:
        outcome.cases += 1
        started = time.monotonic()
        try:
            done = env.run(*args, "--results", str(env.work / "unbounded-r"), timeout=30) \
                if args[0] == "exits" else env.run(*args, timeout=30)
        except subprocess.TimeoutExpired:
            outcome.fail(f"vmtax {' '.join(args)}: still reading after 30 s")
            continue
        check_output(outcome, f"vmtax {' '.join(args)}", done.stderr)
        lines = done.stderr.strip().splitlines()
        if done.returncode != 2 or len(lines) != 1:
            outcome.fail(f"vmtax {' '.join(args)}: exit {done.returncode}: "
                         f"{done.stderr.strip()[-200:]}")
        outcome.note(f"{time.monotonic() - started:.0f} s each")


def fleet_address_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Defect 8: `fleet join` at an address that cannot be, or where nothing listens,
    fails in one line within 15 s. Only loopback is ever connected to."""
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]   # bound, never listening: refused
        addresses = ["999.1.1.1:1"] + ([] if quick else [
            f"127.0.0.1:{port}", "127.0.0.1:99999", "127.0.0.1", "[::1:1", "a b:1"])
        for address in addresses:
            outcome.cases += 1
            started = time.monotonic()
            try:
                done = env.run("fleet", "join", address, "--name", "h1", "--results",
                               str(env.work / "fleet-r"), timeout=30)
            except subprocess.TimeoutExpired:
                outcome.fail(f"fleet join {address}: silent for 30 s")
                continue
            took = time.monotonic() - started
            check_output(outcome, f"fleet join {address}", done.stderr)
            lines = done.stderr.strip().splitlines()
            if done.returncode != 2 or len(lines) != 1 or took > 15:
                outcome.fail(f"fleet join {address}: exit {done.returncode} after {took:.0f} "
                             f"s: {done.stderr.strip()[-200:]}")
            outcome.note(f"{took:.0f} s")


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


def password_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Defect 11: a workload's secret (oltp's per-run MariaDB password) is in no command
    line and never stored. Quick: the jobs of client-server workloads and the store; else
    every workload's jobs and a real oltp run natively, every command line read while it
    runs."""
    from vmtax.core import workload as workloads
    from vmtax.core.types import Endpoint
    from vmtax.results.store import Store

    for name, cls in sorted(workloads.registered().items()):
        if quick and cls.server_port is None:
            continue    # a server's credentials are what a run makes; some prepares take s
        try:
            workload = cls.make({}, 2, strict=False)
            jobs = [*workload.prepare_jobs(), workload.run_job()]
        except Exception:   # noqa: BLE001 - a two-role workload has no run_job
            jobs = [*workload.prepare_jobs()]
        if cls.server_port is not None:
            jobs += [workload.server_job(), workload.client_job(Endpoint("127.0.0.1", 1))]
        for job in jobs:
            outcome.cases += 1
            for secret in job.secrets:
                if any(secret in arg for arg in job.argv):
                    outcome.fail(f"{name}: a secret in a command line: {job.argv[:3]}")
            if job.secrets:
                results = env.work / f"secret-{name}"
                store = Store(results)
                run_id = store.new_run({}, {}, "0")
                store.add_rep(run_id, target="native", workload=name, params={},
                              phase="measure", idx=0, status="failed", argv=[*job.argv,
                              *job.secrets], started=1.0, error=f"x {job.secrets[0]}",
                              stdout=job.secrets[0], stderr=job.secrets[0],
                              secrets=job.secrets)
                store.close()
                if job.secrets[0].encode() in (results / "vmtax.sqlite").read_bytes():
                    outcome.fail(f"{name}: a secret stored in the results database")
                outcome.note(f"{name}: secrets declared")
    if quick or not all(shutil.which(b) for b in ("mariadbd", "sysbench", "busybox")):
        return
    outcome.cases += 1
    results = env.work / "oltp-r"
    proc = env.start("run", "--targets", "native", "--workloads", "oltp", "--runs", "1",
                     "--warmup", "0", "--time", "1", "--results", str(results))
    seen_cmdlines, passwords = set(), set()
    while proc.poll() is None:
        for pid, (_, _, cmd) in processes().items():
            seen_cmdlines.add(cmd)
            with contextlib.suppress(OSError):
                for var in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    if var.startswith(b"VMTAX_DB_PASSWORD="):
                        passwords.add(var.split(b"=", 1)[1].decode())
        time.sleep(0.05)
    proc.communicate()
    data = (results / "vmtax.sqlite").read_bytes() if (results / "vmtax.sqlite").exists() \
        else b""
    for password in passwords:
        if any(password in cmd for cmd in seen_cmdlines):
            outcome.fail("oltp: the password was in a command line during the run")
        if password.encode() in data:
            outcome.fail("oltp: the password is stored in the results database")
    outcome.note(f"oltp run: {len(passwords)} password(s) seen in environments only")


# -- attacks: paths out of their tree, huge numbers, deep TOML, one name spelt twice, ------
# -- escapes from profiled symbols and in CSV (issue #35, items 1, 6, 7, 8, 9, 12) ---------

def _files(root: Path) -> set[str]:
    """Every file, directory and link below root, as paths relative to it."""
    found = set()
    for top, dirs, files in os.walk(root):
        found.update(os.path.relpath(os.path.join(top, n), root) for n in dirs + files)
    return found


def _path_options() -> dict[tuple[str, ...], str]:
    """(command words..., option or argument) -> how it shows in --help, for every
    option and argument of every vmtax command that names a file or directory."""
    import click

    from vmtax.cli.main import cli

    found: dict[tuple[str, ...], str] = {}

    def walk(command: click.Command, words: tuple[str, ...], ctx: click.Context) -> None:
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None:
                    walk(sub, (*words, name), click.Context(sub, parent=ctx))
            return
        for param in command.params:
            names = param.metavar or ""
            if isinstance(param.type, click.Path) or any(w in names for w in ("FILE", "DIR",
                                                                              "PLAN")):
                found[(*words, param.opts[0] if param.opts else param.name or "")] = names
    walk(cli, (), click.Context(cli))
    return found


def _path_typed_options() -> list[tuple[str, str, bool]]:
    """(target kind, option, takes a list) of every target option that names a host file
    or program (vmtax.core.option_types: Program(s), ExistingFile, GuestKernel, LocalPath)."""
    import typing

    from vmtax.core import option_types, plugin
    from vmtax.core import target as targets

    def expects(annotation: Any) -> set[str]:
        if typing.get_origin(annotation) is typing.Annotated:
            inner, *meta = typing.get_args(annotation)
            return {m.text for m in meta if isinstance(m, plugin.Expect)} | expects(inner)
        return {t for a in typing.get_args(annotation) for t in expects(a)}
    texts = set().union(*(expects(t) for t in (
        option_types.Program, option_types.Programs, option_types.ExistingFile,
        option_types.GuestKernel, option_types.LocalPath)))
    return [(kind, key, info.takes_list) for kind in targets.kinds()
            for key, info in plugin.option_infos(targets.get(kind).Options).items()
            if info.expected() in texts]


@contextlib.contextmanager
def _in_directory(path: Path):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def _traversal_store(results: Path) -> None:
    """A run of two native targets, for report and export to read."""
    from vmtax.core.types import Metric
    from vmtax.results.store import Store

    store = Store(results)
    run_id = store.new_run({"targets": [{"name": n, "kind": "native", "options": {}}
                                        for n in ("native", "other")], "baseline": "native",
                            "workloads": [{"name": "cpu"}], "name": "t"}, {}, "0")
    for name in ("native", "other"):
        store.set_target(run_id, name, "native", {"bare_host": name == "native"})
        for idx in range(3):
            store.add_rep(run_id, target=name, workload="cpu", params={}, phase="measure",
                          idx=idx, status="ok", argv=["x"], started=1.0,
                          metrics=[Metric("events/s", 100.0 + idx, "events/s", True)])
    store.finish_run(run_id, "done")
    store.close()


def path_traversal_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Item 1: every option that names a path, given as "../../../NAME" from three levels
    down. A program, kernel or key a plan names is kept by its absolute path; a rootfs and
    an ssh bundle built with such a program hold it inside themselves; and every command
    whose options name files reads and writes where they say and nowhere else (its whole
    sandbox is compared before and after). Not quick: the issue's container run, whose copy
    once landed outside every tree of vmtax's."""
    from vmtax.core import plugin
    from vmtax.core import target as targets
    from vmtax.core.errors import VmtaxError
    from vmtax.guest import remote_bundle, rootfs

    base = env.work / "traversal"
    cwd = base / "d" / "a" / "b"
    cwd.mkdir(parents=True)
    (base / "x").mkdir()
    program = base / "x" / "h"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    up = "../../../"
    (base / "p.toml").write_text('[targets.native]\n[[workloads]]\nname = "cpu"\n')
    (base / "t.toml").write_text('[targets.vm]\naccel = "tcg"\n[[workloads]]\nname = "cpu"\n'
                                 '[tune]\nbaseline = "vm"\n')
    (base / "out").mkdir()   # a directory of the user's, named from elsewhere
    _profiled_store(base / "r-profile", "f")
    (base / "bad-density.toml").write_text("maxx = 1\n")
    shutil.copy(ROOT / "tests" / "fixtures" / "perf_kvm" / "classic-vmx.txt", base / "rep.txt")
    _traversal_store(base / "r")
    cache = base / "cache"

    # A target option that names a file or program: kept absolute, whatever kind.
    for kind, key, takes_list in _path_typed_options():
        outcome.cases += 1
        given = [up + "x/h"] if takes_list else up + "x/h"
        try:
            with _in_directory(cwd):
                kept = plugin.option_infos(targets.get(kind).Options)[key].check(given)
        except plugin.Invalid as exc:
            outcome.fail(f"{kind}.{key} = {given!r}: refused: {exc}")
            continue
        if kept != ([str(program)] if takes_list else str(program)):
            outcome.fail(f"{kind}.{key} = {given!r}: kept as {kept!r}, not {program}")
    # What is built with such a program keeps it inside.
    outcome.cases += 2
    before = _files(base)
    with _in_directory(cwd):
        tree = rootfs.build([up + "x/h"], cache)
        if not (tree / str(program).lstrip("/")).is_file():
            outcome.fail(f"rootfs of {up}x/h: the program is not at {program} inside it")
        try:
            bundle = remote_bundle.make([up + "x/h"])
            outcome.fail(f"ssh bundle of {up}x/h: made, as {sorted(bundle.files)}")
        except VmtaxError:
            outcome.note("a relative program out of an ssh bundle refused")
    strays = [p for p in _files(base) - before if not p.startswith("cache")]
    if strays:
        outcome.fail(f"a rootfs build wrote outside its cache: {strays[:3]}")

    # Every command's path options, as "../../../" from cwd: (args, created files allowed).
    out = up + "out/"
    cases: dict[tuple[str, ...], tuple[list[str], tuple[str, ...]]] = {
        ("run", "plan_file"): (["run", up + "p.toml", "--dry-run"], ()),
        ("run", "--results"): (["run", "--targets", "native", "--workloads", "cpu",
                                "--results", up + "r", "--dry-run"], ()),
        ("show", "--results"): (["show", "last", "--results", up + "r"], ()),
        ("runs", "--results"): (["runs", "--results", up + "r"], ()),
        ("compare", "--results"): (["compare", "last:native", "last:other", "--results",
                                    up + "r"], ()),
        ("compare", "--junit"): (["compare", "last:native", "last:other", "--junit",
                                  out + "v.xml", "--results", up + "r"], ("out",)),
        ("composite", "--results"): (["composite", "last", "--results", up + "r"], ()),
        ("plan", "plan_file"): (["plan", up + "p.toml"], ()),
        ("tune", "plan_file"): (["tune", up + "t.toml", "--dry-run"], ()),
        ("tune", "--results"): (["tune", "--targets", "vm", "--workloads", "cpu",
                                 "--dry-run", "--results", up + "r"], ()),
        ("density", "args"): (["density", up + "bad-density.toml"], ()),
        ("density", "--results"): (["density", "show", "last", "--results", up + "r"], ()),
        ("boot", "--results"): (["boot", "--target", "nope", "--results", up + "r"], ()),
        ("exits", "import", "file"): (["exits", "import", up + "rep.txt", "--label", "cap",
                                       "--results", up + "exits-r"], ("exits-r",)),
        ("exits", "import", "--results"): (["exits", "import", up + "rep.txt", "--label",
                                            "cap2", "--results", up + "exits-r"], ("exits-r",)),
        ("exits", "show", "--results"): (["exits", "show", "cap", "--results", up + "exits-r"],
                                         ()),
        ("exits", "diff", "--results"): (["exits", "diff", "cap", "cap2", "--results",
                                          up + "exits-r"], ()),
        ("profile", "show", "--results"): (["profile", "show", "last", "--results",
                                            up + "r-profile"], ("r-profile",)),
        ("profile", "diff", "--results"): (["profile", "diff", "last:native", "last:vm:tcg",
                                            "--results", up + "r-profile"], ("r-profile",)),
        ("report", "--html"): (["report", "last", "--html", out + "r.html", "--png",
                                out + "png", "--svg", out + "svg", "--results", up + "r"],
                               ("out",)),
        ("export", "--csv"): (["export", "last", "--csv", out + "x.csv", "--json",
                               out + "x.json", "--jsonl", out + "x.jsonl", "--benchstat",
                               out + "x.txt", "--markdown", out + "x.md", "--results", up + "r"],
                              ("out",)),
        ("fleet", "join", "--results"): (["fleet", "join", "999.1.1.1:1", "--name", "h1",
                                          "--results", up + "fleet-r", "--ray-temp-dir",
                                          up + "ray"], ("fleet-r",)),
        ("fleet", "show", "--results"): (["fleet", "show", "last", "--results", up + "r"], ()),
        ("trend", "--html"): (["trend", "t", "--html", out + "t.html", "--results", up + "r"],
                              ("out",)),
        ("publish", "names"): (["publish", "t", out + "site", "--results", up + "r"], ("out",)),
        # Refused for its size before a lab boots: where its --results would be, is checked.
        ("lab", "--results"): (["lab", "--results", up + "lab-r", "--memory", "999G", "run",
                                "--targets", "native", "--workloads", "cpu"], ("lab-r",)),
    }
    covers = {("report", "--png"): ("report", "--html"), ("report", "--svg"): ("report", "--html"),
              ("report", "--results"): ("report", "--html"),
              ("export", "--json"): ("export", "--csv"), ("export", "--jsonl"): ("export", "--csv"),
              ("export", "--benchstat"): ("export", "--csv"),
              ("export", "--markdown"): ("export", "--csv"),
              ("export", "--results"): ("export", "--csv"),
              ("fleet", "join", "--ray-temp-dir"): ("fleet", "join", "--results"),
              ("trend", "--results"): ("trend", "--html"),
              ("publish", "--results"): ("publish", "names")}
    for option in _path_options():
        if option not in cases and option not in covers and option != ("fleet", "start",
                                                                       "--ray-temp-dir"):
            outcome.fail(f"vmtax {' '.join(option)}: no path traversal case attacks it")
    for option, (args, allowed) in cases.items():
        if quick and option[0] not in ("run", "report", "export", "exits"):
            continue
        outcome.cases += 1
        before = _files(base)
        done = subprocess.run([*VMTAX, *args], cwd=cwd, text=True, capture_output=True,
                              timeout=300, env={**env.env, "VMTAX_CACHE": str(cache)})
        what = f"vmtax {' '.join(args)}"
        check_output(outcome, what, done.stderr)
        lines = done.stderr.strip().splitlines()
        if done.returncode not in (0, 2) or done.returncode == 2 and len(lines) != 1:
            outcome.fail(f"{what}: exit {done.returncode}: {done.stderr.strip()[-200:]}")
        strays = [p for p in _files(base) - before
                  if not p.startswith(("cache", "r" + os.sep, *allowed))]
        if strays:
            outcome.fail(f"{what}: wrote outside what it names: {strays[:3]}")
        outcome.note(f"exit {done.returncode}")
    for name in ("out/r.html", "out/x.csv", "out/x.json", "out/x.jsonl", "out/x.txt",
                 "out/t.html", "out/site/index.html"):
        if not (base / name).is_file() and not quick:
            outcome.fail(f"{name}: not written where its option named it")
    # fleet start would start Ray's head: its --ray-temp-dir is checked where it is made.
    from vmtax.studies import fleet_ray
    outcome.cases += 1
    with _in_directory(cwd):
        argv = fleet_ray.head_argv(1, up + "ray")
    if argv[argv.index("--temp-dir") + 1] != str(base / "ray"):
        outcome.fail(f"fleet start --ray-temp-dir {up}ray: Ray is given {argv[-1]}")
    if quick:
        return
    # The issue's reproduction: a container whose plan names ../../../x/h.
    outcome.cases += 1
    (cwd / "plan.toml").write_text(f'[targets.c]\nkind = "container"\nruntime = "runc"\n'
                                   f'binaries = ["{up}x/h"]\n[[workloads]]\nname = "cpu"\n')
    before = _files(base)
    done = subprocess.run([*VMTAX, "run", "plan.toml", "--runs", "1", "--warmup", "0",
                           "--time", "1", "--results", str(base / "r")], cwd=cwd, text=True,
                          capture_output=True, timeout=600,
                          env={**env.env, "VMTAX_CACHE": str(cache)})
    check_output(outcome, "the issue's container run", done.stderr)
    strays = [p for p in _files(base) - before
              if not p.startswith(("cache", "r" + os.sep, os.path.join("d", "a", "b")))]
    if done.returncode not in (0, 2) or strays:
        outcome.fail(f"the issue's container run: exit {done.returncode}, outside its "
                     f"trees: {strays[:3]}: {done.stderr.strip()[-200:]}")


HUGE = "9" * 400


def huge_number_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Item 8: durations and counts far past what anything can wait or count, on the
    command line and in plan keys: one line each, never an overflow's traceback, and
    nothing started."""
    plan = env.work / "huge.toml"
    cases = [["tune", "--targets", "vm", "--workloads", "cpu", "--budget", f"{HUGE}h",
              "--dry-run"],
             ["run", "--targets", "native", "--workloads", "cpu", "--time", "99999999999"],
             ["run", "--targets", "native", "--workloads", "cpu", "--runs", HUGE],
             ["run", "--targets", "native", "--workloads", "cpu", "--warmup", "1e400"],
             ["boot", "--target", "vm:tcg", "--count", HUGE],
             ["density", "--max", HUGE], ["profile", "last", "--top", HUGE],
             ["exits", "import", str(ROOT / "tests/fixtures/perf_kvm/classic-vmx.txt"),
              "--label", "x", "--seconds", "inf"],
             ["run", str(plan)], ["tune", str(plan), "--dry-run"]]
    workload = '[targets.native]\n[[workloads]]\nname = "cpu"\n'
    plans = [f"time = 99999999999\n{workload}", f"runs = 99999999999\n{workload}",
             f"timeout = 1e300\n{workload}", f"max_runs = {HUGE[:18]}\n{workload}",
             workload + "params = { cpu-max-prime = 999999999999 }\n",
             f'{workload}[tune]\nbudget = "{HUGE}h"\n']
    if quick:
        cases, plans = cases[:3] + cases[-2:], plans[:2]
    for i, text in enumerate(plans):
        plan.write_text(text)
        for args in cases:
            if str(plan) not in args and i or "budget" in text and args[0] != "tune":
                continue
            outcome.cases += 1
            started = time.monotonic()
            what = f"vmtax {' '.join(args)[:80]}" + (f" ({text.splitlines()[-1]})"
                                                     if str(plan) in args else "")
            try:
                done = env.run(*args, "--results", str(env.work / "huge-r"), timeout=60)
            except subprocess.TimeoutExpired:
                outcome.fail(f"{what}: still running after 60 s")
                continue
            one_line_refusal(outcome, what, done, "--runs" if "--runs" in args else
                             "expected")
            outcome.note(f"{time.monotonic() - started:.0f} s")


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


def _profiled_store(results: Path, symbol: str) -> None:
    """A run of two cells profiled as the profile collector stores them, whose hottest
    function is symbol."""
    from vmtax.core.types import Metric
    from vmtax.results.store import Store

    store = Store(results)
    run_id = store.new_run({"name": "evil"}, {}, "0")
    for target, own in (("native", 60), ("vm:tcg", 90)):
        for idx in range(3):
            store.add_rep(run_id, target=target, workload="cpu", params={}, phase="measure",
                          idx=idx, status="ok", argv=["sysbench"], started=0.0,
                          host_elapsed=2.0, metrics=[Metric("events/s", 100.0, "events/s",
                                                            True)])
        store.set_target(run_id, target, target.partition(":")[0], {})
        metrics = [Metric("class samples", 100, "samples", False, {"class": "sysbench"})]
        for leaf, n in ((symbol, own), ("x", 100 - own)):
            metrics += [Metric("stack samples", n, "samples", False,
                               {"class": "sysbench", "stack": f"sysbench;main;{leaf}"}),
                        Metric("function samples", n, "samples", False,
                               {"class": "sysbench", "function": leaf, "dso": "sysbench"})]
        metrics += [Metric("sampled cpu", 1.0, "s", False), Metric("unresolved share", 0.0,
                                                                     "%", False),
                    Metric("profile overhead", 1.5, "%", False)]
        store.add_rep(run_id, target=target, workload="cpu", params={}, phase="collect",
                      idx=0, status="ok", argv=["profile"], started=0.0, metrics=metrics)
    store.finish_run(run_id, "done")
    store.close()


def _evil_sysbench(directory: Path) -> Path | None:
    """A `sysbench` whose hottest function is named `evil ESC ]0;PW BEL` (gas takes a
    quoted symbol), that spins 1.5 s in it and then runs the host's sysbench."""
    if not (shutil.which("gcc") and shutil.which("sysbench")):
        return None
    source = directory / "evil.c"
    source.write_text(
        "#include <time.h>\n#include <unistd.h>\nvolatile unsigned long sink;\n"
        "__attribute__((noinline)) void spin(void) __asm__(\"EVILSYMBOL\");\n"
        "void spin(void) { struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a);\n"
        "  do { for (int i = 0; i < 100000; i++) sink += i;\n"
        "       clock_gettime(CLOCK_MONOTONIC, &b); }\n"
        "  while ((b.tv_sec - a.tv_sec) * 1000000000L + b.tv_nsec - a.tv_nsec < 1500000000L); }\n"
        f'int main(int c, char **v) {{ spin(); v[0] = "{shutil.which("sysbench")}";\n'
        "  execv(v[0], v); return 1; }\n")
    assembly = directory / "evil.s"
    if subprocess.run(["gcc", "-O1", "-S", "-o", str(assembly), str(source)],
                      capture_output=True).returncode != 0:
        return None
    assembly.write_text(assembly.read_text().replace("EVILSYMBOL", '"evil\x1b]0;PW\x07"'))
    binary = directory / "sysbench"
    if subprocess.run(["gcc", "-o", str(binary), str(assembly)],
                      capture_output=True).returncode != 0:
        return None
    return binary


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if not (c.isprintable() or c == "\n")]


def outside_strings_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Items 6 and 7: a profiled symbol holding an OSC sequence, shown by `vmtax profile`
    and `profile diff`; an imported perf report whose reason holds one, and a --qemu
    wrapper whose --version prints one, exported as CSV to stdout. Nothing reaches the
    terminal or a cell raw. Not quick: the symbol comes from a real binary first on PATH
    as sysbench, profiled by a real run."""
    results = env.work / "evil-profile"
    _profiled_store(results, "evil\x1b]0:PW\x07")
    commands = [["profile", "last:native"], ["profile", "diff", "last:native", "last:vm:tcg"]]
    for command in commands:
        outcome.cases += 1
        code, output, exc = in_process(*command, "--results", str(results))
        if code != 0 or _raw_controls(output):
            outcome.fail(f"vmtax {' '.join(command)}: exit {code}, raw: "
                         f"{_raw_controls(output)[:4]!r} {exc}")
    report = env.work / "evil-report.txt"
    report.write_text((ROOT / "tests/fixtures/perf_kvm/classic-vmx.txt").read_text()
                      .replace("HLT", "\x1b]0;PWN\x07\x1b[31mHLT", 1))
    exits_results = str(env.work / "evil-exits")
    in_process("exits", "import", str(report), "--label", "cap", "--results", exits_results)
    outcome.cases += 1
    code, output, exc = in_process("export", "cap", "--csv", "-", "--results", exits_results)
    if code != 0 or _raw_controls(output) or "\\x1b]0;PWN\\x07" not in output:
        outcome.fail(f"export --csv - of a hostile perf report: exit {code}, raw: "
                     f"{_raw_controls(output)[:4]!r} {exc}")
    if quick:
        return
    wrapper = env.work / "evil-qemu"
    wrapper.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then printf 'QEMU emulator "
                       "version 8.2.0\\033]0;PWN\\007\\033[31m\\n'; exit 0; fi\n"
                       "exec qemu-system-x86_64 \"$@\"\n")
    wrapper.chmod(0o755)
    qemu_results = env.work / "evil-qemu-r"
    outcome.cases += 1
    done = env.run("run", "--targets", "vm:tcg", "--workloads", "cpu", "--qemu", str(wrapper),
                   "--runs", "1", "--warmup", "0", "--time", "1", "--results",
                   str(qemu_results))
    check_output(outcome, "a run with a --qemu wrapper printing escapes", done.stderr)
    for fmt in ("csv", "benchstat"):
        code, output, exc = in_process("export", "last", f"--{fmt}", "-", "--results",
                                       str(qemu_results))
        if code != 0 or _raw_controls(output):
            outcome.fail(f"export --{fmt} - of a run with an escaping --qemu: exit {code}, "
                         f"raw: {_raw_controls(output)[:4]!r} {exc}")
        outcome.note(f"{fmt}: {len(output.splitlines())} lines")
    evil_bin = env.work / "evil-bin"
    evil_bin.mkdir()
    if _evil_sysbench(evil_bin) is None or not shutil.which("perf"):
        outcome.note("no gcc, sysbench or perf: no live profile")
        return
    outcome.cases += 1
    live = env.work / "evil-live"
    done = subprocess.run([*VMTAX, "run", "--targets", "native", "--workloads", "cpu",
                           "--collect", "profile", "--runs", "1", "--warmup", "0", "--time",
                           "2", "--results", str(live)], text=True, capture_output=True,
                          timeout=600, env={**env.env, "PATH": f"{evil_bin}:{os.environ['PATH']}"})
    check_output(outcome, "a profiled run of an evil sysbench", done.stderr)
    for command in commands[:1]:
        code, output, exc = in_process(*command, "--results", str(live))
        if code != 0 or _raw_controls(output) or "evil\\x1b" not in output:
            outcome.fail(f"vmtax {' '.join(command)} of a live evil profile: exit {code}, "
                         f"raw: {_raw_controls(output)[:4]!r} {exc}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--quick", action="store_true",
                        help="small counts and two kills (what `make test` runs)")
    args = parser.parse_args()
    quick = args.quick
    rng = random.Random(args.seed)
    outcomes: list[Outcome] = []

    def attack(name: str, body: Callable[[Outcome], None]) -> None:
        outcome = Outcome(name)
        started = time.monotonic()
        try:
            body(outcome)
        except Exception as exc:   # noqa: BLE001 - a broken attack is a finding too
            outcome.fail(f"the attack itself failed: {type(exc).__name__}: {exc}")
        finally:
            env.stop_all()
        outcome.notes[f"{time.monotonic() - started:.0f} s"] = 0
        outcomes.append(outcome)

    with tempfile.TemporaryDirectory(prefix="vmtax-torture-") as tmp:
        env = Env(Path(tmp), rng.randrange(2**32))
        moments = ["starting", "preparing", "measuring"]
        if quick:
            kills = [(KILL_TARGETS[0], signal.SIGINT, env.rng.choice(moments)),
                     (KILL_TARGETS[1], signal.SIGKILL, "measuring")]
        else:
            kills = [(t, s, m) for t in KILL_TARGETS for s in (signal.SIGKILL, signal.SIGINT)
                     for m in moments]
        for i, ((target, workload), sig, moment) in enumerate(kills):
            label = target if not target.startswith("[") else "vm:tcg huge pages"
            label += "" if workload == "cpu" else f" {workload}"
            attack(f"{signal.Signals(sig).name} {label} while {moment}",
                   lambda o, t=target, w=workload, s=sig, m=moment, i=i:
                   kill_attack(env, o, t, w, s, m, i))
        attack("concurrent runs and resumes",
               lambda o: concurrency_attack(env, o, 1 if quick else 3, not quick))
        attack("fuzzed plan files",
               lambda o: plan_attack(env, o, 100 if quick else 1200, 1 if quick else 30))
        attack("fuzzed parser outputs",
               lambda o: parser_attack(env, o, 50 if quick else 1000))
        attack("corrupt databases", lambda o: store_attack(env, o, 2 if quick else 18))
        attack("database deleted mid-run", lambda o: deleted_store_attack(env, o))
        attack("planted runtime directory and journal entries",
               lambda o: planted_attack(env, o, quick))
        attack("serving client killed", lambda o: serving_client_attack(env, o))
        attack("full runtime directory", lambda o: full_journal_attack(env, o))
        attack("guardian stopped or killed", lambda o: guardian_attack(env, o, quick))
        attack("readers against a writer", lambda o: readers_writer_attack(env, o, quick))
        attack("Docker limits Docker refuses or ignores",
               lambda o: docker_limits_attack(env, o, quick))
        attack("an LXD container that cannot start", lambda o: lxd_start_failure_attack(env, o))
        attack("serving killed -9 on the bare host", lambda o: serving_kill_attack(env, o))
        attack("full results disk, directory copied",
               lambda o: full_results_attack(env, o, quick))
        attack("formulas in CSV cells", lambda o: csv_injection_attack(env, o))
        attack("terminal escapes in names", lambda o: terminal_escape_attack(env, o, quick))
        attack("devices, FIFOs and huge files as input",
               lambda o: unbounded_read_attack(env, o, quick))
        attack("fleet join at a bad address", lambda o: fleet_address_attack(env, o, quick))
        attack("report and export of an imported run", lambda o: imported_run_attack(env, o))
        attack("a workload's password", lambda o: password_attack(env, o, quick))
        attack("paths out of their tree (#35)",
               lambda o: path_traversal_attack(env, o, quick))
        attack("huge durations and counts (#35)", lambda o: huge_number_attack(env, o, quick))
        attack("deeply nested TOML (#35)", lambda o: deep_toml_attack(env, o, quick))
        attack("one name spelt twice (#35)", lambda o: one_name_twice_attack(env, o))
        attack("escapes from profiles, reports, wrappers (#35)",
               lambda o: outside_strings_attack(env, o, quick))

    table = Table(title=f"vmtax torture (seed {args.seed}{', quick' if quick else ''})")
    for column in ("attack", "cases", "outcomes", "problems"):
        table.add_column(column)
    for o in outcomes:
        notes = ", ".join(f"{k}: {v}" if v else k for k, v in o.notes.items())
        table.add_row(o.attack, str(o.cases), notes,
                      "[red]" + "\n".join(o.problems[:5]) + "[/red]" if o.problems else "0")
    console = Console(width=160)
    console.print(table)
    failed = sum(len(o.problems) for o in outcomes)
    console.print(f"{failed} problems" if failed else "no traceback, leak, lost repetition "
                  "or side effect")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
