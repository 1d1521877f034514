"""E4 start-up: the distribution of cold-start times of one target configuration.

Each start is a new instance made through the factory (vmtax.studies.factory), alone on the host's
vmtax network, serving the density study's nginx site (vmtax.studies.density.serve_job); two
times are taken: to ready (the instance's own boot_seconds: a guest's QEMU start to its
agent's READY, a container's start to its first process in its namespace) and to the
first HTTP answer (from the call that starts it to the site answering GET / from the
network's namespace, so it includes what the instance does between ready and serving);
for a guest also its own uptime at READY (its kernel and /init, without QEMU's start).
The instance is stopped before the next start, so each start is cold (caches of the image
and the rootfs are built before the first measured start, by an unrecorded warm-up).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from vmtax.core.target import Target
from vmtax.host import proc
from vmtax.results import study_records as records
from vmtax.studies import density
from vmtax.studies.factory import InstanceFactory

WORKLOAD = records.BOOT
QUANTILES = (50, 90, 99)


@dataclass
class Start:
    ready: float                  # s
    http: float | None            # s, None: the site did not answer in time
    # s, a guest's own uptime at READY (its kernel's and /init's share of `ready`, which
    # a busy host stretches less than QEMU's start); None for a container.
    guest: float | None = None


def quantile(values: Sequence[float], q: float) -> float:
    """The q-th percentile, nearest rank (a start time that really happened)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def distribution(values: Sequence[float]) -> dict[str, float]:
    """p50, p90, p99, max (and n) of values; empty when there are none."""
    if not values:
        return {}
    found = {f"p{q}": quantile(values, q) for q in QUANTILES}
    return {**found, "max": max(values), "n": float(len(values))}


def cold_start(target: Target, network: Any, http_timeout: float) -> Start:
    """Start one instance serving the site, time it to ready and to the first answer, stop
    it."""
    with InstanceFactory(target, network) as factory:
        started = time.monotonic()
        instance = factory.start(1, job=density.serve_job())[0]
        answered = next(iter(density.probe_http([instance], http_timeout).values()), None)
        http = None if answered is None else answered - started
        assert instance.boot_seconds is not None   # started
        guest = instance.guest_boot_seconds
        return Start(round(instance.boot_seconds, 4), None if http is None else round(http, 4),
                     None if guest is None else round(guest, 4))


def run(target: Target, network: Any, count: int, warmup: int = 1,
        http_timeout: float = 60.0,
        on_start: Callable[[int, Start], None] = lambda i, s: None) -> list[Start]:
    """`warmup` unrecorded starts, then `count` measured ones, one at a time."""
    for _ in range(warmup):
        proc.check_stop()
        cold_start(target, network, http_timeout)
    starts = []
    for i in range(count):
        proc.check_stop()
        start = cold_start(target, network, http_timeout)
        starts.append(start)
        on_start(i, start)
    return starts
