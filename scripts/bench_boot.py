#!/usr/bin/env python3
"""Boot time of vmtax guests: QEMU spawn -> agent READY under TCG (and KVM when usable),
part by part, for the guest a plan gets and, with --against-full, for the classic plan's
guest (sysbench and its 29 libraries: the guest this benchmark booted before per-plan
images) and for a guest carrying no program at all.

Usage: .venv/bin/python scripts/bench_boot.py [--runs N] [--machine microvm|q35] [--kernel PATH]
                                              [--vcpus N] [--memory SIZE]
                                              [--programs P,... | --plan FILE] [--against-full]
A guest's initramfs carries busybox, vmtax's agent and the programs its plan's workloads
declare (Workload.binaries) with their libraries; by default the E4 plan's (nginx, which
`vmtax density` and `vmtax boot` start in every instance). Images are built (or taken from
the cache) before the first boot and not timed.

The parts of a boot, from the guest's clock (/proc/uptime when /init starts, and at READY):
  QEMU      spawn until the guest's clock starts (QEMU's own start, loading the kernel)
  kernel    the guest kernel until /init, unpacking the initramfs included
  init      /init until the agent's READY (mounts, finding the agent's port)
and the unpacking alone, estimated as the kernel part's growth against an image carrying
no program at all, per MiB of initramfs. Beside them: QEMU's CPU time until READY (the
boot's cost, comparable when other processes share the host's CPUs) and the host's load
average (1 min) as the boots ran.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vmtax.core import target as targets
from vmtax.core.errors import VmtaxError
from vmtax.core.target import TargetContext
from vmtax.core.types import Job
from vmtax.guest.image import GuestImage
from vmtax.host import kvm
from vmtax.host.journal import Journal
from vmtax.studies import density, planfile

CLASSIC = Path(__file__).resolve().parent.parent / "src" / "vmtax" / "plans" / "classic.toml"


@dataclass
class Boot:
    host: float     # s, QEMU spawn -> READY on the host's clock
    ready: float    # s, guest uptime at READY
    init: float     # s, guest uptime as /init started
    cpu: float      # s, QEMU's CPU time until READY

    def parts(self) -> dict[str, float]:
        return {"QEMU": self.host - self.ready, "kernel": self.init,
                "init": self.ready - self.init}


def boots(accel: str, runs: int, options: dict, ctx: TargetContext) -> list[Boot]:
    results = []
    for _ in range(runs):
        target = targets.create(f"vm:{accel}", "vm", {**options, "accel": accel}, ctx)
        try:
            target.prepare()
            guest = target.guest   # type: ignore[attr-defined]
            stamp = guest.run(Job(["cat", "/vmtax/init-uptime"], timeout=30))
            results.append(Boot(guest.boot_seconds, guest.guest_boot_seconds,
                                float(stamp.stdout.split()[0]), guest.boot_cpu_seconds))
        finally:
            target.cleanup()
    return results


def plan_programs(path: Path) -> list[str]:
    """The programs a plan file's guest carries: those its workloads declare."""
    plan = planfile.load(path)
    return sorted({b for w in plan.workloads for b in w.make(plan.time).binaries})


def report(label: str, image: GuestImage, results: list[Boot], load: float) -> dict[str, float]:
    size = image.initramfs().stat().st_size / 2**20
    medians = {part: statistics.median(b.parts()[part] for b in results)
               for part in ("QEMU", "kernel", "init")}
    print(f"{label}: initramfs {size:.1f} MiB; median "
          f"{statistics.median(b.host for b in results):.3f} s to agent READY (QEMU's CPU "
          f"{statistics.median(b.cpu for b in results):.2f} s; load average {load:.1f})")
    print("  parts (medians): " + ", ".join(f"{k} {v:.3f} s" for k, v in medians.items()))
    print("  all: " + ", ".join(f"{b.host:.3f}" for b in results))
    return {"size": size, **medians}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--machine", default="microvm", choices=("microvm", "q35"))
    parser.add_argument("--kernel", default=None)
    parser.add_argument("--qemu", default="qemu-system-x86_64")
    parser.add_argument("--vcpus", type=int, default=None, help="default: the vm target's")
    parser.add_argument("--memory", default=None, help="default: the vm target's")
    parser.add_argument("--programs", default=density.SERVER,
                        help="the plan's programs, comma-separated (default: the E4 plan's)")
    parser.add_argument("--plan", type=Path, default=None,
                        help="boot the guest of this plan file (its workloads' programs)")
    parser.add_argument("--against-full", action="store_true",
                        help="also boot the classic plan's guest, and one carrying no "
                             "program (to estimate the unpacking)")
    args = parser.parse_args()
    options = {k: v for k, v in {"machine": args.machine, "kernel": args.kernel,
                                 "qemu": args.qemu, "vcpus": args.vcpus,
                                 "memory": args.memory}.items() if v is not None}
    shape = f"{args.vcpus or 'default'} vCPU, {args.memory or 'default'} memory"
    plan = (plan_programs(args.plan) if args.plan
            else [p for p in args.programs.split(",") if p])
    images = {f"per-plan ({', '.join(plan) or 'no program'})": plan}
    if args.against_full:
        images["no program (agent only)"] = []
        images["the classic plan's programs"] = plan_programs(CLASSIC)
    with tempfile.TemporaryDirectory(prefix="vmtax-bench-", dir="/var/tmp") as tmp:
        journal = Journal(Path(tmp))
        try:
            measured = {}
            for label, programs in images.items():
                ctx = TargetContext(work_dir=Path(tmp), journal=journal,
                                    binaries=tuple(programs),
                                    image=GuestImage(programs, args.kernel))
                assert ctx.image is not None
                ctx.image.initramfs()
                results = boots("tcg", args.runs, options, ctx)
                measured[label] = report(f"TCG, {args.machine}, {shape}, {label}", ctx.image,
                                         results, os.getloadavg()[0])
            if args.against_full:
                empty, full = measured["no program (agent only)"], measured[
                    "the classic plan's programs"]
                per_mib = (full["kernel"] - empty["kernel"]) / (full["size"] - empty["size"])
                plan_label = next(iter(measured))
                plan_mib = measured[plan_label]["size"]
                if per_mib <= 0:
                    print("  unpacking: not estimated (the kernel part did not grow with the "
                          "initramfs: a busy host's noise outweighs it; see the load averages)")
                else:
                    print(f"  unpacking, estimated from the kernel part's growth: "
                          f"{per_mib * 1000:.1f} ms per MiB of initramfs; the per-plan image's "
                          f"{plan_mib:.1f} MiB ≈ {per_mib * plan_mib:.3f} s, the classic plan's "
                          f"{full['size']:.1f} MiB ≈ {per_mib * full['size']:.3f} s")
            status = kvm.probe()
            if status.usable:
                ctx = TargetContext(work_dir=Path(tmp), journal=journal, binaries=tuple(plan),
                                    image=GuestImage(plan, args.kernel))
                assert ctx.image is not None
                results = boots("kvm", args.runs, options, ctx)
                report(f"KVM, {args.machine}", ctx.image, results, os.getloadavg()[0])
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
