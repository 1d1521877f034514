"""What the studies that store no workload's repetitions store, named in one place: the
study writes its records by these names and the report's figures read them by the same
(density: vmtax.studies.density writes, vmtax.report.plots draws; boot likewise), so a
renamed metric breaks an import, not a figure in silence."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# A density study's records: one per step (phase STEP), its metrics dimensioned by the
# instance count (INSTANCES), with KSM on or off in the parameters (KSM: "on" | "off").
DENSITY = "density"
STEP = "step"
INSTANCES = "instances"
KSM = "ksm"
USED_DELTA = "used delta"       # MiB the host's used memory grew since the first instance
PSS_TOTAL = "pss total"         # MiB: summed PSS of every instance's host processes
# KSM's merge curve while a step waited for merging to settle: memory KSM saved
# (pages_sharing × page size), dimensioned by the instance count and SECONDS since the
# study (one target, KSM on) started.
KSM_SAVED = "ksm saved"
SECONDS = "seconds"
# The plan's key for why KSM on leaves some targets' memory as it is (host.ksm.unmarked_note
# of the host the study ran on), stored when the study starts.
KSM_NOTE = "ksm_note"

# A boot study's records: one per cold start (phase "measure"), a metric per milestone.
BOOT = "boot"


# The figures' side of the contract: typed records read from a stored run, so a renderer
# reads no record by name (vmtax.report.study_plots draws them).

@dataclass(frozen=True)
class DensityPoint:
    """One metric of one density step: instances running, and the metric's value (MiB)."""
    target: str
    ksm: str              # "on" | "off"
    instances: float
    value: float


@dataclass(frozen=True)
class KsmReading:
    """One reading of KSM's merge curve: seconds since the study started, with instances
    running, and the memory KSM saved (MiB)."""
    target: str
    instances: float
    seconds: float
    saved: float


@dataclass(frozen=True)
class BootStart:
    """One cold start's time to one milestone ("ready", "guest ready", "first answer"…)."""
    target: str
    milestone: str
    seconds: float


def density_points(run: Any, metric: str) -> list[DensityPoint]:
    """The steps' values of metric (USED_DELTA, PSS_TOTAL) in a stored density run
    (vmtax.results.store.Run), in the order stored."""
    return [DensityPoint(rep.target, str(rep.params.get(KSM, "off")),
                         float(m.dimensions[INSTANCES]), m.value)
            for rep in run.reps if rep.workload == DENSITY and rep.phase == STEP
            for m in rep.metrics if m.name == metric and INSTANCES in m.dimensions]


def ksm_readings(run: Any) -> list[KsmReading]:
    """KSM's merge curve in a stored density run, every reading of every KSM-on step, in
    the order stored."""
    return [KsmReading(rep.target, float(m.dimensions[INSTANCES]),
                       float(m.dimensions[SECONDS]), m.value)
            for rep in run.reps if rep.workload == DENSITY and rep.phase == STEP
            for m in rep.metrics
            if m.name == KSM_SAVED and INSTANCES in m.dimensions and SECONDS in m.dimensions]


def boot_starts(run: Any) -> list[BootStart]:
    """Every milestone of every cold start in a stored boot run, in the order stored."""
    return [BootStart(rep.target, m.name, m.value)
            for rep in run.reps if rep.workload == BOOT and rep.phase == "measure"
            for m in rep.metrics]
