"""The contract every collector follows: what it observes, when it records, what it returns.

A collector records something on the host around the measured repetitions of one cell (one
workload with its parameters on one target): host CPU time, memory, VM exits. It observes
one `Subject`, a running instance of the target, and returns metrics the runner stores with
that cell. The runner drives it like this, once per cell and observed instance:

    why = cls.unavailable(subject)        # not None: the cell runs without it, and says why
    options = plugin.build(cls.Options, params, cls.name)       # once, when the plan is read
    collector = cls(options, journal=journal, scratch=empty_directory)
    collector.start(subject)              # right before the first measured repetition
    collector.pause()                     # right after it
    ...                                   # other targets' repetitions (A B B A order)
    collector.resume()                    # right before each next measured repetition
    collector.pause()                     # right after it
    metrics = collector.stop()            # at the end of the cell, paused
    # or collector.abort() instead of stop(), when the cell is interrupted

So a collector's figure covers its own target's measured repetitions only: not the other
targets' repetitions in between, nor warm-ups and cache drops. A figure that accumulates
(CPU seconds, samples for a peak) is the sum over the repetitions.

A collector object is used once, so it keeps what it needs between start and stop in
itself and needs no reset. The scratch directory is the object's own: created empty by the
runner, removed by the runner after stop() or abort(). Every process a collector starts is
started with vmtax.host.proc.spawn (it dies with vmtax) and recorded in the runner's journal at
once (`journal.process(pid)`, `journal.forget(token)` once reaped), so that neither a
killed vmtax nor an abort leaves it running.

How E2's VM-exit profiler fits: `unavailable` says why not for a subject that is not a KVM
guest (no vCPU threads, /dev/kvm is kvm_pvm, no `perf`); `start` spawns `perf kvm stat
record -p PID` for the subject's QEMU pid with the scratch directory as its working
directory (perf.data.guest lands there), journals it, and returns once perf records;
`stop` sends it SIGINT, reaps it, forgets its journal entry and parses `perf kvm stat
report --event=vmexit` run in the same directory: one metric per exit reason (dimension
"reason"; "vcpu" from `--vcpu N` per index of the subject's vcpu_threads, which are in
vCPU order); `abort` kills perf and undoes its journal entry.
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from vmtax.core import plugin
from vmtax.core.errors import VmtaxError
from vmtax.core.types import Manifest, Metric, MetricSpec


class CollectorJournal(Protocol):
    """What a collector uses of the runner's undo journal (vmtax.host.journal.Journal):
    every process it starts is recorded the moment it exists, and forgotten once reaped
    or undone (killed) on abort."""

    def process(self, pid: int) -> int:
        """Record a process to kill if vmtax dies; returns its token."""
        ...

    def forget(self, token: int) -> None:
        """The recorded change was undone by its owner: drop it."""
        ...

    def undo(self, token: int) -> None:
        """Undo the recorded change now (kill the process) and drop it."""
        ...


class CollectorError(VmtaxError):
    """A collector could not start recording, or its recording is unusable; the message is
    one line for the user. The cell's own results stand without the collector's metrics."""


@dataclass
class HostClient:
    """CPU time of a workload's client on the host (a load generator against the subject's
    server), which the runner adds to after each repetition: the client's and that of
    every process it waited for (its children's rusage), user and system seconds, and the
    seconds it ran."""
    user: float = 0.0
    system: float = 0.0
    elapsed: float = 0.0
    runs: int = 0

    def add(self, user: float, system: float, elapsed: float) -> None:
        self.user += user
        self.system += system
        self.elapsed += elapsed
        self.runs += 1


@dataclass(frozen=True, kw_only=True)
class Subject:
    """What a collector observes: one running instance of a target, as the host sees it."""
    kind: str                      # the target kind ("vm", "container", "native")
    name: str                      # the target's name in the plan ("vm:kvm")
    # The instance's host processes: QEMU, a container's processes, a native server.
    pids: list[int] = field(default_factory=list)
    # Host thread ids of a guest's vCPUs in vCPU order (index = vCPU); empty otherwise.
    vcpu_threads: list[int] = field(default_factory=list)
    # The instance's own cgroup as /proc/PID/cgroup names it, a path from a hierarchy's
    # root ("/vmtax-0123abcd"): on cgroup v1 that path is a directory in every hierarchy,
    # so each collector finds it in the one whose controller it reads. None: no cgroup.
    cgroup: str | None = None
    # The workload's client on the host, for a client-server workload; None otherwise.
    host_client: HostClient | None = None
    # pids[0] is a VMM holding the guest's KVM VM (Target.vmm_process: QEMU of a vm target
    # or a libvirt domain, a microVM's VMM): what VM exits and a VMM's threads are read on.
    vmm_process: bool = False


class Collector(plugin.Plugin, abc.ABC):
    group = "collector"
    # The metric manifest: every metric stop() may return.
    metrics: ClassVar[tuple[MetricSpec, ...]] = ()
    # Where the host's /proc is (tests point it at a fake tree).
    proc_root: ClassVar[Path] = Path("/proc")
    # Where the cgroup hierarchies are mounted (tests point it at a fake tree).
    cgroup_root: ClassVar[Path] = Path("/sys/fs/cgroup")

    def __init__(self, options: plugin.Options, *, journal: CollectorJournal,
                 scratch: Path) -> None:
        """A collector for one use.

        options: its Options, built from the plan or command line by `plugin.build`.
        journal: the runner's undo journal; every process the collector starts and every
            host change it makes is recorded there before it is made.
        scratch: an empty directory of its own for files (a perf.data), made and removed by
            the runner.
        """
        self.options = options
        self.journal = journal
        self.scratch = scratch
        # What the user must hear about the recording (a process that exited before stop);
        # the runner shows them with the cell after stop() or abort().
        self.warnings: list[str] = []

    # -- the manifest --------------------------------------------------------------------

    @classmethod
    def metric_spec(cls, name: str) -> MetricSpec | None:
        return next((spec for spec in cls.metrics if spec.name == name), None)

    @classmethod
    def manifest(cls) -> dict[str, Any]:
        return Manifest(cls.metrics).to_json()

    def metric(self, name: str, value: float, **dimensions: str) -> Metric:
        """A metric of the manifest with its declared unit and direction; CollectorError
        for a name the manifest lacks or a value that is not a finite number."""
        spec = self.metric_spec(name)
        if spec is None:   # a collector bug
            raise CollectorError(f"{self.name}: {name!r} is not in its metric manifest")
        try:
            return Metric(name, float(value), spec.unit, spec.higher_is_better, dimensions)
        except (ValueError, OverflowError) as exc:
            raise CollectorError(f"{self.name}: {exc}") from None

    @classmethod
    def describe(cls) -> dict[str, Any]:
        """Everything `vmtax list collectors --json` shows."""
        return {"name": cls.name, "description": cls.description,
                "packages": list(cls.packages), "options": cls.options_json(),
                "metrics": [{"name": s.name, "unit": s.unit,
                             "direction": "higher" if s.higher_is_better else "lower",
                             "dimensions": list(s.dimensions), "doc": s.doc}
                            for s in cls.metrics]}

    # -- the hooks -----------------------------------------------------------------------

    @classmethod
    def unavailable(cls, subject: Subject) -> str | None:
        """Why this collector cannot record `subject` on this host, in one line, or None.

        Called before the cell's first repetition, for each observed instance; the cell
        then runs without the collector and the line is shown with it ("needs KVM: this
        host's /dev/kvm is kvm_pvm"). Must be cheap and change nothing. Never raises.
        """
        return None

    @classmethod
    def doctor(cls) -> tuple[bool, str] | None:
        """The collector's line in `vmtax doctor`, under its name: whether it can record on
        this host at all, and in one line what it can record or, when it cannot, why not
        and what to do ("cannot record VM exits: no usable KVM (...)"); None: no line.

        Called once per `vmtax doctor`, with no subject; may probe the host (a second or
        two) but changes nothing. Never raises. Default: no line.
        """
        return None

    @abc.abstractmethod
    def start(self, subject: Subject) -> None:
        """Begin recording `subject`.

        Called once, right before the first measured repetition of the cell (after its
        warm-ups and, for a client-server workload, after its server is up). Returns once
        recording is under way, so the first repetition is recorded whole. A process it
        starts is journaled before start returns.

        Raises CollectorError when it cannot record (the subject vanished, a tool failed);
        the runner then calls abort() and runs the cell without it.
        """

    def pause(self) -> None:
        """Stop counting until resume(): what happens now is not the subject's measured
        repetition. Called right after each of them; never raises (an error is kept for
        stop() to raise).

        Default: nothing, right only for a collector whose subject does nothing between
        its repetitions (a paused guest's VM exits); one that counts time, samples or
        reads anything host-wide must override it.
        """

    def resume(self) -> None:
        """Count again, right before the subject's next measured repetition (after a
        pause()); never raises (an error is kept for stop() to raise). Default: nothing."""

    @abc.abstractmethod
    def stop(self) -> list[Metric]:
        """End recording and return its metrics, of the manifest, dimensioned where one
        metric has several values ({"reason": "HLT"}), over the measured repetitions only.

        Called once, at the end of the cell (paused: after the last measured repetition's
        pause()), and only after a successful start(). Leaves nothing running, whether it
        returns or raises. A subject's process that exited meanwhile is no error: the
        collector counts what it recorded of it and says so in `warnings`.

        Raises CollectorError when the recording is unusable (a tool failed, the cgroup
        vanished); the cell's own results are kept.
        """

    @abc.abstractmethod
    def abort(self) -> None:
        """Stop recording without results: kill what start() started, forget its journal
        entries (undo them), stop its threads.

        Called instead of stop() when the cell is interrupted (Ctrl-C, SIGTERM, a target
        that died) and after start() raised, possibly before start() did anything. May be
        called more than once. Never raises.
        """


def running_at_start(collector: Collector, subject: Subject) -> dict[int, list[str]]:
    """pid -> /proc/PID/stat fields of the subject's processes still running as a
    collector starts; each one already gone is a warning of the collector's."""
    found = {}
    for pid in subject.pids:
        fields = proc_stat(pid, collector.proc_root)
        if fields is None or fields[0] == "Z":
            collector.warnings.append(f"{collector.name}: process {pid} of {subject.name} "
                                      "had exited before start; not counted")
        else:
            found[pid] = fields
    return found


def cgroup_dirs(collector: type[Collector], cgroup: str,
                controller: str = "cpuacct") -> list[Path]:
    """Where a Subject's cgroup may be: in v1's hierarchy of `controller`, in a v2
    hierarchy at the root (unified layout) or beside the v1 ones (hybrid)."""
    rel = cgroup.strip("/")
    return [collector.cgroup_root / controller / rel, collector.cgroup_root / rel,
            collector.cgroup_root / "unified" / rel]


def cgroup_pids(directory: Path) -> list[int]:
    """The processes in the cgroup at directory and in its descendants (v1's cgroup.procs
    lists a cgroup's own only); [] when it is gone."""
    pids: list[int] = []
    for parent, _, _ in os.walk(directory):
        try:
            pids += map(int, (Path(parent) / "cgroup.procs").read_text().split())
        except (OSError, ValueError):   # removed meanwhile: a container's, as its job ended
            continue
    return pids


def proc_stat(pid: int, proc_root: Path) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, so proc(5)'s field N is
    index N - 3 (state 0, utime 11, stime 12, starttime 19); None when pid is gone."""
    try:
        text = (proc_root / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may itself hold ") ".
    fields = text.rpartition(")")[2].split()
    return fields if len(fields) > 19 else None


# -- the registry of collectors ------------------------------------------------------------

def registered() -> dict[str, type[Collector]]:
    """Collector name -> class, built-in and third-party."""
    return plugin.plugins(Collector.group)  # type: ignore[return-value]


def get(name: str) -> type[Collector]:
    """The collector named `name`; VmtaxError naming the known ones when there is none."""
    return plugin.get(Collector.group, name)  # type: ignore[return-value]


def manifests() -> dict[str, Manifest]:
    """Collector name -> its metrics, without importing any collector (nor pydantic)."""
    return {name: found for name in registered()
            if (found := plugin.manifest(Collector.group, name, Manifest.from_json)) is not None}
