"""A plan: targets × workloads × repetitions, and how to run them.

Without a plan file, `vmtax run` runs E1's classic plan (`classic_names`) or the targets
and workloads named on its command line (`from_names`). Plans serialize to plain dicts so
the exact plan is stored with each run.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any, Mapping

from vmtax.core import plugin
from vmtax.core import target as targets
from vmtax.core import workload as workloads
from vmtax.core.errors import VmtaxError
from vmtax.core.limits import MAX_COUNT, MAX_SECONDS
from vmtax.core.text import unique_names
from vmtax.core.target import Feature
from vmtax.core.workload import Workload

# Short enough that the classic plan takes a few minutes here even under TCG,
# long enough that sysbench's start-up is noise next to the measured interval.
DEFAULT_TIME = 2
# Run-to-run noise here is ~1% whatever --time is, so runs are what buys precision: at 3
# per side a 5% change reaches p < 0.01 (t-test, 4 df) only about 2 times in 3; at 5 per
# side (8 df) nearly always. `make bench-stats` measures it.
DEFAULT_RUNS = 5


def classic_names() -> tuple[list[str], list[str]]:
    """The targets and workloads of E1's classic plan (shipped as plans/classic.toml), the
    default of `vmtax run` without a plan file."""
    text = resources.files("vmtax").joinpath("plans", "classic.toml").read_text()
    data = tomllib.loads(text)
    return list(data["targets"]), [w["name"] for w in data["workloads"]]


@dataclass
class TargetSpec:
    name: str
    kind: str
    options: dict[str, Any] = field(default_factory=dict)
    # Where the user set an option, for an error that names what they wrote: "--accel kvm",
    # 'plans/x.toml:4: [targets.vm] accel = "kvm"' (Target.asked_for); not part of what runs.
    written: dict[str, str] = field(default_factory=dict, compare=False)


@dataclass
class WorkloadSpec:
    name: str                     # workload type, e.g. "cpu"
    params: dict[str, Any] = field(default_factory=dict)

    def make(self, time: int | None) -> Workload:
        return workloads.get(self.name).make(self.params, time, strict=False)


@dataclass
class Plan:
    targets: list[TargetSpec]
    workloads: list[WorkloadSpec]
    runs: int = DEFAULT_RUNS
    warmup: int = 1
    time: int | None = DEFAULT_TIME   # seconds (sysbench takes whole seconds)
    baseline: str | None = None   # target the ratios are relative to
    interleave: bool = True       # A B B A order across targets, so drift cancels
    # Sync and drop the host's and each target's page cache before every repetition, so
    # none starts with what the previous one left in memory (E3's disk class).
    drop_caches: bool = False
    # Adaptive repetition: with max_runs set, `runs` is the minimum and each target
    # repeats a workload until its primary metric's median CI half-width is within
    # ci_target of the median, or max_runs is reached.
    max_runs: int | None = None
    ci_target: float = 0.02
    # Collectors recording on the host around each cell's measured repetitions.
    collect: list[str] = field(default_factory=list)
    # Seconds a repetition may run before it is stopped as timed out (None: derived from
    # its estimate, vmtax.studies.estimate.job_timeout).
    timeout: float | None = None
    # What the user called the run (`vmtax run --name`): usable wherever a run id is.
    name: str | None = None

    def __post_init__(self) -> None:
        if not self.targets:
            raise VmtaxError("the plan has no targets")
        if not self.workloads:
            raise VmtaxError("the plan has no workloads")
        names = [t.name for t in self.targets]
        if len(set(names)) != len(names):
            raise VmtaxError(f"target names must be unique, got {', '.join(names)}")
        if not 1 <= self.runs <= MAX_COUNT:
            raise VmtaxError(f"--runs must be from 1 to {MAX_COUNT}, got {self.runs}")
        if self.max_runs is not None and self.max_runs < self.runs:
            raise VmtaxError(f"--max-runs ({self.max_runs}) must be at least --min-runs "
                             f"({self.runs})")
        if not 0 < self.ci_target < 1:
            raise VmtaxError("--ci-target must be a percentage between 0 and 100, "
                             f"got {self.ci_target:.0%}")
        if not 0 <= self.warmup <= MAX_COUNT:
            raise VmtaxError(f"--warmup must be from 0 to {MAX_COUNT}, got {self.warmup}")
        if self.time is not None and (not isinstance(self.time, int)
                                      or not 1 <= self.time <= MAX_SECONDS):
            raise VmtaxError(f"--time must be a whole number of seconds from 1 to "
                             f"{MAX_SECONDS}, got {self.time}")
        if self.timeout is not None and not 0 < self.timeout <= MAX_SECONDS:
            raise VmtaxError(f"timeout must be a positive number of seconds, at most "
                             f"{MAX_SECONDS}, got {self.timeout}")
        if self.baseline is None:   # the bare host when the plan has it
            self.baseline = next((t.name for t in self.targets
                                  if targets.get(t.kind).bare_host), names[0])
        elif self.baseline not in names:
            raise VmtaxError(f"baseline {self.baseline!r} is not one of the targets "
                             f"({', '.join(names)})")
        made = [w.make(self.time) for w in self.workloads]   # validates names and parameters
        for name in self.collect:
            plugin.get("collector", name)
        for t in self.targets:
            # Stored as the plugin reads them: "2" from the command line becomes 2.
            built = plugin.build(targets.get(t.kind).Options, t.options, t.name, strict=False,
                                 kind=t.kind)
            dumped = built.model_dump(by_alias=True, mode="json")
            t.options = {k: dumped[k] for k in t.options}
            refused = targets.get(t.kind).refuses(built)
            for workload in made:
                for problem in refusals(workload, t.name, refused):
                    raise VmtaxError(f"{workload.name}: {problem}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        return cls(targets=[TargetSpec(**t) for t in data["targets"]],
                   workloads=[WorkloadSpec(**w) for w in data["workloads"]],
                   **{k: v for k, v in data.items() if k not in ("targets", "workloads")})


def refusals(workload: Workload, target: str, refused: Mapping[Feature, str]) -> list[str]:
    """One line for each feature the workload's configuration needs (Workload.needs) that
    the target named `target` refuses (Target.refuses, for its options): 'container:runsc
    refuses real-time scheduling (gVisor), which cyclictest needs at any priority: ...'.
    The plan check, of plan files and command lines alike."""
    return [f"{target} refuses {need.feature} ({refused[need.feature]}), which "
            f"{workload.name} needs {need.why}"
            for need in workload.all_needs() if need.feature in refused]


def target_specs(names: list[str], options: dict[str, list[str]]) -> list[TargetSpec]:
    """Target specs from names and command-line option values (`--vcpus 2`): each applies
    to every target whose kind has that option; an option given several times makes one
    target per value, NAME@LABEL for LABEL=VALUE (else NAME@1, NAME@2...): `--qemu
    stock=/usr/bin/qemu-system-x86_64 --qemu patched=/opt/q/bin/qemu-system-x86_64`
    measures vm@stock and vm@patched in one interleaved plan, for `vmtax compare`."""
    specs = []
    for name in names:
        kind, variant = targets.parse_name(name)
        specs.append(TargetSpec(name, kind, dict(variant)))
    for key, values in options.items():
        specs = _apply(specs, key, values)
    return specs


def _apply(specs: list[TargetSpec], key: str, values: list[str]) -> list[TargetSpec]:
    labeled = [_label(value, i) for i, value in enumerate(values, 1)]
    # A label becomes part of a target's name: printable, composed, one of its kind.
    flag = f"--{key.replace('_', '-')}"
    labels = unique_names([label for label, _ in labeled], f"{flag} label")
    labeled = list(zip(labels, [value for _, value in labeled]))
    if len(set(labels)) != len(labels):
        raise VmtaxError(f"{flag} labels must be unique, got "
                         f"{', '.join(labels)}")
    out, taken = [], False
    for s in specs:
        infos = plugin.option_infos(targets.get(s.kind).Options)
        option = next((k for k, info in infos.items() if info.field == key), None)
        taken = taken or option is not None
        if option is None:
            out.append(s)
        elif len(values) == 1:   # a single value is taken whole: kernel_args = "a=b"
            out.append(TargetSpec(s.name, s.kind, {**s.options, option: values[0]},
                                  {**s.written, option: f"{flag} {values[0]}"}))
        else:
            out.extend(TargetSpec(f"{s.name}@{label}", s.kind, {**s.options, option: value},
                                  {**s.written, option: f"{flag} {raw}"})
                       for (label, value), raw in zip(labeled, values))
    if not taken:   # a flag that would do nothing is said so
        kinds = [name for name, cls in sorted(targets.kinds().items())
                 if any(i.field == key for i in plugin.option_infos(cls.Options).values())]
        raise VmtaxError(f"{flag}: no target of this run takes it (it is an option of "
                         f"{', '.join(kinds)}), so it would do nothing")
    return out


def _label(value: str, index: int) -> tuple[str, str]:
    label, sep, rest = value.partition("=")
    return (label, rest) if sep and label and rest else (str(index), value)


def packages(plan: Plan) -> list[str]:
    """The Debian packages the plan's targets (by their options), workloads and collectors
    need, those they build with included."""
    from vmtax.core import collector as collectors

    found: dict[str, None] = {}
    for spec in plan.targets:
        kind = targets.get(spec.kind)
        options = plugin.build(kind.Options, spec.options, spec.name, strict=False)
        found.update(dict.fromkeys(kind.packages_for(options)))
    for w in plan.workloads:
        found.update(dict.fromkeys(workloads.get(w.name).packages))
    for name in plan.collect:
        found.update(dict.fromkeys(collectors.get(name).packages))
    return list(found)


def from_names(target_names: list[str], workload_names: list[str],
               options: dict[str, list[str]] | None = None, **settings: Any) -> Plan:
    """A plan from the command line: targets and workloads by name, with their defaults;
    what the host lacks for a workload (Workload.host_problems) is refused as a plan file's
    check refuses it, before anything runs. A workload named twice would run twice the
    same (targets are refused so too)."""
    if len(set(workload_names)) != len(workload_names):
        raise VmtaxError(f"workload names must be unique, got {', '.join(workload_names)}")
    plan = Plan(targets=target_specs(target_names, options or {}),
                workloads=[WorkloadSpec(w) for w in workload_names], **settings)
    for spec in plan.workloads:
        for option, expected in spec.make(plan.time).host_problems():
            raise VmtaxError(f"--workloads {spec.name}: this host cannot run it: {option}: "
                             f"expected {expected}")
    return plan


def point_labels(specs: list[WorkloadSpec]) -> list[str]:
    """Each workload configuration as progress names it: its workload's name, and for a
    workload the plan runs more than once (a sweep) the parameters its configurations all
    set but to different values (`memory threads=2 memory-block-size=1M`); one told apart by
    none of those, by its place among them (`serving #2`)."""
    labels = []
    for i, spec in enumerate(specs):
        same = [s for s in specs if s.name == spec.name]
        if len(same) == 1:
            labels.append(spec.name)
            continue
        shared = set.intersection(*(set(s.params) for s in same))
        varying = [key for key in spec.params if key in shared
                   and any(s.params[key] != spec.params[key] for s in same)]
        shown = " ".join(f"{key}={_shown(spec.params[key])}" for key in varying)
        place = sum(s.name == spec.name for s in specs[:i]) + 1
        labels.append(f"{spec.name} {shown or f'#{place}'}")
    return labels


def _shown(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)
