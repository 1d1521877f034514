"""Host-side CPU profiles of stored cells: where each cell's CPU time went, which functions
grew from one cell to another per unit of work, and what the symbols suggest.

A profile is what a collector that declares folded stacks stored with a cell (phase
"collect"): a collector is one when its manifest has STACKS with a "stack" dimension,
found in the collector registry. Its metrics are samples: of folded stacks ("comm;outer;
...;leaf", per thread class), of leaf functions and DSOs, of thread classes; and the CPU
time they stand for, the unresolved share and the profiler's overhead.

Time per unit of work: a function's share of the samples times the CPU time sampled,
divided by the work the cell did in its measured repetitions, from the workload's primary
metric: a rate (events/s, MB/s) times each repetition's duration, else one unit per
repetition. So cells of different lengths compare, and a diff ranks functions by the CPU
time they add to each event, MB or repetition.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from vmtax.core import collector, workload
from vmtax.core.errors import VmtaxError
from vmtax.results.store import Rep, Run, Store

# The stored format of a profile: its metrics' names (the collector's manifest).
STACKS = "stack samples"
FUNCTIONS = "function samples"
DSOS = "dso samples"
CLASSES = "class samples"
DEBUG = "debug symbols"
OTHER = "[other]"
# An unresolved share (%) worth a word on why and what helps.
UNRESOLVED_NOTE = 10.0
# Where perf puts code generated at run time: the map file a JIT (or TCG) may write.
GENERATED = re.compile(r"perf-(\d+|PID)\.map")


def profile_collectors() -> list[str]:
    """Names of the installed collectors that store folded stacks."""
    return [name for name, found in collector.manifests().items()
            if any(s.name == STACKS and "stack" in s.dimensions for s in found.metrics)]


@dataclass
class Share:
    name: str                    # function, DSO or thread class
    samples: float
    share: float                 # % of the cell's samples
    dso: str = ""
    cls: str = ""                # thread class ("" for all together)


@dataclass
class CellProfile:
    run_id: str
    target: str
    workload: str
    params: dict[str, Any]
    samples: float
    classes: list[Share]
    functions: list[Share]       # by leaf samples, each class apart
    dsos: list[Share]
    stacks: dict[str, float]     # "[class;]comm;...;leaf" -> samples ([other] summed)
    sampled_cpu: float | None    # s
    unresolved: float | None     # % of samples
    overhead: float | None       # % of the sampled CPU time, perf's own
    work: float | None           # units of work in the measured repetitions
    work_unit: str
    hints: list[str] = field(default_factory=list)
    # Whether a DSO with unresolved samples had its debug symbols installed where perf
    # reads them, as the collector found (DSOs it did not look at are not in it).
    debug: dict[str, bool] = field(default_factory=dict)

    @property
    def label(self) -> str:
        params = ",".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.target} · {self.workload}" + (f" ({params})" if params else "")

    def seconds_per_unit(self, samples: float) -> float | None:
        """CPU seconds per unit of work that `samples` of this cell stand for."""
        if not self.samples or self.sampled_cpu is None or not self.work:
            return None
        return samples / self.samples * self.sampled_cpu / self.work

    @property
    def total_per_unit(self) -> float | None:
        """The cell's whole sampled CPU time per unit of work, µs."""
        seconds = self.seconds_per_unit(self.samples)
        return None if seconds is None else seconds * 1e6

    @property
    def unit(self) -> str:
        """Its unit of work in the singular: "event", "MB", "repetition"."""
        return (self.work_unit.removesuffix("s") if self.work_unit != "s"
                else self.work_unit) or "unit of work"

    @property
    def symbols_note(self) -> str | None:
        """Why so many samples have no symbol and what would give them one; None when
        few lack one. Code generated at run time (TCG's translation blocks, a JIT: perf
        names it perf-PID.map) has no symbols anywhere; stripped binaries do, apart."""
        if self.unresolved is None or self.unresolved < UNRESOLVED_NOTE:
            return None
        unnamed = [s for s in self.functions if s.name.startswith("[")]
        generated = sum(s.share for s in unnamed if GENERATED.search(f"{s.name} {s.dso}"))
        weights: dict[str, float] = {}
        for share in unnamed:
            if share.dso and not GENERATED.search(f"{share.name} {share.dso}"):
                weights[share.dso] = weights.get(share.dso, 0.0) + share.samples
        top = sorted(weights, key=lambda dso: -weights[dso])[:3]
        # Advice to install what is installed already would send the user in circles.
        installed = [dso for dso in weights if self.debug.get(dso)]
        top = [dso for dso in top if dso not in installed]
        text = f"{self.unresolved:.1f}% of samples have no symbol"
        if generated >= 1:
            text += (f"; {generated:.1f}% are code generated at run time (perf-PID.map: "
                     "TCG's translation blocks, a JIT), which no symbol file names")
        if installed:
            text += (f"; {', '.join(installed)} {'has' if len(installed) == 1 else 'have'} "
                     "debug symbols installed where perf reads them (/usr/lib/debug), yet "
                     "perf named no function for these samples: code outside any function "
                     "they name, or symbols perf could not read")
        if top or (generated < 1 and not installed):
            most = f" (most in {', '.join(top)})" if top else ""
            rest = "it" if generated < 1 and not installed else "the rest"
            text += (f"; {rest} is in binaries Debian strips{most}: install their -dbgsym "
                     "packages from the debian-debug archive (perf reads /usr/lib/debug), "
                     "or use a perf built with debuginfod and "
                     "DEBUGINFOD_URLS=https://debuginfod.debian.net")
        return text


def _work(run: Run, rep: Rep) -> tuple[float | None, str]:
    """Units of work of the cell's measured repetitions, and the unit's name."""
    cls = workload.registered().get(rep.workload)
    measured = [r for r in run.reps if r.phase == "measure" and r.status == "ok"
                and r.target == rep.target and r.workload == rep.workload
                and r.params == rep.params]
    if not measured:
        return None, ""
    if cls is None:
        return float(len(measured)), "repetition"
    primary = cls.primary_metric()
    total, unit = 0.0, ""
    for r in measured:
        metric = next((m for m in r.metrics if m.name == primary and not m.dimensions), None)
        seconds = r.guest_elapsed or r.host_elapsed
        if metric is None or not metric.unit.endswith("/s") or not seconds:
            return float(len(measured)), "repetition"
        total += metric.value * seconds
        unit = metric.unit.removesuffix("/s")
    return total, unit


def cell_profile(run: Run, rep: Rep) -> CellProfile:
    classes: dict[str, float] = {}
    functions: list[Share] = []
    dsos: list[Share] = []
    stacks: dict[str, float] = {}
    plain: dict[str, float] = {}
    debug: dict[str, bool] = {}
    for m in rep.metrics:
        d = m.dimensions
        if m.name == CLASSES:
            classes[d["class"]] = classes.get(d["class"], 0.0) + m.value
        elif m.name == STACKS:
            # The class as the root frame, unless it is the command name already there.
            if d["stack"] == OTHER or d["stack"].startswith(f"{d['class']};"):
                key = d["stack"]
            else:
                key = f"{d['class']};{d['stack']}"
            stacks[key] = stacks.get(key, 0.0) + m.value
        elif m.name == FUNCTIONS:
            functions.append(Share(d["function"], m.value, 0.0, d.get("dso", ""),
                                   d.get("class", "")))
        elif m.name == DSOS:
            dsos.append(Share(d["dso"], m.value, 0.0, d["dso"], d.get("class", "")))
        elif m.name == DEBUG:
            debug[d["dso"]] = bool(m.value)
        elif not d:
            plain[m.name] = m.value
    total = sum(classes.values())
    for share in (*functions, *dsos):
        share.share = 100 * share.samples / total if total else 0.0
    work, unit = _work(run, rep)
    profile = CellProfile(
        run.id, rep.target, rep.workload, rep.params, total,
        [Share(c, n, 100 * n / total if total else 0.0, cls=c)
         for c, n in sorted(classes.items(), key=lambda item: -item[1])],
        sorted(functions, key=lambda s: -s.samples), sorted(dsos, key=lambda s: -s.samples),
        stacks, plain.get("sampled cpu"), plain.get("unresolved share"),
        plain.get("profile overhead"), work, unit)
    profile.hints = hints(profile)
    profile.debug = debug
    return profile


def run_cells(run: Run, target: str = "") -> tuple[list[CellProfile], list[str]]:
    """The run's profiled cells (of one target, if given), and why each other cell asked
    to be profiled has none ("vm:tcg · fileio: profile: unavailable — ...")."""
    names = profile_collectors()
    found, missing = [], []
    for rep in run.reps:
        if (rep.phase != "collect" or len(rep.argv) != 1 or rep.argv[0] not in names
                or target not in ("", rep.target)):
            continue
        if any(m.name == STACKS for m in rep.metrics):
            found.append(cell_profile(run, rep))
        else:
            missing.append(f"{rep.target} · {rep.workload}: {rep.error or 'no samples'}")
    return found, missing


def cells(store: Store, spec: str) -> tuple[list[CellProfile], list[str]]:
    """The profiles of RUN or RUN:TARGET (a spec as `compare` takes), and why each other
    cell asked to be profiled has none; VmtaxError when there is no profile."""
    run_id, _, target = spec.partition(":")
    run = store.load_run(run_id)
    if target and target not in run.targets:
        raise VmtaxError(f"run {run.id} has no target {target!r}; it has: "
                         + ", ".join(run.targets))
    found, missing = run_cells(run, target)
    if not found:
        names = profile_collectors()
        why = "; ".join(missing) if missing else (
            "it was not run with --collect " + " or ".join(names) if names
            else "no collector of profiles is installed")
        raise VmtaxError(f"{spec}: no profile stored ({why})")
    return found, missing


# -- A against B -------------------------------------------------------------------------------

@dataclass
class Change:
    function: str
    dso: str
    share_a: float               # % of A's samples (0: not among A's kept functions)
    share_b: float
    per_unit_a: float | None     # CPU µs per unit of work
    per_unit_b: float | None
    added: float | None          # µs per unit of work, B - A


def _by_function(cell: CellProfile) -> dict[tuple[str, str], float]:
    """Leaf samples per (function, DSO), thread classes together."""
    found: dict[tuple[str, str], float] = {}
    for share in cell.functions:
        found[(share.name, share.dso)] = found.get((share.name, share.dso), 0.0) + share.samples
    return found


def diff(a: CellProfile, b: CellProfile) -> list[Change]:
    """Functions whose CPU time per unit of work rose from A to B, the most first (by
    share where either side lacks its work or CPU time)."""
    fa, fb = _by_function(a), _by_function(b)
    changes = []
    for key in fa.keys() | fb.keys():
        na, nb = fa.get(key, 0.0), fb.get(key, 0.0)
        ua, ub = a.seconds_per_unit(na), b.seconds_per_unit(nb)
        added = (ub - ua) * 1e6 if ua is not None and ub is not None else None
        changes.append(Change(key[0], key[1], 100 * na / a.samples if a.samples else 0.0,
                              100 * nb / b.samples if b.samples else 0.0,
                              None if ua is None else ua * 1e6,
                              None if ub is None else ub * 1e6, added))
    if all(c.added is not None for c in changes):
        changes.sort(key=lambda c: -(c.added or 0.0))
        return [c for c in changes if (c.added or 0.0) > 0]
    changes.sort(key=lambda c: -(c.share_b - c.share_a))
    return [c for c in changes if c.share_b > c.share_a]


def pair(a: list[CellProfile], b: list[CellProfile]) -> list[tuple[CellProfile, CellProfile]]:
    """Cells of A and B of the same workload and parameters; VmtaxError when none pair or
    one side has several targets of one workload (name one as RUN:TARGET)."""
    def key(cell: CellProfile) -> tuple[str, str]:
        return cell.workload, repr(sorted(cell.params.items()))
    for side in (a, b):
        keys = [key(c) for c in side]
        if len(keys) != len(set(keys)):
            raise VmtaxError("several targets profiled one workload: name one as RUN:TARGET")
    others = {key(c): c for c in b}
    pairs = [(c, others[key(c)]) for c in a if key(c) in others]
    if not pairs:
        raise VmtaxError("A and B have no profiled workload in common")
    return pairs


# -- interpretation hints ----------------------------------------------------------------------

# What a frame's name suggests, as (hypothesis, pattern over a stack's frames).
HINTS = (
    ("TCG translating guest code (translation blocks being generated)",
     re.compile(r"^(tb_gen_code|tcg_gen_code|translator_loop|gen_intermediate_code|"
                r"tcg_optimize|tcg_reg_alloc\w*|disas_insn)$")),
    ("code in anonymous executable memory, without symbols (perf-PID.map): TCG's generated "
     "code in QEMU, the sandboxed program in gVisor",
     re.compile(r"^\[perf-(\d+|PID)\.map\]$")),
    ("QEMU's block layer and asynchronous I/O (its thread pool, io_uring or Linux AIO)",
     re.compile(r"^(bdrv_\w+|blk_aio_\w+|blk_co_\w+|aio_dispatch\w*|thread_pool_\w+|"
                r"worker_thread|luring_\w+|laio_\w+|raw_co_\w+)$")),
    ("gVisor's sentry handling the workload's system calls",
     re.compile(r"pkg/sentry/(syscalls|kernel\.\(\*Task\)\.doSyscall)")),
    ("gVisor's gofer doing file I/O for the sandbox",
     re.compile(r"(fsgofer|pkg/lisafs)")),
    ("the overlay filesystem (a container's layered root)",
     re.compile(r"^ovl_\w+")),
    ("seccomp filtering of system calls",
     re.compile(r"(seccomp|^bpf_prog_run)")),
)


def hint_shares(cell: CellProfile) -> list[tuple[str, float]]:
    """Per hypothesis, the % of the cell's samples whose stack has a frame that suggests
    it (of the stacks kept: those summed as [other] are not read)."""
    found: dict[str, float] = {}
    for stack, samples in cell.stacks.items():
        frames = stack.split(";")
        for text, pattern in HINTS:
            if any(pattern.search(frame) for frame in frames):
                found[text] = found.get(text, 0.0) + samples
    return [(text, 100 * n / cell.samples)
            for text, n in sorted(found.items(), key=lambda item: -item[1]) if cell.samples]


# Hypotheses supported by fewer samples (%) than this are not put forward.
HINT_LEAST = 2.0


def hints(cell: CellProfile, least: float = HINT_LEAST) -> list[str]:
    """Hypotheses (never facts) of where the cell's time goes, with the share that
    supports each; those under `least` % are left out."""
    return [f"perhaps {text}: {share:.1f}% of samples have such frames"
            for text, share in hint_shares(cell) if share >= least]


def top_hypotheses(cells: list[CellProfile]) -> dict[str, str]:
    """Per target, the hypothesis its profiled cells (run_cells) support most (HINT_LEAST
    applies), with the share and the workload it was read from."""
    best: dict[str, tuple[float, str]] = {}
    for cell in cells:
        for text, share in hint_shares(cell)[:1]:
            if share >= HINT_LEAST and share > best.get(cell.target, (0.0, ""))[0]:
                best[cell.target] = (share, f"perhaps {text}: {share:.1f}% of its host "
                                            f"CPU samples in {cell.workload} have such frames")
    return {target: line for target, (_, line) in best.items()}


def as_json(cell: CellProfile, top: int) -> dict[str, Any]:
    return {"run": cell.run_id, "target": cell.target, "workload": cell.workload,
            "params": cell.params, "samples": cell.samples, "sampled_cpu_s": cell.sampled_cpu,
            "unresolved_percent": cell.unresolved, "overhead_percent": cell.overhead,
            "work": cell.work, "work_unit": cell.work_unit,
            "classes": [vars(s) for s in cell.classes],
            "functions": [vars(s) for s in cell.functions[:top]],
            "dsos": [vars(s) for s in cell.dsos[:top]], "hints": cell.hints}
