"""The contract every target follows: prepare, run jobs, clean up, describe itself.

A target is where a workload runs (the host, a container, a QEMU guest). The runner
only talks to targets through this interface, so a new target is one new module.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar


@dataclass
class Job:
    """One command to run inside a target."""
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 600.0
    # Run in the target's scratch directory (on a real disk) instead of "/".
    in_scratch: bool = False


@dataclass
class JobResult:
    exit_code: int | None          # None when the job was killed at its timeout
    stdout: str
    stderr: str
    host_elapsed: float            # seconds, measured by the host around the job
    guest_elapsed: float | None = None  # seconds, measured by the target's own clock
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class TargetContext:
    """What targets share within one invocation of vmtax."""
    work_dir: Path                   # private temporary directory of this invocation
    journal: Any                     # vmtax.journal.Journal: host changes to undo
    image: Any = None                # vmtax.image.GuestImage, built lazily


class Target(abc.ABC):
    kind: ClassVar[str]              # "native", "container", "vm"
    # Options a user may set ("vcpus", "accel", ...) with their defaults.
    option_defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, name: str, options: dict[str, Any], ctx: TargetContext):
        self.name = name
        self.options = {**self.option_defaults, **options}
        self.ctx = ctx

    @abc.abstractmethod
    def prepare(self) -> None:
        """Make the target ready to run jobs (boot, create rootfs...)."""

    @abc.abstractmethod
    def run(self, job: Job) -> JobResult:
        """Run one job to completion or its timeout. Never raises for a failing command."""

    @abc.abstractmethod
    def cleanup(self) -> None:
        """Stop everything this target started and remove what it made. Idempotent."""

    @abc.abstractmethod
    def fingerprint(self) -> dict[str, Any]:
        """What identifies this target's configuration (stored with every result)."""

    def alive(self) -> bool:
        """False once the target can no longer run jobs (a guest that hung and was killed)."""
        return True

    def pause(self) -> None:
        """Stop consuming host CPU while other targets are measured (a guest's vCPUs stop)."""

    def resume(self) -> None:
        """Undo pause() before this target runs a job."""

    def __enter__(self) -> "Target":
        self.prepare()
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()
