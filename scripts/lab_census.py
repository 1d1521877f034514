"""`make lab-census`: the lab's nested faults counted, one configuration at a time (issue 49).

Each lab of the census is one `vmtax lab` (vmtax.studies.lab) running one short plan: two
KVM guests (L2), each booted and measured by cpu and iperf3 for a second. What went wrong
is counted by kind:

  L2 boot stall   an L2's kernel reported an RCU stall while it booted (vmtax boots it again)
  L2 lost         an L2's QEMU exited, or no READY came, while it booted
  L2 setup lost   an L2's setup after READY (its disk, its network) got no answer
  workload hang   a measured repetition timed out
  L1 panic        the lab's own kernel panicked
  L1 hang         the lab stopped: no heartbeat and no output for --hang-timeout
  L1 boot hang    the lab's vmtax did not start within the boot timeout

A lab ends at its first L1 fault (no new lab is booted for it: --restarts 0), so each lab
stays short. Beside each lab its host's load is kept (the 1-minute load average, sampled
every 30 s): four other agents share this 2-core machine. A configuration "with hogs" runs
two busy loops on the host for the whole lab; a "quiet" one waits, before each lab, until
the load is below --quiet-load (at most --quiet-wait seconds), and records what it was.

    python scripts/lab_census.py --configs default,default-hogs --labs 20
    python scripts/lab_census.py --table            # the table of what is recorded

Each lab is appended to --out (JSON lines) as it ends, so the census resumes where it
stopped (--labs counts what is recorded); --table prints the table docs/lab.md holds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from vmtax.core.errors import VmtaxError
from vmtax.host import guardian
from vmtax.host.journal import Journal
from vmtax.results.store import Store
from vmtax.studies import lab as lab_study

KINDS = ("L2 boot stall", "L2 lost", "L2 setup lost", "workload hang", "L1 panic", "L1 hang",
         "L1 boot hang")
KERNEL_612 = "linux-image-6.12.107+deb12-amd64-unsigned"


@dataclass(frozen=True)
class Config:
    """One configuration of the census: the lab's, its guests' and the host's."""
    description: str
    lab: dict[str, Any] = field(default_factory=dict)     # LabConfig's fields
    kernel: str = "minimal"                               # L2's kernel
    kernel_args: str | None = None                        # L2's extra kernel arguments
    vcpus: int = 2                                        # L2's (the vm target's default)
    hogs: int = 0
    quiet: bool = False


# vmtax before the census gave a nested KVM guest the kernel's own RCU stall timeout.
BEFORE = "rcupdate.rcu_cpu_stall_timeout=21"
CONFIGS = {
    "before-hogs": Config("vmtax before: L2's RCU stall report at 21 s; two CPU hogs",
                          kernel_args=BEFORE, hogs=2),
    "before": Config("vmtax before: L2's RCU stall report at 21 s", kernel_args=BEFORE),
    "before-quiet": Config("vmtax before, the host quiet", kernel_args=BEFORE, quiet=True),
    "default-hogs": Config("the default: Debian 6.1, max,+svm,+npt, 2 vCPUs, 4G; L2 minimal, "
                           "2 vCPUs, RCU stall report at 300 s; two CPU hogs", hogs=2),
    "default": Config("the default"),
    "default-quiet": Config("the default, the host quiet", quiet=True),
    "l2-1cpu-before": Config("L2 1 vCPU, its RCU stall report at 21 s", vcpus=1,
                             kernel_args=BEFORE),
    "l2-1cpu-before-hogs": Config("L2 1 vCPU, its RCU stall report at 21 s; two CPU hogs",
                                  vcpus=1, kernel_args=BEFORE, hogs=2),
    "l2-debian": Config("L2 Debian's kernel", kernel="debian"),
    "l2-tsc": Config("L2 clocksource=tsc", kernel_args="clocksource=tsc"),
    "l1-6.12": Config("L1 Debian 12's 6.12 (security archive)", lab={"kernel": KERNEL_612}),
    "l1-1cpu": Config("L1 1 vCPU", lab={"vcpus": 1}),
    "l1-2g": Config("L1 2G of memory", lab={"memory": "2G"}),
    "l1-epyc": Config("L1 CPU EPYC (+svm,+npt)", lab={"cpu": "EPYC"}),
    "tcg-single": Config("TCG thread=single", lab={"tcg_thread": "single"}),
    "tcg-tb256": Config("TCG tb-size=256 MiB", lab={"tb_size": 256}),
}

PLAN = """runs = 1
warmup = 0
time = 1
baseline = "kvm-1"

[targets.kvm-1]
kind = "vm"
accel = "kvm"
kernel = "{kernel}"
memory = "256M"
vcpus = {vcpus}
{kernel_args}
[targets.kvm-2]
kind = "vm"
accel = "kvm"
kernel = "{kernel}"
memory = "256M"
vcpus = {vcpus}
{kernel_args}
[[workloads]]
name = "cpu"

[[workloads]]
name = "iperf3"
"""

_REBOOTED = re.compile(r"vmtax: (?P<why>.*); booting it once more \(in a lab\)")
_NOT_PREPARED = re.compile(r"warning: (?P<target>\S+) could not be prepared: (?P<why>.*?); its "
                           r"runs are skipped")


def l2_fault(message: str) -> str:
    """The kind of an L2 fault vmtax reported (a boot it retried, or gave up)."""
    if "its kernel stalled" in message:
        return "L2 boot stall"
    if "guest failed to boot" in message:
        return "L2 lost"
    return "L2 setup lost"


def l1_fault(message: str) -> str:
    if "panicked" in message:
        return "L1 panic"
    if "did not boot within" in message:
        return "L1 boot hang"
    if "hung: no heartbeat" in message:
        return "L1 hang"
    return "other"


@contextlib.contextmanager
def hogs(count: int) -> Iterator[None]:
    """count busy loops on the host, for the block."""
    loops = [subprocess.Popen(["sh", "-c", "while :; do :; done"], start_new_session=True)
             for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            os.killpg(loop.pid, signal.SIGKILL)
            loop.wait()


def wait_quiet(below: float, within: float) -> float:
    """Wait until the host's 1-minute load is below `below` (at most `within` s): the load."""
    deadline = time.monotonic() + within
    while os.getloadavg()[0] >= below and time.monotonic() < deadline:
        time.sleep(15)
    return os.getloadavg()[0]


def one_lab(name: str, config: Config, work: Path, hang_timeout: float,
            consoles: Path) -> dict[str, Any]:
    """One lab of the census: what it counted, and the host's load beside it; the console
    of a lab that died or hung is kept in consoles."""
    kernel_args = f'kernel_args = "{config.kernel_args}"\n' if config.kernel_args else ""
    plan = work / "plan.toml"
    plan.write_text(PLAN.format(kernel=config.kernel, kernel_args=kernel_args,
                                vcpus=config.vcpus))
    results = work / "results"
    record: dict[str, Any] = {"config": name, "started": time.time(),
                              "load_before": os.getloadavg()[0]}
    faults = dict.fromkeys(KINDS, 0)
    err: list[bytes] = []
    journal = Journal()
    lab_config = lab_study.LabConfig(**config.lab, hang_timeout=hang_timeout, restarts=0)
    started = time.monotonic()
    outcome = None
    with guardian.guard(journal.path), hogs(config.hogs):
        try:
            outcome = lab_study.run([["run", str(plan)]], lab_config, results=results,
                                    journal=journal, echo=(lambda data: None, err.append),
                                    say=lambda text: err.append(text.encode() + b"\n"))
            record["exit"] = outcome.exit_code
        except VmtaxError as exc:
            faults[l1_fault(str(exc))] += 1
            record["exit"], record["l1"] = 2, str(exc)
    record["seconds"] = round(time.monotonic() - started, 1)
    record["loads"] = outcome.loads if outcome else []
    said = b"".join(err).decode(errors="replace")
    for found in _REBOOTED.finditer(said):
        faults[l2_fault(found["why"])] += 1
    for found in _NOT_PREPARED.finditer(said):   # its second try failed as well
        faults[l2_fault(found["why"])] += 1
    record["boots"] = {}   # each L2's: seconds to READY on the lab's clock, its own uptime
    if (results / "vmtax.sqlite").exists():
        store = Store(results, readonly=True)
        for run in store.list_runs():
            stored = store.load_run(run["id"])
            faults["workload hang"] += sum(r.status == "timeout" and r.phase == "measure"
                                           for r in stored.reps)
            record["boots"].update({name: [t["fingerprint"].get("boot_seconds"),
                                           t["fingerprint"].get("guest_boot_seconds")]
                                    for name, t in stored.targets.items()})
            record["iperf3"] = {r.target: m.value for r in stored.reps
                                if r.workload == "iperf3" and r.phase == "measure"
                                for m in r.metrics if m.name == "throughput"}
        store.close()
    record["faults"] = faults
    record["said"] = said[-4000:]
    consoles.mkdir(parents=True, exist_ok=True)
    record["consoles"] = []
    for kept in sorted(results.glob("lab-console-*.log")):
        record["consoles"].append(str(consoles / f"{name}-{int(record['started'])}-{kept.name}"))
        kept.rename(record["consoles"][-1])
    return record


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table(records: list[dict[str, Any]]) -> str:
    """The census as a markdown table: per configuration, labs, faults of each kind (and
    the share of labs with any), the host's load."""
    lines = ["| configuration | labs | " + " | ".join(KINDS) + " | labs with a fault | "
             "load (median, range) | minutes per lab |",
             "|---" * (len(KINDS) + 5) + "|"]
    for name in dict.fromkeys(r["config"] for r in records):
        mine = [r for r in records if r["config"] == name]
        counts = [sum(r["faults"][kind] for r in mine) for kind in KINDS]
        faulty = sum(any(r["faults"].values()) for r in mine)
        loads = sorted(x for r in mine for x in [r["load_before"], *r["loads"]])
        median = loads[len(loads) // 2] if loads else float("nan")
        minutes = sorted(r["seconds"] for r in mine)[len(mine) // 2] / 60
        lines.append(f"| {name} | {len(mine)} | " + " | ".join(map(str, counts))
                     + f" | {faulty} ({faulty / len(mine):.0%}) | {median:.1f} "
                     f"({loads[0]:.1f}–{loads[-1]:.1f}) | {minutes:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="before-hogs,default-hogs,before-quiet,"
                        "default-quiet",
                        help="comma-separated: " + ", ".join(CONFIGS))
    parser.add_argument("--labs", type=int, default=20, help="labs per configuration")
    parser.add_argument("--out", default="results/lab-census.jsonl")
    parser.add_argument("--hang-timeout", type=float, default=lab_study.HANG_TIMEOUT)
    parser.add_argument("--quiet-load", type=float, default=1.5)
    parser.add_argument("--quiet-wait", type=float, default=1800)
    parser.add_argument("--table", action="store_true", help="print the table and stop")
    args = parser.parse_args()
    out = Path(args.out)
    if args.table:
        print(table(_records(out)))
        return
    names = args.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        sys.exit(f"lab_census: unknown configuration {unknown[0]!r}; one of: "
                 + ", ".join(CONFIGS))
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        config = CONFIGS[name]
        while (done := sum(r["config"] == name for r in _records(out))) < args.labs:
            if config.quiet:
                load = wait_quiet(args.quiet_load, args.quiet_wait)
                print(f"lab_census: {name}: load {load:.2f} at the start", flush=True)
            with tempfile.TemporaryDirectory(prefix="vmtax-census-") as work:
                record = one_lab(name, config, Path(work), args.hang_timeout,
                                 out.parent / "lab-census-consoles")
            with open(out, "a") as f:
                f.write(json.dumps(record) + "\n")
            counted = {k: v for k, v in record["faults"].items() if v}
            print(f"lab_census: {name} {done + 1}/{args.labs}: {record['seconds']:.0f} s, "
                  f"load {record['load_before']:.1f}, faults {counted or 'none'}", flush=True)
    print(table(_records(out)))


if __name__ == "__main__":
    main()
