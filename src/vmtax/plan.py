"""A plan: targets × workloads × repetitions, and how to run them.

`classic()` is E1 (native vs container vs VM on the five sysbench metrics), the default
of `vmtax run`. Plans serialize to plain dicts so the exact plan is stored with each run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from vmtax import targets, workloads
from vmtax.errors import VmtaxError

CLASSIC_TARGETS = ("native", "container", "vm")
CLASSIC_WORKLOADS = ("cpu", "threads", "memory", "fileio", "mutex")
# Short enough that the classic plan takes a few minutes here even under TCG,
# long enough that sysbench's start-up is noise next to the measured interval.
DEFAULT_TIME = 2
# Run-to-run noise here is ~1% whatever --time is, so runs are what buys precision: at 3
# per side a 5% change reaches p < 0.01 (t-test, 4 df) only about 2 times in 3; at 5 per
# side (8 df) nearly always. `make bench-stats` measures it.
DEFAULT_RUNS = 5


@dataclass
class TargetSpec:
    name: str
    kind: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class WorkloadSpec:
    name: str                     # workload type, e.g. "cpu"
    params: dict[str, Any] = field(default_factory=dict)

    def make(self, time: int | None):
        cls = workloads.get(self.name)
        params = dict(self.params)
        if time is not None and cls.time_param and cls.time_param not in params:
            params[cls.time_param] = time
        return cls(params)


@dataclass
class Plan:
    targets: list[TargetSpec]
    workloads: list[WorkloadSpec]
    runs: int = DEFAULT_RUNS
    warmup: int = 1
    time: int | None = DEFAULT_TIME   # seconds (sysbench takes whole seconds)
    baseline: str | None = None   # target the ratios are relative to
    interleave: bool = True       # A B B A order across targets, so drift cancels
    # Adaptive repetition: with max_runs set, `runs` is the minimum and each target
    # repeats a workload until its primary metric's median CI half-width is within
    # ci_target of the median, or max_runs is reached.
    max_runs: int | None = None
    ci_target: float = 0.02

    def __post_init__(self) -> None:
        if not self.targets:
            raise VmtaxError("the plan has no targets")
        if not self.workloads:
            raise VmtaxError("the plan has no workloads")
        names = [t.name for t in self.targets]
        if len(set(names)) != len(names):
            raise VmtaxError(f"target names must be unique, got {', '.join(names)}")
        if self.runs < 1:
            raise VmtaxError(f"--runs must be at least 1, got {self.runs}")
        if self.max_runs is not None and self.max_runs < self.runs:
            raise VmtaxError(f"--max-runs ({self.max_runs}) must be at least --min-runs ({self.runs})")
        if not 0 < self.ci_target < 1:
            raise VmtaxError(f"--ci-target must be a percentage between 0 and 100, got {self.ci_target:.0%}")
        if self.warmup < 0:
            raise VmtaxError(f"--warmup must be 0 or more, got {self.warmup}")
        if self.time is not None and (not isinstance(self.time, int) or self.time < 1):
            raise VmtaxError(f"--time must be a whole number of seconds (1 or more), got {self.time}")
        if self.baseline is None:
            self.baseline = "native" if "native" in names else names[0]
        elif self.baseline not in names:
            raise VmtaxError(f"baseline {self.baseline!r} is not one of the targets ({', '.join(names)})")
        for w in self.workloads:
            w.make(self.time)   # validates the name

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        return cls(targets=[TargetSpec(**t) for t in data["targets"]],
                   workloads=[WorkloadSpec(**w) for w in data["workloads"]],
                   **{k: v for k, v in data.items() if k not in ("targets", "workloads")})


def target_specs(names: list[str], options: dict[str, dict[str, Any]]) -> list[TargetSpec]:
    """Target specs from names; options[kind] applies to every target of that kind."""
    specs = []
    for name in names:
        kind, variant_options = targets.parse_name(name)
        specs.append(TargetSpec(name, kind, {**options.get(kind, {}), **variant_options}))
    return specs


def qemu_builds(specs: list[TargetSpec], qemus: list[str]) -> list[TargetSpec]:
    """Each VM target once per QEMU build: `--qemu stock=/usr/bin/qemu-system-x86_64
    --qemu patched=/opt/q/bin/qemu-system-x86_64` gives vm@stock and vm@patched, so two
    builds are measured in one interleaved plan and can be compared (`vmtax compare`)."""
    if len(qemus) <= 1:
        return [TargetSpec(s.name, s.kind, {**s.options, "qemu": qemus[0]})
                if qemus and s.kind == "vm" else s for s in specs]
    builds = []
    for i, value in enumerate(qemus, 1):
        label, sep, path = value.partition("=")
        builds.append((label, path) if sep and label and path else (str(i), value))
    labels = [label for label, _ in builds]
    if len(set(labels)) != len(labels):
        raise VmtaxError(f"--qemu labels must be unique, got {', '.join(labels)}")
    out = []
    for s in specs:
        if s.kind != "vm":
            out.append(s)
            continue
        out.extend(TargetSpec(f"{s.name}@{label}", s.kind, {**s.options, "qemu": path})
                   for label, path in builds)
    return out


def classic(*, target_names=CLASSIC_TARGETS, workload_names=CLASSIC_WORKLOADS,
            options: dict[str, dict[str, Any]] | None = None, qemus: list[str] = (),
            **settings: Any) -> Plan:
    """E1: the five sysbench workloads with the study's parameters on each target."""
    return Plan(targets=qemu_builds(target_specs(list(target_names), options or {}), list(qemus)),
                workloads=[WorkloadSpec(w) for w in workload_names], **settings)
