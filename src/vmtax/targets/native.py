"""The bare host: the baseline every other target is compared with."""

from __future__ import annotations

import os
import platform
from typing import Any

from vmtax.host.local_target import LocalProcessTarget


class NativeTarget(LocalProcessTarget):
    name = "native"
    description = "The bare host: the baseline every other target is compared with"
    bare_host = True
    shares_host_page_cache = True

    def cpus(self) -> set[int] | None:
        # A server on the host gets the last CPU, so a client on the host can have the
        # others (with 2 cores: server on CPU 1, client on CPU 0).
        usable = sorted(os.sched_getaffinity(0))
        return {usable[-1]} if len(usable) > 1 else None

    def fingerprint(self) -> dict[str, Any]:
        return {"kind": self.kind, "bare_host": True, "kernel": platform.release()}
