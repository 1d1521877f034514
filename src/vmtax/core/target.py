"""The contract every target kind follows: options, prepare, run jobs, clean up, describe.

A target is where a workload runs (the host, a container, a QEMU guest). The runner only
talks to targets through this interface, so a new kind is one new module. A target
schedules jobs; what runs them may be an instance of its own (vmtax.core.instance: a booted
guest, a long-lived container), and a factory asks it for more (`make_instance`).
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal, Mapping

from vmtax.core import plugin
from vmtax.core.errors import TargetError, VmtaxError
from vmtax.core.instance import Instance
from vmtax.core.types import Endpoint, Job, JobResult

# The environment variable a server job reads the address it must bind from (unset: all).
LISTEN_ENV = "VMTAX_LISTEN"
# The environment variable naming a directory in memory (tmpfs) a server job keeps its
# scratch files in: one a target whose memory is the host's made and journaled (unset: the
# server makes its own, in the /dev/shm of its guest or container, gone with it).
MEMORY_DIR_ENV = "VMTAX_MEMORY_DIR"

# Features of the place a job runs in that a workload's configuration may need
# (vmtax.core.workload.Workload.needs) and a target, or a container runtime, may refuse
# (Target.refuses, vmtax.core.runtime.Runtime.refuses). Named in one place, so that the
# plan check matches one against the other without knowing either plugin.
Feature = Literal["real-time scheduling", "serving host clients"]
REALTIME: Feature = "real-time scheduling"
# A server in the target that a client on the host reaches: what every client-server
# workload needs (Workload.all_needs), refused by a target whose options give it no way.
SERVES: Feature = "serving host clients"


@dataclass(frozen=True)
class Need:
    """A feature one workload configuration needs of its target, and why, in words that
    follow "which WORKLOAD needs" in the plan check's refusal ("at any priority: ...")."""
    feature: Feature
    why: str


@dataclass
class TargetContext:
    """What targets share within one invocation of vmtax."""
    work_dir: Path                   # private temporary directory of this invocation
    journal: Any                     # vmtax.host.journal.Journal: host changes to undo
    # Host programs the plan's workloads need inside the target (their declared binaries).
    binaries: tuple[str, ...] = ()
    # Read-only host directories they read, shown at the same path in targets (vmtax.host.trees).
    trees: tuple[Path, ...] = ()
    # The plan has client-server workloads: targets need a way for clients to reach them.
    serves: bool = False
    image: Any = None                # vmtax.guest.image.GuestImage, built lazily
    network: Any = None              # vmtax.host.network.Network, made on first use
    # How the study makes the invocation's network (a vmtax.host.network.Network created
    # on `journal`); None: the invocation makes none.
    make_network: Callable[[], Any] | None = None

    def shared_network(self) -> Any:
        """The invocation's network (vmtax.host.network.Network) that servers in targets join
        and host-side clients reach them through; made on first use (iproute2 work only
        where a server needs it). Raises TargetError when the study makes no network."""
        if self.network is None:
            if self.make_network is None:
                raise TargetError("this invocation makes no network for servers in targets")
            self.network = self.make_network()
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
    # Seconds a job costs beyond its work (start-up, a guest's round trip), for estimates.
    job_seconds: ClassVar[float] = 0.05
    # Its page cache is the host's (a local container's): dropping the host's drops it,
    # and its own drop may be refused.
    shares_host_page_cache: ClassVar[bool] = False
    # Its instances' memory is marked mergeable for KSM (QEMU marks a guest's RAM
    # MADV_MERGEABLE); an ordinary process marks nothing, so KSM on leaves it as it is.
    ksm_mergeable: ClassVar[bool] = False
    # It times each job by a clock of its own (a guest kernel's) besides the host's:
    # JobResult.guest_elapsed, which reports check against the host's (clock skew).
    guest_clock: ClassVar[bool] = False
    # Its first host process (host_pids()[0]) is a VMM that holds the guest's KVM VM (QEMU,
    # Firecracker, Cloud Hypervisor): what VM exits and a VMM's profile are recorded on.
    vmm_process: ClassVar[bool] = False
    # How the kind's own program is built from a source tarball on first use, when the host
    # has none (vmtax.helpers.vmm_build.CargoBuild for a VMM); None: nothing of its own.
    source_build: ClassVar[Any] = None
    # Options that make its instances small, for studies that start many at once
    # (density, boot): a guest of one vCPU and little memory.
    small_options: ClassVar[Mapping[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Building the kind's program (a VMM's cargo build) needs its build's packages:
        # they are the kind's own, listed and installed with them.
        super().__init_subclass__(**kwargs)
        if cls.source_build is not None:
            cls.packages = tuple(dict.fromkeys((*cls.packages, *cls.source_build.packages)))

    def __init__(self, name: str, options: plugin.Options, ctx: TargetContext):
        # The target's name in the plan shadows, on purpose, the plugin name of its class,
        # which stays its kind (type(self).name): mypy forbids setting a ClassVar on an
        # instance.
        self.name = name  # type: ignore[misc]
        self.options = options
        self.ctx = ctx
        # What the user must hear about how it was set up (a runtime auto passed over).
        self.warnings: list[str] = []
        # Where the user set an option (TargetSpec.written), for asked_for.
        self.written: dict[str, str] = {}

    @property
    def kind(self) -> str:
        return type(self).name

    def asked_for(self, key: str, value: str, others: list[str]) -> tuple[str, str]:
        """What the user wrote to set option key to value, and what to write instead for
        one of others, for an error that names it: the plan file's line
        ('plans/x.toml:4: [targets.vm] accel = "kvm"', '"tcg" or "auto"'), the flag
        ("--accel kvm", "--accel tcg or auto") or the target's name ("vm:kvm", "vm:tcg
        or vm:auto")."""
        where = self.written.get(key)
        kind, _, variant = self.name.partition("@")[0].partition(":")
        if where is None and variant == value and self.variant_option == key:
            return self.name, " or ".join(f"{kind}:{other}" for other in others)
        flag = f"--{key.replace('_', '-')}"
        if where is None or where.startswith(flag + " "):
            return where or f"{flag} {value}", f"{flag} " + " or ".join(others)
        return where, " or ".join(json.dumps(other) for other in others)

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
    def packages_for(cls, options: plugin.Options) -> tuple[str, ...]:
        """The Debian packages a target of these options needs, those it builds with
        included: installed on its first use. Default: the kind's `packages`."""
        return cls.packages

    @classmethod
    def slowdown(cls, options: plugin.Options) -> float:
        """How many times longer fixed work takes in a target of these options than on
        the bare host (a TCG guest's ~10), for estimates: a time-bounded repetition lasts
        its time whatever this is. Called by plan estimates; may probe the host (KVM)."""
        return 1.0

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this host cannot run the kind at all (None: it can)."""
        return None

    @classmethod
    def doctor(cls) -> tuple[bool, str] | None:
        """The kind's line in `vmtax doctor`, under its name: whether this host can run it
        and how, in one line (a daemon it would start, KVM or TCG); None: no line of its
        own (the host's checks cover it). May probe the host for a second or two."""
        return None

    @classmethod
    def makes_instances(cls) -> bool:
        """Whether the kind starts instances of its own for a factory (it implements
        make_instance): what density and boot measure."""
        return cls.make_instance is not Target.make_instance

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

    @classmethod
    def refuses(cls, options: plugin.Options) -> dict[Feature, str]:
        """Features no job gets in a target of these options -> why, in a few words
        ({"real-time scheduling": "gVisor"}).

        Called when a plan is checked, before anything runs, and matched against what each
        of its workloads needs (Workload.needs): a workload configuration needing a refused
        feature is refused there, in one line naming the option that asks for it. Cheap;
        changes nothing; never raises. Default: nothing is refused.
        """
        return {}

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
        bind every address of the target otherwise (its own network namespace or guest).
        One whose /dev/shm is the host's sets $VMTAX_MEMORY_DIR (MEMORY_DIR_ENV) to a
        journaled directory of its own there, for the server's scratch files."""
        raise TargetError(f"{self.name}: {self.kind} targets cannot run a server for a "
                          "client on the host yet")

    def stop_server(self, endpoint: Endpoint) -> None:
        """Stop what start_server started. Idempotent."""

    def make_instance(self, index: int, network: Any, job: Job | None = None) -> Instance:
        """Start another running copy of this target's configuration, attached to
        `network` (a vmtax.host.network.Network) at an address of its own, for a factory
        (vmtax.studies.factory), running `job` in the background for its lifetime (a server; None:
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

    def cgroup(self) -> str | None:
        """The cgroup holding the target's work for as long as it is prepared, as
        /proc/PID/cgroup names it ("/vmtax-0123abcd"), for collectors; None: none."""
        return None

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


# -- the registry of target kinds ----------------------------------------------------------

def kinds() -> dict[str, type[Target]]:
    return plugin.plugins(Target.group)  # type: ignore[return-value]


def get(kind: str) -> type[Target]:
    return plugin.get(Target.group, kind)  # type: ignore[return-value]


def known_names() -> list[str]:
    names = []
    for kind, cls in kinds().items():
        names.append(kind)
        names.extend(f"{kind}:{v}" for v in cls.variants())
    return names


def parse_name(name: str) -> tuple[str, dict[str, Any]]:
    """`container:runc` -> ("container", {"runtime": "runc"}). Raises VmtaxError when unknown."""
    kind, _, variant = name.partition(":")
    cls = kinds().get(kind)
    if cls is None or (variant and (cls.variant_option is None
                                    or variant not in cls.variants())):
        known = known_names()
        raise VmtaxError(f"unknown target {name!r}; known targets: " + ", ".join(known)
                         + plugin.did_you_mean(name, known))
    return kind, ({cls.variant_option: variant} if variant and cls.variant_option else {})


def create(name: str, kind: str, options: dict[str, Any], ctx: TargetContext,
           written: dict[str, str] | None = None) -> Target:
    """A target of kind; written: where the user set its options (TargetSpec.written)."""
    cls = get(kind)
    target = cls(name, plugin.build(cls.Options, options, name, strict=False, kind=kind), ctx)
    target.written = dict(written or {})
    return target
