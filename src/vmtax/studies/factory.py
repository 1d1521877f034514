"""N running instances of one target configuration, each at its own address on one network.

E4's density and start-up studies need many guests or containers of one configuration at
once, each reachable by a host-side client. The factory asks the target for each instance
(`Target.make_instance`), so it holds no code of any target kind; each instance owns its
disk, sockets, interface and journal entries, and the factory stops every one it made, also
when a start fails half-way (the journal and the guardian cover a killed vmtax).

    with InstanceFactory(target, network) as factory:
        guests = factory.start(8, parallel=4)   # booted, each at guests[i].address
        ...
    # all stopped; the network is the caller's (or the target context's shared one)
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from vmtax.core.errors import VmtaxError
from vmtax.core.instance import Instance
from vmtax.core.target import Target
from vmtax.core.types import Job


class InstanceFactory:
    """Makes instances of `target` on `network` (default: the target context's shared one)
    and stops them all."""

    def __init__(self, target: Target, network: Any = None):
        self.target = target
        self.network = network if network is not None else target.ctx.shared_network()
        self.instances: list[Instance] = []
        # Instances start in these threads, which live until stop(): a process started
        # with PR_SET_PDEATHSIG (vmtax.host.proc.spawn) dies with the thread that forked it.
        self._pool: ThreadPoolExecutor | None = None
        self._workers = 0
        self._retired: list[ThreadPoolExecutor] = []   # smaller pools, kept for their threads

    def start(self, count: int, parallel: int = 1, job: Job | None = None) -> list[Instance]:
        """Start `count` more instances, up to `parallel` at a time, each running `job` in
        the background (a server) if given; returns them in order of their index. If any
        start fails, the others of this batch are kept (stop() ends them with the rest) and
        the first failure is raised."""
        if count < 1 or parallel < 1:
            raise VmtaxError(f"start {count} instances {parallel} at a time: both must be "
                             "at least 1")
        first = len(self.instances)
        indices = range(first, first + count)
        if self._pool is None or parallel > self._workers:
            old, self._workers = self._pool, max(parallel, self._workers)
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="vmtax-start")
            self._retired.extend([old] if old else [])
        futures = [self._pool.submit(self.target.make_instance, i, self.network, job)
                   for i in indices]
        batch: list[Instance] = []
        errors: list[BaseException] = []
        try:
            for future in futures:
                try:
                    batch.append(future.result())
                except Exception as exc:   # re-raised below, once the rest have started
                    errors.append(exc)
        except BaseException:
            # Interrupted while waiting: starts not begun are dropped, those under way are
            # waited for, so that stop() ends every instance that exists.
            for future in futures:
                future.cancel()
            for future in futures[len(batch) + len(errors):]:
                if not future.cancelled():
                    with contextlib.suppress(BaseException):   # its failure is not news
                        batch.append(future.result())
            raise
        finally:
            self.instances += batch
        if errors:
            raise errors[0]
        return batch

    def stop(self) -> None:
        """Stop every instance, newest first."""
        errors = []
        while self.instances:
            instance = self.instances.pop()
            try:
                instance.stop()
            except Exception as exc:   # keep stopping the rest
                errors.append(f"{instance.name}: {exc}")
        for pool in [*self._retired, *([self._pool] if self._pool else [])]:
            pool.shutdown()
        self._pool, self._workers, self._retired = None, 0, []
        if errors:
            raise VmtaxError("stopping instances failed: " + "; ".join(errors))

    def __enter__(self) -> "InstanceFactory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
