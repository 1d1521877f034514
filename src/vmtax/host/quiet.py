"""Is this host quiet enough to measure on? What pyperf's `system tune` looks at: the CPU
frequency governor, turbo boost, SMT, the load average and the busiest other processes.

A snapshot is taken before every run (with the busiest processes) and after it (the load
only: sampling processes waits, and the run is over), and stored with the run's host facts
(`host.quiet.before` / `.after`: Store.set_host_quiet), so a noisy result can be traced to
a busy host; `vmtax doctor` shows one now, and `vmtax run` warns when it starts measuring
on a busy host.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

# A 1-minute load average above this share of the CPUs means others compete for them
# (2 CPUs: 0.5): repetitions then vary with the neighbours' work, not the target's.
BUSY_LOAD = 0.25
# A process using more than this share of one CPU while vmtax measures is named.
BUSY_PROCESS = 0.10
SAMPLE = 0.1   # seconds over which processes' CPU use is measured (a run waits for it)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def governors(sys_root: str = "/sys") -> list[str]:
    """The distinct CPU frequency governors in use; empty where cpufreq is absent (a VM)."""
    found = {_read(p) for p in Path(sys_root).glob(
        "devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor")}
    return sorted(g for g in found if g)


def turbo(sys_root: str = "/sys") -> bool | None:
    """Whether turbo boost is on; None where the host does not say."""
    cpu = Path(sys_root) / "devices/system/cpu"
    no_turbo = _read(cpu / "intel_pstate/no_turbo")
    if no_turbo in ("0", "1"):
        return no_turbo == "0"
    boost = _read(cpu / "cpufreq/boost")
    return boost == "1" if boost in ("0", "1") else None


def smt(sys_root: str = "/sys") -> bool | None:
    active = _read(Path(sys_root) / "devices/system/cpu/smt/active")
    return active == "1" if active in ("0", "1") else None


def _cpu_ticks(proc_root: str) -> dict[int, tuple[str, int]]:
    """pid -> (command name, user + system clock ticks) of every process."""
    ticks = {}
    for entry in Path(proc_root).iterdir():
        if not entry.name.isdigit():
            continue
        stat = _read(entry / "stat")
        if not stat or ")" not in stat:
            continue
        # The name is in parentheses and may itself hold spaces and parentheses.
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        ticks[int(entry.name)] = (name, int(fields[11]) + int(fields[12]))
    return ticks


def busiest(count: int = 3, interval: float = SAMPLE,
            proc_root: str = "/proc") -> list[dict[str, Any]]:
    """The processes other than this one using the most CPU over `interval` seconds:
    [{"pid", "name", "cpu"}] with cpu a share of one CPU, busiest first."""
    first = _cpu_ticks(proc_root)
    time.sleep(interval)
    second = _cpu_ticks(proc_root)
    hz = os.sysconf("SC_CLK_TCK")
    me = os.getpid()
    used = sorted(((ticks - first[pid][1]) / hz / interval, pid, name)
                  for pid, (name, ticks) in second.items()
                  if pid in first and pid != me and first[pid][0] == name)
    return [{"pid": pid, "name": name, "cpu": round(cpu, 3)}
            for cpu, pid, name in reversed(used) if cpu > 0][:count]


def snapshot(interval: float | None = SAMPLE, sys_root: str = "/sys",
             proc_root: str = "/proc") -> dict[str, Any]:
    """The host now; without an interval no busiest processes (sampling them waits)."""
    return {"load": [round(v, 2) for v in os.getloadavg()],
            "cpus": len(os.sched_getaffinity(0)), "governors": governors(sys_root),
            "turbo": turbo(sys_root), "smt": smt(sys_root),
            "busiest": [] if interval is None else busiest(interval=interval,
                                                           proc_root=proc_root)}


def problems(snap: dict[str, Any]) -> list[str]:
    """What makes this host noisy to measure on, each with what to do; [] when quiet."""
    found = []
    load, cpus = snap["load"][0], snap["cpus"]
    if load > BUSY_LOAD * cpus:
        found.append(f"load average {load:.1f} on {cpus} CPUs: other work competes with "
                     "the measurement; wait for it or stop it")
    busy = [p for p in snap["busiest"] if p["cpu"] > BUSY_PROCESS]
    if busy:
        found.append("busiest processes: " + ", ".join(
            f"{p['name']} (PID {p['pid']}) {p['cpu']:.0%} CPU" for p in busy))
    slow = [g for g in snap["governors"] if g != "performance"]
    if slow:
        found.append(f"CPU frequency governor {'/'.join(slow)}: the clock follows the load; "
                     "cpupower frequency-set -g performance")
    if snap["turbo"]:
        found.append("turbo boost is on: the clock varies with heat and the other cores' "
                     "load; turn it off for stable numbers")
    return found


def describe(snap: dict[str, Any]) -> str:
    """The snapshot in one line: load, governor, turbo, SMT."""
    return f"load {snap['load'][0]:.1f} on {snap['cpus']} CPUs; {_clock(snap)}"


def doctor_line(snap: dict[str, Any]) -> str:
    """`vmtax doctor`'s line: the snapshot's facts, each said once (a busy load by its
    problem, with what to do)."""
    found = problems(snap)
    busy = any(p.startswith("load average") for p in found)
    return "; ".join([describe(snap) if not busy else _clock(snap), *found])


def _clock(snap: dict[str, Any]) -> str:
    def onoff(value: bool | None) -> str:
        return "unknown" if value is None else "on" if value else "off"
    return (f"governor {'/'.join(snap['governors']) or 'none (no cpufreq)'}; turbo "
            f"{onoff(snap['turbo'])}; SMT {onoff(snap['smt'])}")


def during(host: dict[str, Any]) -> str:
    """The host's load during a stored run, for the line that sums up its flags; "" when
    it was quiet or not recorded."""
    quiet = host.get("quiet") or {}
    snaps = [s for s in (quiet.get("before"), quiet.get("after")) if s]
    if not snaps:
        return ""
    load, cpus = max(s["load"][0] for s in snaps), snaps[0]["cpus"]
    return f"host load {load:.1f} on {cpus} CPUs during the run" if (
        load > BUSY_LOAD * cpus) else ""
