"""The contract every target kind follows: options, prepare, run jobs, clean up, describe.

A target is where a workload runs (the host, a container, a QEMU guest). The runner only
talks to targets through this interface, so a new kind is one new module. A target
schedules jobs; what runs them may be an instance of its own (vmtax.instance: a booted
guest, a long-lived container), and a factory asks it for more (`make_instance`).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from vmtax import plugin
from vmtax.errors import TargetError
from vmtax.instance import Instance
from vmtax.types import Endpoint, Job, JobResult

# The environment variable a server job reads the address it must bind from (unset: all).
LISTEN_ENV = "VMTAX_LISTEN"


@dataclass
class TargetContext:
    """What targets share within one invocation of vmtax."""
    work_dir: Path                   # private temporary directory of this invocation
    journal: Any                     # vmtax.journal.Journal: host changes to undo
    # Host programs the plan's workloads need inside the target (their declared binaries).
    binaries: tuple[str, ...] = ()
    # Read-only host directories they read, shown at the same path in targets (vmtax.trees).
    trees: tuple[Path, ...] = ()
    # The plan has client-server workloads: targets need a way for clients to reach them.
    serves: bool = False
    image: Any = None                # vmtax.image.GuestImage, built lazily
    network: Any = None              # vmtax.network.Network, made on first use

    def shared_network(self) -> Any:
        """The invocation's network (vmtax.network.Network) that servers in targets join
        and host-side clients reach them through; made on first use, journaled."""
        if self.network is None:
            from vmtax.network import Network   # iproute2 work only where a server needs it
            self.network = Network(self.journal).create()
        return self.network


class Target(plugin.Plugin, abc.ABC):
    group = "target"
    # The option a name's variant sets: `container:runc` sets runtime = "runc".
    variant_option: ClassVar[str | None] = None
    # The bare host: results against it may call a "faster than" win suspicious.
    bare_host: ClassVar[bool] = False
    # Runs on another machine: a client on this host takes none of its CPUs.
    remote: ClassVar[bool] = False
    # Seconds from prepare() to the first job, for plan estimates.
    startup_seconds: ClassVar[float] = 0.0

    def __init__(self, name: str, options: plugin.Options, ctx: TargetContext):
        # The target's name in the plan shadows, on purpose, the plugin name of its class,
        # which stays its kind (type(self).name): mypy forbids setting a ClassVar on an
        # instance.
        self.name = name  # type: ignore[misc]
        self.options = options
        self.ctx = ctx
        # What the user must hear about how it was set up (a runtime auto passed over).
        self.warnings: list[str] = []

    @property
    def kind(self) -> str:
        return type(self).name

    # -- what the kind is ----------------------------------------------------------------

    @classmethod
    def variants(cls) -> dict[str, str | None]:
        """Variant -> why this host cannot run it (None: it can). Default: the choices of
        the variant option."""
        if cls.variant_option is None:
            return {}
        info = plugin.option_infos(cls.Options)[cls.variant_option]
        return {str(c): None for c in info.choices}

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this host cannot run the kind at all (None: it can)."""
        return None

    @classmethod
    def describe(cls) -> dict[str, Any]:
        """Everything `vmtax list targets --json` shows."""
        return {"name": cls.name, "description": cls.description,
                "available": cls.unavailable() is None, "why_not": cls.unavailable(),
                "variant_option": cls.variant_option,
                "variants": [{"name": f"{cls.name}:{v}", "available": why is None,
                              "why_not": why} for v, why in cls.variants().items()],
                "options": cls.options_json()}

    # -- what it needs from the host, before anything runs -------------------------------

    @classmethod
    def host_hugepages(cls, options: plugin.Options) -> dict[str, int]:
        """Host huge pages (size -> count) the target holds while it is up."""
        return {}

    @classmethod
    def workload_hugepages(cls, options: plugin.Options) -> int | None:
        """2 MiB huge pages a workload can allocate inside it; None: the host's free ones."""
        return None

    # -- lifecycle -----------------------------------------------------------------------

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

    def start_server(self, job: Job, port: int) -> Endpoint:
        """Start a client-server workload's server (job) detached in the target, listening
        on `port`; return where the host reaches it. Raises TargetError when this kind of
        target cannot serve. A target that must not expose the server beyond the host sets
        $VMTAX_LISTEN (LISTEN_ENV) in its environment to the address to bind; servers
        bind every address of the target otherwise (its own network namespace or guest)."""
        raise TargetError(f"{self.name}: {self.kind} targets cannot run a server for a "
                          "client on the host yet")

    def stop_server(self, endpoint: Endpoint) -> None:
        """Stop what start_server started. Idempotent."""

    def make_instance(self, index: int, network: Any, job: Job | None = None) -> Instance:
        """Start another running copy of this target's configuration, attached to
        `network` (a vmtax.network.Network) at an address of its own, for a factory
        (vmtax.factory), running `job` in the background for its lifetime (a server; None:
        nothing but the instance itself); `index` tells the copies apart in names. The
        instance owns what it made and undoes it on stop(). Raises TargetError where the
        kind cannot do this."""
        raise TargetError(f"{self.name}: {self.kind} targets cannot start instances of "
                          "their own")

    def cpus(self) -> set[int] | None:
        """Host CPUs the target's work runs on, when it is confined to some: a host-side
        client is kept off them."""
        return None

    def host_pids(self) -> list[int]:
        """Long-lived host processes of the target (a guest's QEMU), for collectors."""
        return []

    def vcpu_threads(self) -> list[int]:
        """Host thread ids of a guest's vCPUs (empty for targets without vCPUs)."""
        return []

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

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
