"""The most a user may give as a duration (a repetition's time, a timeout) and as a count
(of repetitions, instances, loops): a job may wait ten times its time plus a minute, and a
wait longer than about 24 days overflows the kernel's poll (its timeout is a C int of
milliseconds); larger counts mean nothing to a benchmark. Plan keys (vmtax.core.plugin)
and flags (vmtax.cli.bounds) are bounded alike, so a mistake is a one-line error."""

MAX_SECONDS = 86_400
MAX_COUNT = 1_000_000_000
