"""exits: VM exits of a KVM guest per reason, recorded by `perf kvm stat` (E2).

`perf kvm stat record -p VMM_PID` (the subject's first process, its VMM: the QEMU of a vm
target or of a libvirt domain; Subject.vmm_process) runs in the collector's scratch
directory from start to stop (it writes perf.data.guest there); at stop it gets SIGINT, as
a user's Ctrl-C, which
makes it finish the file, and `perf kvm stat report --event=E` per asked event kind is read
by vmtax.helpers.perf_kvm into one metric per reason (with per_vcpu, also `--vcpu=N` for each of
the subject's vCPUs, in vCPU order, as metrics with a "vcpu" dimension). perf prints that
report on stderr (pr_info), in the classic layout when its output is no terminal.

Exits exist only where the guest runs under hardware KVM: a TCG guest has none, and on a
host whose /dev/kvm is kvm_pvm a stock guest cannot run under KVM at all. Recording needs
the kvm:kvm_exit/kvm_entry tracepoints (tracefs) and the right to open them (root, or
kernel.perf_event_paranoid = -1 with tracefs readable). `unavailable` checks these in
that order and names the first that fails.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import ClassVar, Literal

from vmtax.core import plugin
from vmtax.core.collector import Collector, CollectorError, CollectorJournal, Subject
from vmtax.core.errors import ParseError
from vmtax.core.types import Metric, MetricSpec
from vmtax.helpers import perf_kvm
from vmtax.core.text import first_line
from vmtax.helpers.perf_tool import PERF, perf_problem, record_message, spawn_record
from vmtax.host import kvm, machine, proc

# Where the tracepoints perf kvm stat needs show up, by tracefs mount point.
TRACEFS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
# perf writes this header within milliseconds; a slow, shared host gets more.
START_TIMEOUT = 20.0
STOP_TIMEOUT = 60.0
PROC_MAP_TIMEOUT_MS = 2000


class ExitsOptions(plugin.Options):
    events: list[Literal["vmexit", "ioport", "mmio"]] = plugin.option(
        ["vmexit"], "the event kinds reported: VM exits by reason, port I/O by port, MMIO "
        "by address (perf kvm stat report --event)", min_length=1)
    per_vcpu: bool = plugin.option(
        False, "also report each vCPU on its own (perf kvm stat report --vcpu N), as "
        "metrics with a \"vcpu\" dimension beside those of all vCPUs together")


def _is_kvm_guest(pid: int, proc_root: Path) -> bool | None:
    """Does the process hold a KVM VM (an anon_inode:kvm-vm fd)? None: cannot tell."""
    try:
        fds = list((proc_root / str(pid) / "fd").iterdir())
    except OSError:
        return None
    for fd in fds:
        try:
            if os.readlink(fd) == "anon_inode:kvm-vm":
                return True
        except OSError:
            continue
    return False


def host_problem(tracefs: tuple[Path, ...] = TRACEFS) -> str | None:
    """Why this host cannot record exits with perf, KVM aside; None when it can."""
    problem = perf_problem()
    if problem is not None:
        return problem
    events = [root / "events" / "kvm" for root in tracefs]
    found = next((e for e in events if (e / "kvm_exit").is_dir()), None)
    if found is None:
        mounted = [root for root in tracefs if (root / "events").is_dir()]
        if not mounted:
            return ("tracefs is not mounted, so perf sees no kvm tracepoints: "
                    "mount -t tracefs nodev /sys/kernel/tracing")
        return (f"the host kernel has no kvm:kvm_exit tracepoint ({events[0]}/kvm_exit is "
                "missing): load kvm_intel or kvm_amd")
    if os.geteuid() != 0:
        try:
            paranoid = int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
        except (OSError, ValueError):
            paranoid = 2
        if paranoid > -1 or not os.access(found / "kvm_exit", os.R_OK | os.X_OK):
            return ("no permission to record kvm tracepoints: run vmtax as root, or set "
                    f"kernel.perf_event_paranoid=-1 (now {paranoid}) and make {found} readable")
    return None


class Exits(Collector):
    name = "exits"
    description = ("VM exits of a KVM guest per reason (samples, shares of samples and of "
                   "time, min/max/avg time), from perf kvm stat record on its VMM process.")
    packages = ("linux-perf",)
    Options = ExitsOptions
    options: ExitsOptions
    # perf_kvm's metrics, with a "vcpu" dimension as well when per_vcpu is set.
    metrics: ClassVar[tuple[MetricSpec, ...]] = tuple(
        dataclasses.replace(s, dimensions=(*s.dimensions, "vcpu")) for s in perf_kvm.METRICS)
    tracefs: ClassVar[tuple[Path, ...]] = TRACEFS

    def __init__(self, options: plugin.Options, *, journal: CollectorJournal,
                 scratch: Path) -> None:
        super().__init__(options, journal=journal, scratch=scratch)
        self._perf: subprocess.Popen[bytes] | None = None
        self._token: int | None = None
        self._vcpus = 0

    @classmethod
    def unavailable(cls, subject: Subject) -> str | None:
        if not subject.vmm_process:
            return f"{subject.name} is no VM: exits are those of a KVM guest"
        if not subject.pids:
            return f"{subject.name} has no VMM process to record"
        guest = _is_kvm_guest(subject.pids[0], cls.proc_root)
        if guest is None:
            return f"cannot read /proc/{subject.pids[0]}/fd of {subject.name}'s VMM"
        if not guest:
            status = kvm.probe()
            return (f"{subject.name} runs under TCG, which has no VM exits"
                    + ("" if status.usable else f" (and KVM is unusable here: {status.reason})"))
        status = kvm.probe()
        if not status.usable:
            return status.reason
        return host_problem(cls.tracefs)

    @classmethod
    def doctor(cls) -> tuple[bool, str] | None:
        status = kvm.probe()
        if not status.usable:
            return False, f"cannot record VM exits: no usable KVM ({status.reason})"
        problem = host_problem(cls.tracefs)
        if problem is not None:
            return False, f"cannot record VM exits: {problem}"
        return True, "perf kvm stat can record the VM exits of KVM guests (--collect exits)"

    def start(self, subject: Subject) -> None:
        if not subject.pids:
            raise CollectorError(f"{self.name}: {subject.name} has no VMM process")
        vmm = subject.pids[0]
        self._vcpus = len(subject.vcpu_threads)
        # perf reads the subject's /proc/PID/task/*/maps first, within 500 ms by default:
        # in vmtax's lab (everything under TCG) that ran out ("Reading … maps time out").
        slow = ["--proc-map-timeout", str(int(machine.lab_scaled(PROC_MAP_TIMEOUT_MS)))]
        self._perf = spawn_record([PERF, "kvm", "stat", "record",
                                   *(slow if machine.lab() else []), "-p", str(vmm)],
                                  self.scratch, self.name)
        self._token = self.journal.process(self._perf.pid)
        data = self.scratch / "perf.data.guest"
        deadline = time.monotonic() + machine.lab_scaled(START_TIMEOUT)
        while not (data.exists() and data.stat().st_size > 0):
            if self._perf.poll() is not None:
                raise CollectorError(f"{self.name}: perf kvm stat record exited at once: "
                                     f"{record_message(self.scratch)}")
            if time.monotonic() > deadline:
                raise CollectorError(f"{self.name}: perf kvm stat record wrote nothing "
                                     f"within {machine.lab_scaled(START_TIMEOUT):g} s")
            time.sleep(0.02)

    def stop(self) -> list[Metric]:
        perf = self._perf
        assert perf is not None   # stop() follows a successful start()
        if perf.poll() is None:
            perf.send_signal(signal.SIGINT)
            try:
                perf.wait(timeout=machine.lab_scaled(STOP_TIMEOUT))
            except subprocess.TimeoutExpired:
                self.abort()
                raise CollectorError(f"{self.name}: perf kvm stat record did not finish within "
                                     f"{machine.lab_scaled(STOP_TIMEOUT):g} s of SIGINT") from None
        else:
            self.warnings.append(f"{self.name}: perf kvm stat record ended before stop "
                                 f"(exit code {perf.returncode}): {record_message(self.scratch)}")
        self._forget()
        # perf record re-raises the SIGINT it handled once the file is complete.
        if perf.returncode not in (0, -signal.SIGINT, 128 + signal.SIGINT):
            raise CollectorError(f"{self.name}: perf kvm stat record failed (exit code "
                                 f"{perf.returncode}): {record_message(self.scratch)}")
        metrics: list[Metric] = []
        vcpus = range(self._vcpus) if self.options.per_vcpu else range(0)
        for event in self.options.events:
            metrics += self._report(event, None)
            for vcpu in vcpus:
                metrics += self._report(event, vcpu)
        return metrics

    def _report(self, event: str, vcpu: int | None) -> list[Metric]:
        """`perf kvm stat report` of the recording for one event kind, of all vCPUs or
        one (its metrics then carry a "vcpu" dimension)."""
        argv = [PERF, "kvm", "stat", "report", f"--event={event}"]
        if vcpu is not None:
            argv.append(f"--vcpu={vcpu}")
        what = " ".join(argv[1:])
        out = proc.run(argv, cwd=str(self.scratch), timeout=machine.lab_scaled(STOP_TIMEOUT))
        if out.exit_code != 0:
            why = first_line(out.stderr) or f"exit code {out.exit_code}"
            raise CollectorError(f"{self.name}: perf {what} failed: {why}")
        try:
            report = perf_kvm.parse(out.stderr + "\n" + out.stdout, f"perf {what}")
        except ParseError as exc:
            raise CollectorError(f"{self.name}: {exc}") from None
        metrics = report.metrics()
        if vcpu is None:
            return metrics
        return [Metric(m.name, m.value, m.unit, m.higher_is_better,
                       {**m.dimensions, "vcpu": str(vcpu)}) for m in metrics]

    def _forget(self) -> None:
        if self._token is not None:
            self.journal.forget(self._token)
            self._token = None

    def abort(self) -> None:
        if self._perf is not None and self._perf.poll() is None:
            proc.kill_group(self._perf)
        self._forget()
