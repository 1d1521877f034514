#!/usr/bin/env python3
"""Boot time of vmtax guests: QEMU spawn -> agent READY, five TCG boots (and KVM when usable).

Usage: .venv/bin/python scripts/bench_boot.py [--runs N] [--machine microvm|q35] [--kernel PATH]
                                              [--vcpus N] [--memory SIZE]
The guest image is built (or taken from the cache) before the first boot and not timed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from vmtax.core import target as targets
from vmtax.core.errors import VmtaxError
from vmtax.core.target import TargetContext
from vmtax.guest.image import GuestImage
from vmtax.host import kvm
from vmtax.host.journal import Journal


def boots(accel: str, runs: int, options: dict, ctx: TargetContext) -> list[tuple[float, float]]:
    """(host-measured boot, guest uptime at READY) for each boot."""
    results = []
    for _ in range(runs):
        target = targets.create(f"vm:{accel}", "vm", {**options, "accel": accel}, ctx)
        try:
            target.prepare()
            results.append((target.guest.boot_seconds, target.guest.guest_boot_seconds))
        finally:
            target.cleanup()
    return results


def report(label: str, results: list[tuple[float, float]]) -> None:
    host = [h for h, _ in results]
    guest = [g for _, g in results]
    print(f"{label}: median {statistics.median(host):.3f} s to agent READY "
          f"(guest's own uptime at READY: median {statistics.median(guest):.3f} s)")
    print("  all: " + ", ".join(f"{h:.3f}" for h in host))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--machine", default="microvm", choices=("microvm", "q35"))
    parser.add_argument("--kernel", default=None)
    parser.add_argument("--qemu", default="qemu-system-x86_64")
    parser.add_argument("--vcpus", type=int, default=None, help="default: the vm target's")
    parser.add_argument("--memory", default=None, help="default: the vm target's")
    args = parser.parse_args()
    options = {k: v for k, v in {"machine": args.machine, "kernel": args.kernel,
                                 "qemu": args.qemu, "vcpus": args.vcpus,
                                 "memory": args.memory}.items() if v is not None}
    with tempfile.TemporaryDirectory(prefix="vmtax-bench-", dir="/var/tmp") as tmp:
        journal = Journal(Path(tmp))
        ctx = TargetContext(work_dir=Path(tmp), journal=journal, binaries=("sysbench",),
                            image=GuestImage(["sysbench"], args.kernel))
        try:
            ctx.image.initramfs()
            shape = f"{args.vcpus or 'default'} vCPU, {args.memory or 'default'} memory"
            report(f"TCG, {args.machine}, {shape}", boots("tcg", args.runs, options, ctx))
            status = kvm.probe()
            if status.usable:
                report(f"KVM, {args.machine}", boots("kvm", args.runs, options, ctx))
            else:
                print(f"KVM: not measured ({status.reason})")
        except VmtaxError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            journal.undo_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
