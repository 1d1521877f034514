"""What the target kinds that boot guests of their own (vm, libvirt) do the same way: the
invocation's shared guest image, the one guest the plan's jobs run in (`self.guest`, an
agent guest of vm_instance or libvirt.instance), and the calls they hand to it. Not a
plugin: it sets no `name`."""

from __future__ import annotations

import abc
from typing import Any, ClassVar

from vmtax.core.errors import TargetError
from vmtax.core.target import Target
from vmtax.core.types import Endpoint, Job
from vmtax.guest.image import GuestImage
from vmtax.guest.qemu import find_qemu
from vmtax.host import proc


class GuestTarget(Target):
    # What the guest is called in messages (libvirt: "domain").
    guest_noun: ClassVar[str] = "guest"
    # The kind's options, with `binaries`, `kernel` and `pin`.
    opts: Any
    # The guest the plan's jobs run in; a new one after each prepare().
    guest: Any
    _qemu_version: str | None

    @abc.abstractmethod
    def qemu_path(self) -> str:
        """The QEMU program this target's options name (found on PATH when a bare name)."""

    def image(self) -> GuestImage:
        """The shared image of this invocation, unless this target wants another kernel."""
        image = self.ctx.image
        if image is None or (image.kernel_arg or "debian") != self.opts.kernel:
            image = GuestImage([*self.ctx.binaries, *self.opts.binaries], self.opts.kernel)
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
