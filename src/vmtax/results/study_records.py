"""What the studies that store no workload's repetitions store, named in one place: the
study writes its records by these names and the report's figures read them by the same
(density: vmtax.studies.density writes, vmtax.report.plots draws; boot likewise), so a
renamed metric breaks an import, not a figure in silence."""

# A density study's records: one per step (phase STEP), its metrics dimensioned by the
# instance count (INSTANCES), with KSM on or off in the parameters (KSM: "on" | "off").
DENSITY = "density"
STEP = "step"
INSTANCES = "instances"
KSM = "ksm"
USED_DELTA = "used delta"       # MiB the host's used memory grew since the first instance
PSS_TOTAL = "pss total"         # MiB: summed PSS of every instance's host processes

# A boot study's records: one per cold start (phase "measure"), a metric per milestone.
BOOT = "boot"
