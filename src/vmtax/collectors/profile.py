"""profile: where a target's host processes spend CPU during a cell, as folded call stacks.

`perf record -e cpu-clock` (a software event: it needs no hardware PMU) samples the subject
from start to stop, with call graphs, into perf.data in the collector's scratch directory
(the runner's work directory, journaled for removal, so a killed vmtax leaves none).
At stop perf gets SIGINT and `perf script` resolves the samples' symbols (kallsyms for the
kernel, the binaries' symbol tables and debug info for QEMU, the workload and Go's runsc).

What is recorded:

- a subject with host processes (a guest's QEMU, a container that serves): their threads
  with `-t` (perf follows their new threads and children);
- a subject without (the bare host, a container per job): vmtax's own threads, so that
  perf follows the jobs vmtax starts during the cell. Each job is a tree of processes
  whose root is vmtax's child; a container job's root is its runtime's binary (as the
  runtime registry locates it), a bare-host job's root is anything else. Since the runner
  interleaves targets, each collector keeps only its own kind of tree.

Call graphs come from DWARF unwinding (`--call-graph dwarf`) by default: Debian builds
QEMU, sysbench and the C library without frame pointers, and frame-pointer stacks of those
are one frame deep (measured: sysbench's `-g` stacks stopped at the leaf, its DWARF ones
reached `_start`). The price is an 8 KiB stack copy per sample and a slower `perf script`;
Go (runsc) and the kernel unwind either way. `call_graph = "fp"` chooses frame pointers.

Stored, per thread class (QEMU: vcpu, io, main, other; gVisor: sentry and gofer by their
Go packages, and the sandboxed program the sentry runs; else the command name): the top
stacks folded ("comm;outer;...;leaf") as metrics of samples with a "stack" dimension, the
rest summed as "[other]" (150 stacks of at most 32 frames: tens of kilobytes a cell); the
top functions and DSOs by their own (leaf) samples; the share of leaf samples without a
symbol; the CPU time sampled; and perf's own CPU time during the cell against it (the
profile's overhead; the kernel's share of the sampling cost is charged to the sampled
tasks and is not in it); and, for each DSO of leaves perf named no symbol for, whether its
debug symbols were installed where perf reads them (/usr/lib/debug, by the build-id perf
recorded: a -dbgsym or -dbg package), so that the report advises installing only what is
missing.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from vmtax.core import plugin, runtime
from vmtax.core.collector import Collector, CollectorError, CollectorJournal, Subject
from vmtax.core.errors import ParseError
from vmtax.core.types import Metric, MetricSpec
from vmtax.core.text import first_line
from vmtax.helpers.perf_tool import PERF, perf_problem, record_message, spawn_record
from vmtax.host import machine, proc

PARANOID = Path("/proc/sys/kernel/perf_event_paranoid")
# perf's start and stop, on a host (a lab's are machine.lab_scaled: perf under TCG).
START_TIMEOUT = 20.0
STOP_TIMEOUT = 60.0
# perf script of a few minutes' DWARF samples on a slow, shared host.
SCRIPT_TIMEOUT = 600.0
OTHER = "[other]"
# Frames dropped from the root side of a deeper stack are shown as one.
ELIDED = "…"
# Kinds whose subject without host processes still has its jobs on this host, started by
# vmtax: the bare host's and containers' jobs. Any other kind (a remote machine over ssh)
# has nothing of its own here.
LOCAL_JOB_KINDS = ("native", "container")


class ProfileOptions(plugin.Options):
    frequency: int = plugin.option(
        499, "samples per second per CPU (perf record -F); odd, so as not to beat with "
        "periodic work", unit="Hz", ge=10, le=10000)
    call_graph: Literal["dwarf", "fp"] = plugin.option(
        "dwarf", "how stacks are unwound: DWARF (binaries without frame pointers, as "
        "Debian's) or frame pointers (cheaper)")
    stacks: int = plugin.option(
        150, "stacks kept per cell, the most sampled; the rest are summed as [other]",
        ge=1, le=5000)
    depth: int = plugin.option(
        32, "frames kept per stack, from the leaf; deeper ones are cut at the root side",
        ge=2, le=256)
    functions: int = plugin.option(
        60, "functions and DSOs kept per cell by their own samples", ge=1, le=1000)


# -- perf script's output ------------------------------------------------------------------

# A sample's header line: "comm  pid/tid  period" (the comm may hold spaces).
_SAMPLE = re.compile(r"^(?P<comm>\S.*?)\s+(?P<pid>-?\d+)/(?P<tid>-?\d+)\s+(?P<period>\d+)\s*$")
# Task events: "PERF_RECORD_FORK(cpid:ctid):(ppid:ptid)", "PERF_RECORD_COMM exec: NAME:pid/tid".
_FORK = re.compile(r"PERF_RECORD_FORK\((\d+):(\d+)\):\((\d+):(\d+)\)")
_EXEC = re.compile(r"PERF_RECORD_COMM exec: (.*):(\d+)/(\d+)\s*$")
_PERF_MAP = re.compile(r"^perf-\d+\.map$")
# A call-chain line: "  addr sym+off (dso)" or "  addr sym (dso)".
_FRAME = re.compile(r"^\s+[0-9a-f]+\s+(?P<sym>.*?)\s+\((?P<dso>.*)\)\s*$")


@dataclass
class Sample:
    comm: str
    pid: int
    tid: int
    period: int                      # ns of CPU time the sample stands for (cpu-clock)
    frames: list[tuple[str, str]]    # (symbol, DSO), leaf first; "[unknown]" unresolved


@dataclass
class Script:
    """perf script's samples and the process tree its task events draw."""
    samples: list[Sample] = field(default_factory=list)
    parent: dict[int, int] = field(default_factory=dict)    # pid -> parent pid
    exec_name: dict[int, str] = field(default_factory=dict)  # pid -> first program it ran


def parse_script(text: str) -> Script:
    """Samples and task events of `perf script --show-task-events -F
    comm,pid,tid,period,ip,sym,dso`; ParseError when it holds neither."""
    script = Script()
    current: Sample | None = None
    for line in text.splitlines():
        if not line.strip():
            current = None
            continue
        if current is not None and line[0].isspace():
            found = _FRAME.match(line)
            if found:
                sym = found["sym"]
                # perf prints "sym+0x1f" with --symoffset only; keep the bare name either way.
                sym = re.sub(r"\+0x[0-9a-f]+$", "", sym)
                dso = os.path.basename(found["dso"]) or "[unknown]"
                # Anonymous executable memory (JIT code) is named by its process: one name
                # for it in every process, so that per-job processes add up.
                current.frames.append((sym, _PERF_MAP.sub("perf-PID.map", dso)))
            continue
        if "PERF_RECORD_" in line:
            current = None
            fork = _FORK.search(line)
            if fork and fork[1] != fork[3]:   # a new process, not a new thread
                script.parent.setdefault(int(fork[1]), int(fork[3]))
            exe = _EXEC.search(line)
            if exe:
                script.exec_name.setdefault(int(exe[2]), exe[1].strip())
            continue
        header = _SAMPLE.match(line)
        if header:
            current = Sample(header["comm"].strip(), int(header["pid"]), int(header["tid"]),
                             int(header["period"]), [])
            script.samples.append(current)
    for sample in script.samples:
        _place_inlined(sample.frames)
    if not script.samples and not script.parent and text.strip():
        raise ParseError("no samples in perf script's output")
    return script


def _place_inlined(frames: list[tuple[str, str]]) -> None:
    """perf names the DSO of an inlined frame "inlined": it is that of the function it
    was inlined into, the next frame out."""
    dso = "[unknown]"
    for i in reversed(range(len(frames))):
        if frames[i][1] == "inlined":
            frames[i] = (frames[i][0], dso)
        else:
            dso = frames[i][1]


# -- what a sample belongs to ----------------------------------------------------------------

def _frame_name(sym: str, dso: str) -> str:
    """A frame as stored: its symbol, or its DSO in brackets when perf found no symbol."""
    sym = sym.strip()
    if sym and sym != "[unknown]":
        return sym.replace(";", ":")   # ";" separates folded frames
    return f"[{dso}]" if dso and dso != "[unknown]" else "[unknown]"


def unresolved(frame: str) -> bool:
    return frame.startswith("[") and frame.endswith("]")


def qemu_class(sample: Sample, main_pid: int, vcpus: set[int]) -> str:
    """QEMU's thread classes: vCPU threads (KVM or TCG execution, translation included),
    the main loop, and I/O: the thread pool's workers (block I/O) and iothreads, which
    are all the other threads a guest's QEMU starts while it runs (its RCU thread is
    not recorded). Threads are named only with `-name debug-threads=on`."""
    if sample.tid in vcpus:
        return "vcpu"
    if sample.tid == main_pid:
        return "main"
    return "io"


def gvisor_class(sample: Sample) -> str | None:
    """gVisor's processes by the Go packages on a stack: the sentry (the kernel in user
    space) or the gofer (file I/O on the sandbox's behalf); None: neither shows."""
    symbols = " ".join(sym for sym, _ in sample.frames)
    if "pkg/sentry" in symbols:
        return "sentry"
    if "fsgofer" in symbols or "pkg/lisafs" in symbols:
        return "gofer"
    return None


def process_classes(script: Script, samples: list[Sample]) -> dict[int, str]:
    """pid -> class of the processes that are gVisor's (every sample of a process gets the
    class any of its stacks shows, since most of a sentry's samples are in the host kernel
    alone); the processes a sentry started run the sandboxed program (systrap's stubs)."""
    found: dict[int, str] = {}
    for sample in samples:
        if sample.pid not in found and (cls := gvisor_class(sample)) is not None:
            found[sample.pid] = cls
    for sample in samples:
        parent = script.parent.get(sample.pid)
        if sample.pid not in found and parent is not None and found.get(parent) == "sentry":
            found[sample.pid] = "sandboxed program"
    return found


@dataclass
class Profile:
    """One cell's profile, reduced: samples per class, folded stacks, leaf functions."""
    stacks: Counter[tuple[str, str]] = field(default_factory=Counter)     # (class, folded)
    functions: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # class, fn, dso
    dsos: Counter[tuple[str, str]] = field(default_factory=Counter)      # (class, dso)
    samples: Counter[str] = field(default_factory=Counter)               # class
    period_ns: int = 0
    unresolved: int = 0

    def add(self, cls: str, sample: Sample, depth: int) -> None:
        names = [_frame_name(sym, dso) for sym, dso in sample.frames] or ["[unknown]"]
        kept = names[:depth]
        if len(names) > depth:
            kept.append(ELIDED)
        self.stacks[(cls, ";".join([sample.comm.replace(";", ":"), *reversed(kept)]))] += 1
        leaf_dso = sample.frames[0][1] if sample.frames else "[unknown]"
        self.functions[(cls, names[0], leaf_dso)] += 1
        self.dsos[(cls, leaf_dso)] += 1
        self.samples[cls] += 1
        self.period_ns += sample.period
        self.unresolved += unresolved(names[0])

    def stripped(self) -> set[str]:
        """The DSOs of leaf frames perf named no symbol for (code generated at run time
        aside: it has no symbol file)."""
        return {dso for (_, fn, dso) in self.functions
                if unresolved(fn) and dso not in ("[unknown]", "perf-PID.map")}


# Where perf looks for a binary's separate debug symbols (Debian's -dbgsym and -dbg packages
# install them by build-id).
DEBUG_DIR = Path("/usr/lib/debug")


def parse_buildids(text: str) -> list[tuple[str, str]]:
    """(build-id, path) of each DSO `perf buildid-list` names."""
    return [(found[1], found[2]) for line in text.splitlines()
            if (found := re.match(r"^([0-9a-f]{8,})\s+(/\S.*)$", line.strip()))]


def debug_file(path: str, build_id: str, root: Path = DEBUG_DIR) -> Path | None:
    """The separate debug symbols of the binary at path with this build-id, where perf
    finds them (by build-id, or beside the binary's path under root); None: none there."""
    for candidate in (root / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug",
                      root / path.lstrip("/"), root / f"{path.lstrip('/')}.debug"):
        if candidate.is_file():
            return candidate
    return None


def own_samples(script: Script, subject: Subject, recorded: set[int], launchers: set[str],
                recorder: str = "") -> list[tuple[str, Sample]]:
    """The subject's samples, each with its thread class.

    recorded: the pids perf attached to; with the subject's own pids, all samples are its.
    Otherwise vmtax's pid (whose command name is `recorder`): a sample's process tree (its
    ancestor that is vmtax's child) is a container job when that root ran a container
    runtime's binary (launchers), and vmtax's own when it ran perf (another collector's
    perf script); a fork of vmtax's that has not run its program yet is left out too.
    A VMM's (Subject.vmm_process) threads are classed by its vCPU threads."""
    vcpus = set(subject.vcpu_threads) if subject.vmm_process else set()
    kept: list[Sample] = []
    for sample in script.samples:
        if sample.pid <= 0:
            continue
        if not subject.pids:
            if sample.pid in recorded or sample.comm == recorder:
                continue
            root, seen = sample.pid, {sample.pid}
            while ((up := script.parent.get(root)) is not None and up not in recorded
                   and up not in seen):
                root = up
                seen.add(up)
            program = script.exec_name.get(root, "")
            if program == PERF:
                continue
            if runs_launcher(program, launchers) != (subject.kind == "container"):
                continue
        kept.append(sample)
    if vcpus:
        return [(qemu_class(sample, subject.pids[0], vcpus), sample) for sample in kept]
    classes = process_classes(script, kept)
    return [(classes.get(sample.pid, sample.comm), sample) for sample in kept]


def launcher_names(subject: Subject) -> set[str]:
    """Names of the container runtimes whose jobs are the subject's (a container's own
    runtime) or not (all of them, for the bare host's collector, which leaves them out)."""
    names = set(runtime.runtimes())
    variant = subject.name.partition(":")[2].partition("@")[0]
    if subject.kind == "container" and variant in names:
        return {variant}
    return names


def runs_launcher(program: str, launchers: set[str]) -> bool:
    """Did a job's root process run one of the runtimes? A runtime's binary is named as the
    runtime, or is shared by its variants (runsc for runsc-ptrace); the kernel keeps 15
    characters of a program's name."""
    return bool(program) and any(name[:15] == program or name.startswith(program + "-")
                                 for name in launchers)


# -- the host ---------------------------------------------------------------------------------

def host_problem() -> str | None:
    """Why perf cannot sample CPU time here, in one line; None when it can."""
    problem = perf_problem()
    if problem is not None:
        return problem
    if os.geteuid() != 0:
        try:
            paranoid = int(PARANOID.read_text())
        except (OSError, ValueError):
            paranoid = 2
        # Other users' processes (a container runtime's, QEMU run by root) and kernel
        # stacks need paranoid <= 0 without CAP_PERFMON.
        if paranoid > 0:
            return ("no permission to sample other processes with kernel stacks: run vmtax "
                    f"as root, or set kernel.perf_event_paranoid=0 (now {paranoid})")
    return None


class Profiler(Collector):
    name = "profile"
    description = ("Where the subject's host processes spend CPU: perf record -e cpu-clock "
                   "with call graphs, stored as folded stacks per thread class")
    packages = ("linux-perf",)
    Options = ProfileOptions
    options: ProfileOptions
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec("stack samples", "samples", False,
                   "samples of one folded call stack (comm;outer;...;leaf)",
                   dimensions=("class", "stack"), breakdown=True),
        MetricSpec("function samples", "samples", False,
                   "samples whose leaf frame is this function",
                   dimensions=("class", "function", "dso"), breakdown=True),
        MetricSpec("dso samples", "samples", False, "samples whose leaf frame is in this DSO",
                   dimensions=("class", "dso"), breakdown=True),
        MetricSpec("class samples", "samples", False, "samples of one thread class",
                   dimensions=("class",), breakdown=True),
        MetricSpec("sampled cpu", "s", False, "CPU time the samples stand for",
                   bookkeeping=True),
        MetricSpec("unresolved share", "%", False, "samples whose leaf has no symbol",
                   bookkeeping=True),
        MetricSpec("profile cpu", "s", False, "perf record's own CPU time during the cell",
                   bookkeeping=True),
        MetricSpec("profile overhead", "%", False,
                   "perf record's CPU time against the CPU time it sampled",
                   bookkeeping=True),
        MetricSpec("debug symbols", "flag", True,
                   "1 when a DSO with samples perf named no symbol for has its debug symbols "
                   "installed where perf reads them (/usr/lib/debug), else 0",
                   dimensions=("dso",), bookkeeping=True),
    )

    def __init__(self, options: plugin.Options, *, journal: CollectorJournal,
                 scratch: Path) -> None:
        super().__init__(options, journal=journal, scratch=scratch)
        self._perf: subprocess.Popen[bytes] | None = None
        self._token: int | None = None
        self._subject: Subject | None = None
        self._recorded: list[int] = []
        self._recorder = ""        # vmtax's command name, when its own jobs are recorded
        self._failure: str | None = None   # of a pause or resume, raised by stop()
        self._perf_cpu = 0.0
        self._control: int | None = None   # perf's control and acknowledgement FIFOs
        self._ack: int | None = None

    @classmethod
    def unavailable(cls, subject: Subject) -> str | None:
        if not subject.pids and subject.kind not in LOCAL_JOB_KINDS:
            return f"nothing of {subject.name} runs on this host to profile"
        return host_problem()

    @classmethod
    def doctor(cls) -> tuple[bool, str] | None:
        problem = host_problem()
        if problem is not None:
            return False, f"cannot profile: {problem}"
        return True, "perf record -e cpu-clock can profile targets' host processes " \
                     "(--collect profile)"

    @classmethod
    def _threads(cls, pids: list[int], vcpus: list[int]) -> list[int]:
        """The threads perf attaches to; their later threads and children are followed.

        perf 6.1 spins on the event of an attached thread that exits (measured: 277,479
        wake-ups and 0.9 s of CPU in 3 s), and QEMU's thread-pool workers exit when idle.
        So a guest's QEMU is attached by its long-lived threads, the main loop and the
        vCPUs, whose new workers are followed; another subject by all its threads."""
        found = []
        for pid in pids:
            try:
                tasks = sorted(int(t.name) for t in (cls.proc_root / str(pid) / "task").iterdir())
            except OSError:
                continue
            found += [tid for tid in tasks if not vcpus or tid == pid or tid in vcpus]
        return found

    @property
    def data(self) -> Path:
        return self.scratch / "perf.data"

    def start(self, subject: Subject) -> None:
        self._subject = subject
        self._recorded = list(subject.pids) or [os.getpid()]
        threads = self._threads(self._recorded,
                                subject.vcpu_threads if subject.vmm_process else [])
        if not threads:
            raise CollectorError(f"{self.name}: none of {subject.name}'s processes "
                                 f"({', '.join(map(str, self._recorded))}) is running")
        if not subject.pids:   # vmtax's own forks are told apart by its command name
            try:
                self._recorder = (self.proc_root / str(os.getpid()) / "comm").read_text().strip()
            except OSError:
                pass
        control, ack = self.scratch / "control", self.scratch / "ack"
        os.mkfifo(control)
        os.mkfifo(ack)
        # Started disabled (-D -1) and enabled through its control FIFO: perf acknowledges
        # once it has described the processes' memory maps and enabled its events. A job
        # forked before that would be sampled without symbols or call chains.
        argv = [PERF, "record", "-e", "cpu-clock", "-F", str(self.options.frequency),
                "--call-graph", self.options.call_graph, "-o", str(self.data),
                "-D", "-1", "--control", f"fifo:{control},{ack}",
                # -t alone leaves out the threads' later threads and children
                "--no-no-inherit", "-t", ",".join(map(str, threads))]
        self._perf = spawn_record(argv, self.scratch, self.name)
        self._token = self.journal.process(self._perf.pid)
        deadline = time.monotonic() + machine.lab_scaled(START_TIMEOUT)
        while self._control is None:
            try:   # ENXIO until perf opens the FIFO for reading
                self._control = os.open(control, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                self._check_answering(deadline)
                time.sleep(0.02)
        self._ack = os.open(ack, os.O_RDONLY | os.O_NONBLOCK)
        self._command("enable", deadline)

    def _command(self, command: str, deadline: float) -> None:
        """Have perf record carry out `command` ("enable", "disable") and acknowledge it."""
        assert self._control is not None and self._ack is not None
        os.write(self._control, f"{command}\n".encode())
        while not select.select([self._ack], [], [], 0.05)[0] or not os.read(self._ack, 64):
            self._check_answering(deadline)

    def pause(self) -> None:
        """No samples between the subject's measured repetitions (other targets', warm-ups,
        cache drops): perf's events are disabled until resume()."""
        self._toggle("disable")

    def resume(self) -> None:
        self._toggle("enable")

    def _toggle(self, command: str) -> None:
        if self._control is None or self._failure is not None:
            return
        try:
            self._command(command, time.monotonic() + machine.lab_scaled(START_TIMEOUT))
        except CollectorError as exc:   # said by stop()
            self._failure = str(exc)
        except OSError as exc:
            self._failure = f"{self.name}: cannot {command} perf record's events: {exc}"

    def _check_answering(self, deadline: float) -> None:
        assert self._perf is not None
        if self._perf.poll() is not None:
            raise CollectorError(f"{self.name}: perf record ended (exit code "
                                 f"{self._perf.returncode}): {record_message(self.scratch)}")
        if time.monotonic() > deadline:
            raise CollectorError(f"{self.name}: perf record did not answer within "
                                 f"{machine.lab_scaled(START_TIMEOUT):g} s")

    def _reap(self, perf: subprocess.Popen[bytes]) -> None:
        """Wait for perf after SIGINT and take its CPU time (user + system) from wait4."""
        deadline = time.monotonic() + machine.lab_scaled(STOP_TIMEOUT)
        while True:
            pid, status, usage = os.wait4(perf.pid, os.WNOHANG)
            if pid == perf.pid:
                perf.returncode = os.waitstatus_to_exitcode(status)
                self._perf_cpu = usage.ru_utime + usage.ru_stime
                return
            if time.monotonic() > deadline:
                self.abort()
                raise CollectorError(f"{self.name}: perf record did not finish within "
                                     f"{machine.lab_scaled(STOP_TIMEOUT):g} s of SIGINT")
            time.sleep(0.02)

    def stop(self) -> list[Metric]:
        perf, subject = self._perf, self._subject
        assert perf is not None and subject is not None   # stop() follows a good start()
        if perf.returncode is None:
            perf.send_signal(signal.SIGINT)
            self._reap(perf)
        self._forget()
        if self._failure is not None:
            raise CollectorError(self._failure)
        if perf.returncode not in (0, -signal.SIGINT, 128 + signal.SIGINT):
            raise CollectorError(f"{self.name}: perf record failed (exit code "
                                 f"{perf.returncode}): {record_message(self.scratch)}")
        out = proc.run([PERF, "script", "-i", str(self.data), "--show-task-events",
                        "-F", "comm,pid,tid,period,ip,sym,dso"],
                       cwd=str(self.scratch), timeout=SCRIPT_TIMEOUT)
        if out.exit_code != 0:
            why = first_line(out.stderr) or f"exit code {out.exit_code}"
            raise CollectorError(f"{self.name}: perf script failed: {why}")
        try:
            script = parse_script(out.stdout)
        except ParseError as exc:
            raise CollectorError(f"{self.name}: {exc}") from None
        launchers = set() if subject.pids else launcher_names(subject)
        profile = Profile()
        for cls, sample in own_samples(script, subject, set(self._recorded), launchers,
                                       self._recorder):
            profile.add(cls, sample, self.options.depth)
        if not profile.samples:
            self.warnings.append(f"{self.name}: no samples of {subject.name} were recorded")
        return self._metrics(profile) + [
            self.metric("debug symbols", float(found), dso=dso)
            for dso, found in self._debug_symbols(profile.stripped()).items()]

    def _debug_symbols(self, dsos: set[str]) -> dict[str, bool]:
        """Whether each of these DSOs (by name) has debug symbols installed where perf
        reads them, by the build-ids perf recorded; {} when perf cannot list them."""
        if not dsos:
            return {}
        out = proc.run([PERF, "buildid-list", "-i", str(self.data)],
                       cwd=str(self.scratch), timeout=60.0)
        if out.exit_code != 0:
            return {}
        return {os.path.basename(path): debug_file(path, build_id) is not None
                for build_id, path in parse_buildids(out.stdout)
                if os.path.basename(path) in dsos}

    def _metrics(self, profile: Profile) -> list[Metric]:
        total = sum(profile.samples.values())
        metrics = [self.metric("class samples", n, **{"class": c})
                   for c, n in profile.samples.most_common()]
        kept = profile.stacks.most_common(self.options.stacks)
        metrics += [self.metric("stack samples", n, **{"class": c, "stack": s})
                    for (c, s), n in kept]
        rest = total - sum(n for _, n in kept)
        if rest:
            metrics.append(self.metric("stack samples", rest, **{"class": OTHER,
                                                                  "stack": OTHER}))
        metrics += [self.metric("function samples", n, **{"class": c, "function": f, "dso": d})
                    for (c, f, d), n in profile.functions.most_common(self.options.functions)]
        metrics += [self.metric("dso samples", n, **{"class": c, "dso": d})
                    for (c, d), n in profile.dsos.most_common(self.options.functions)]
        sampled = profile.period_ns / 1e9
        metrics += [self.metric("sampled cpu", sampled),
                    self.metric("unresolved share", 100 * profile.unresolved / total
                                if total else 0.0),
                    self.metric("profile cpu", self._perf_cpu)]
        if sampled > 0:
            metrics.append(self.metric("profile overhead", 100 * self._perf_cpu / sampled))
        return metrics

    def _forget(self) -> None:
        for fd in (self._control, self._ack):
            if fd is not None:
                os.close(fd)
        self._control = self._ack = None
        if self._token is not None:
            self.journal.forget(self._token)
            self._token = None

    def abort(self) -> None:
        if self._perf is not None and self._perf.returncode is None:
            proc.kill_group(self._perf)
        self._forget()
