"""The contract of a running instance of a target: one guest, or one container.

A target schedules a plan's jobs; an instance is one running copy of the target's
configuration and owns everything it is made of: its processes, files, sockets, network
interface and the journal entries that undo them. `stop()` releases all of it, and is safe to
call twice or after a failed start. Targets make instances for their own jobs (a VM target
boots one guest) and, through `Target.make_instance`, for a factory that runs many at once
(vmtax.studies.factory: density, a fleet of servers).

Instances attached to a vmtax network (vmtax.host.network) are reached by host-side clients at
`address`, from inside that network's namespace (`client_preexec`).
"""

from __future__ import annotations

import abc
import contextlib
from typing import Callable


class Instance(abc.ABC):
    """One running copy of a target's configuration."""

    def __init__(self, name: str) -> None:
        self.name = name
        # Where host-side clients reach it (None: it has no network of vmtax's).
        self.address: str | None = None
        # preexec_fn that puts a host-side client where `address` is reachable.
        self.client_preexec: Callable[[], None] | None = None
        # Start to ready (a guest: QEMU start to the agent's READY); None until started.
        self.boot_seconds: float | None = None
        # A guest's own uptime at ready (its kernel and /init: boot_seconds without QEMU's
        # start); None for an instance without a kernel of its own, or until started.
        self.guest_boot_seconds: float | None = None
        # Bytes of guest RAM its first host process maps (a VMM's guest); None: no guest.
        self.guest_memory: int | None = None

    def start(self) -> None:
        """Start it (`_start`) and wait until it is ready; what a previous start or a
        failed one made is released by stop() first and after. Why it failed is what is
        raised: what stop() could not undo then stays journaled, and is retried."""
        self.stop()
        try:
            self._start()
        except BaseException:
            with contextlib.suppress(Exception):
                self.stop()
            raise

    @abc.abstractmethod
    def _start(self) -> None:
        """Make what it is made of, start it and wait until it is ready; everything it makes
        is undone by stop(), also when it fails half-way."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop it and undo everything it made; idempotent."""

    @abc.abstractmethod
    def alive(self) -> bool:
        """Whether its processes still run."""

    @abc.abstractmethod
    def host_pids(self) -> list[int]:
        """Its processes as the host sees them (QEMU; a container's processes)."""

    def __enter__(self) -> "Instance":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
