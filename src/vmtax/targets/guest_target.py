"""What the target kinds that boot guests of their own (vm, libvirt) do the same way: the
invocation's shared guest image, the one guest the plan's jobs run in (`self.guest`, an
agent guest of vm_instance or libvirt.instance): booting it, its copies for a factory, and
the calls they hand to it. Not a plugin: it sets no `name`."""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, ClassVar

from vmtax.core.errors import TargetError
from vmtax.core.instance import Instance
from vmtax.core.target import Target
from vmtax.core.types import Endpoint, Job, JobResult
from vmtax.guest.image import GuestImage
from vmtax.guest.qemu import find_qemu, resolve_accel
from vmtax.host import proc


# Fixed work under TCG against the bare host (HOST-NOTES: sysbench cpu keeps 0.08-0.12 of
# native; mutex measured 5.5x slower here).
TCG_SLOWDOWN = 10.0


class GuestTarget(Target):
    # What the guest is called in messages (libvirt: "domain").
    guest_noun: ClassVar[str] = "guest"
    # A job's round trip to the guest's agent and back (measured: ~0.4 s under TCG).
    job_seconds = 0.4

    @classmethod
    def slowdown(cls, options: Any) -> float:
        """A guest whose accel option resolves to TCG emulates every instruction."""
        accel = getattr(options, "accel", "kvm")
        tcg = accel == "tcg" or (accel == "auto" and resolve_accel(accel) == "tcg")
        return TCG_SLOWDOWN if tcg else 1.0
    # The kind's options, with `binaries`, `kernel` and `pin`.
    opts: Any
    # The guest the plan's jobs run in; a new one after each prepare().
    guest: Any
    _qemu_version: str | None
    # QEMU start to agent READY of every guest the plan booted (a hung one is replaced).
    boot_history: list[float]

    @abc.abstractmethod
    def qemu_path(self) -> str:
        """The QEMU program this target's options name (found on PATH when a bare name)."""

    @abc.abstractmethod
    def _network(self) -> str:
        """The guest's network, as the options and the plan ask ("bridge", "none", ...)."""

    @abc.abstractmethod
    def _new_guest(self, name: str, network: str, net: Any) -> Any:
        """A guest of this configuration called name, not started yet, on network (net:
        the vmtax.host.network.Network of a "bridge" one)."""

    def _boot(self) -> None:
        """Boot the guest the plan's jobs run in, and keep how long its boot took."""
        network = self._network()
        net = self.ctx.shared_network() if network == "bridge" else None
        self.guest = self._new_guest(self.name, network, net)
        self.guest.start()
        assert self.guest.boot_seconds is not None   # started
        self.boot_history.append(round(self.guest.boot_seconds, 4))

    def make_instance(self, index: int, network: Any, job: Job | None = None) -> Instance:
        """Another guest of this configuration, on a tap of `network`, running job in the
        background."""
        instance: Instance = self._new_guest(f"{self.name}#{index}", "bridge",
                                             network).start_with(job)
        return instance

    def run(self, job: Job) -> JobResult:
        result: JobResult = self._need_guest().run(job)
        return result

    def host_pids(self) -> list[int]:
        return self.guest.host_pids() if self.guest else []

    def vcpu_threads(self) -> list[int]:
        threads: list[int] = self._need_guest().vcpu_threads()
        return threads

    def alive(self) -> bool:
        return self.guest is not None and bool(self.guest.alive())

    def cleanup(self) -> None:
        if self.guest is not None:
            self.guest.stop()
            self.guest = None

    def guest_programs(self) -> dict[str, Path]:
        """vmtax's own programs the guest needs under /vmtax beside the agent's scripts
        (a vsock channel's end), by name."""
        return {}

    def image(self) -> GuestImage:
        """The shared image of this invocation, unless this target wants another kernel or
        other programs of vmtax's."""
        image: GuestImage | None = self.ctx.image
        programs = self.guest_programs()
        if image is None or (image.kernel_arg or "debian") != self.opts.kernel \
                or image.programs != programs:
            image = GuestImage([*self.ctx.binaries, *self.opts.binaries], self.opts.kernel,
                               programs=programs)
            if self.ctx.image is None:
                self.ctx.image = image
        return image

    def _need_guest(self) -> Any:
        if self.guest is None:
            raise TargetError(f"{self.name}: the {self.guest_noun} is not running; "
                              "prepare it again")
        return self.guest

    def _listening(self, guest: Any, job: Job, port: int, endpoint: Endpoint) -> Endpoint:
        """endpoint, once the server job started in the guest listens on port there; stopped
        and refused after the job's timeout. Asked in the guest: QEMU's user-mode network
        accepts forwarded connections whether or not the guest listens."""
        if not guest.wait_listening(port, job.timeout):
            self.stop_server(endpoint)
            raise TargetError(f"{self.name}: {job.argv[0]} does not listen on port {port} "
                              f"in the guest after {job.timeout:g} s")
        return endpoint

    def cpus(self) -> set[int] | None:
        return set(self.opts.pin) if self.opts.pin else None

    def pause(self) -> None:
        if self.guest is not None:
            self.guest.pause()

    def resume(self) -> None:
        if self.guest is not None:
            self.guest.resume()

    def qemu_version(self) -> str:
        if self._qemu_version is None:
            out = proc.run([find_qemu(self.qemu_path()), "--version"], timeout=30)
            self._qemu_version = (out.stdout.splitlines() or ["unknown"])[0].strip()
        return self._qemu_version
