"""kill -9 during a density run at scale (issue #37): the guardian's live test with every
instance of `vmtax density` running; nothing of the run may be left within 10 s.

    python scripts/torture_density.py [--instances 200] [--target vm:tcg] [--ksm on|off]

Starts `vmtax density` with a private runtime directory, waits until all its instances
(QEMU processes, or a container's) are up, kills vmtax with SIGKILL, then times until no
process it started is alive, no journal lists a change and KSM is as it was (what
scripts/torture.py's kill attack checks, at this scale). Prints the figures and exits 1
on a leftover after 10 s, or when the run never got all its instances up. Too long for
`make test` (200 TCG guests take tens of minutes to start): `make torture-density`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torture_kit.env import VMTAX  # noqa: E402
from torture_kit.host import (changed, descendants, host_state, journal_entries,  # noqa: E402
                              leftovers, processes)

CLEAN_WITHIN = 10.0
GUARDIAN = "vmtax.host.guardian"


def plan(instances: int, target: str, ksm: str) -> str:
    """Few, large steps, short waits: the point is every instance up, not the figures."""
    kind, _, variant = target.partition(":")
    table = f'[targets.t]\nkind = "{kind}"\n'
    if kind == "vm":
        # vm's small_options (what `vmtax density --targets vm:tcg` starts).
        from vmtax.core import target as targets
        options = {**targets.get("vm").small_options, "accel": variant or "tcg"}
        table += "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in options.items())
    elif variant:
        table += f'runtime = "{variant}"\n'
    return (f"max = {instances}\nsingles = 1\nbatch = {min(25, instances)}\nparallel = 4\n"
            f"ksm = [{'true' if ksm == 'on' else 'false'}]\nsettle_window = 1\n"
            "settle_timeout = 5\nksm_timeout = 60\nhttp_timeout = 5\nhttp_timeout_max = 5\n"
            + table)


def instance_processes(pid: int, target: str) -> dict[tuple[int, int], str]:
    found = {k: c for k, c in descendants(pid).items() if GUARDIAN not in c}
    marker = "qemu-system" if target.startswith("vm") else "nginx: master"
    return {k: c for k, c in found.items() if marker in c}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--instances", type=int, default=200)
    parser.add_argument("--target", default="vm:tcg")
    parser.add_argument("--ksm", choices=("on", "off"), default="on")
    parser.add_argument("--start-timeout", type=float, default=3600.0,
                        help="seconds to wait for every instance to be up")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vmtax-torture-density-") as tmp:
        work = Path(tmp)
        runtime = work / "runtime"
        runtime.mkdir(mode=0o700)
        (work / "density.toml").write_text(plan(args.instances, args.target, args.ksm))
        env = {**os.environ, "VMTAX_RUNTIME": str(runtime)}
        before = host_state()
        started = time.monotonic()
        vmtax = subprocess.Popen([*VMTAX, "density", str(work / "density.toml"), "--results",
                                  str(work / "results")], env=env, text=True,
                                 stdout=subprocess.DEVNULL, stderr=open(work / "err", "w"))
        up: dict[tuple[int, int], str] = {}
        while len(up) < args.instances:
            if vmtax.poll() is not None or time.monotonic() - started > args.start_timeout:
                vmtax.kill()
                vmtax.wait()
                subprocess.run([*VMTAX, "cleanup"], env=env, capture_output=True)
                print(f"FAILED: {len(up)} of {args.instances} instances up when the run "
                      f"{'ended' if vmtax.returncode is not None else 'timed out'}: "
                      + (work / "err").read_text()[-800:])
                return 1
            up = instance_processes(vmtax.pid, args.target)
            time.sleep(0.5)
        took = time.monotonic() - started
        everything = {k: c for k, c in descendants(vmtax.pid).items() if GUARDIAN not in c}
        entries = journal_entries(runtime)
        vmtax.kill()
        killed = time.monotonic()
        vmtax.wait()
        # Processes and the journal file are polled quickly; what else the journal listed
        # (devices, namespaces, directories: `ip` once per entry) between those polls.
        last_process = last_journal = None
        left: list[str] = []
        while time.monotonic() - killed < CLEAN_WITHIN + 50:
            table = processes()
            alive = [c for (pid, start), c in everything.items()
                     if pid in table and table[pid][1] == start]
            if not alive and last_process is None:
                last_process = time.monotonic() - killed
            if not list(runtime.glob("journal-*-*.json")) and last_journal is None:
                last_journal = time.monotonic() - killed
            if last_process is not None and last_journal is not None:
                left = leftovers(entries) + changed(before, entries)
                if not left:
                    break
            time.sleep(0.05)
        checked = time.monotonic() - killed
        if last_process is None or last_journal is None:
            left.append("processes or the journal, after a minute")
        # Clean when both processes and journal were gone and the check after found the
        # rest undone too (the guardian removes the journal once it undid every entry).
        clean = max(last_process or checked, last_journal or checked)
        print(f"{args.instances} {args.target} instances (KSM {args.ksm}) up {took:.0f} s "
              f"after the start; {len(everything)} processes and {len(entries)} journal "
              f"entries at the kill")
        print(f"after kill -9: no process of the run left at "
              f"{'never' if last_process is None else f'{last_process:.2f} s'}, no journal "
              f"at {'never' if last_journal is None else f'{last_journal:.2f} s'}, "
              f"nothing left at {clean:.2f} s (checked at {checked:.2f} s)"
              + (f"; still left: {', '.join(left[:4])}" if left else ""))
        subprocess.run([*VMTAX, "cleanup"], env=env, capture_output=True)
        if left or clean > CLEAN_WITHIN:
            print(f"FAILED: not clean within {CLEAN_WITHIN:g} s")
            return 1
        print(f"ok: clean within {CLEAN_WITHIN:g} s")
        return 0


if __name__ == "__main__":
    sys.exit(main())
