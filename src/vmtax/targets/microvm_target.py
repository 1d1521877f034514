"""What the microVM target kinds share (firecracker, cloud-hypervisor): a rust-vmm VMM that
needs KVM; its binary the user's own (a release download, one on PATH) or built from its
release source tarball on first use (vmtax.helpers.vmm_build); the agent's channel over
vsock; an API on a UNIX socket that pauses and resumes the guest; vCPU threads known by
their names. Each VMM's module supplies its options, its command line or configuration and
the paths of its API. Not a plugin: it sets no `name`.

The channel is vsock because it is the one both VMMs offer and the guest reaches without a
module on the host: Firecracker has no virtio-serial (console) device at all, and both proxy
a guest's vsock connection to a UNIX socket on the host ("<uds>_<port>": the guest connects
out, as QEMU's virtio-serial port does, so the host listens before the VMM starts and no
READY is ever missed). The serial console stays the kernel's (slow, ~350 KB/s, and mixed
with its messages: no place for the protocol), and a disk would need polling. The guest's
end is vmtax's own static client (busybox has no vsock), vmtax.helpers.vsock_relay.
"""

from __future__ import annotations

import abc
import re
import shutil
from pathlib import Path
from typing import Any, ClassVar

from vmtax.core import plugin
from vmtax.core.errors import TargetError, VmtaxError
from vmtax.core.option_types import ExistingFile, NonEmpty
from vmtax.guest.qemu import AGENT_VSOCK_PORT, guest_cmdline, host_tsc_khz
from vmtax.guest.vmm_guest import GuestFiles, VmmGuest, thread_ids
from vmtax.helpers import vmm_build, vsock_relay
from vmtax.host import binary, proc, unix_http
from vmtax.host.journal import Journal
from vmtax.targets.vmm_target import VmmOptions, VmmTarget

# The guest's vsock context id; the host is 2 (one guest per VMM process).
GUEST_CID = 3
API_TIMEOUT = 5.0


class MicroVmOptions(VmmOptions):
    source: ExistingFile | None = plugin.option(
        None, "The VMM's release source tarball (NAME-VERSION.tar.gz), built into vmtax's "
        "cache on first use when no binary is found (its git dependencies from tarballs "
        "beside it); later runs use that build without it")
    # The VMM's binary (each VMM's options give its default name) and how it is built.
    vmm: NonEmpty
    source_build: ClassVar[vmm_build.CargoBuild]

    def problems(self) -> list[tuple[str, str]]:
        """A VMM that is nowhere: neither found, nor to be built, nor built before."""
        problems = super().problems()
        default = plugin.option_infos(type(self))["vmm"].default
        if shutil.which(self.vmm) is None and self.source is None:
            if self.vmm != default:
                problems.append(("vmm", "a program (a path, or a name found on PATH)"))
            elif vmm_build.cached(self.source_build) is None:
                problems.append(("vmm", how_to_get(self.source_build, default)))
        return problems


def how_to_get(build: vmm_build.CargoBuild, default: str) -> str:
    return (f"a {build.title} binary: {default} is not on PATH and vmtax has built none; "
            f"give vmm = PATH (a release binary) or source = {build.name}-VERSION.tar.gz "
            f"(vmtax builds it once; needs {vmm_build.RUSTUP_HINT.removeprefix('install ')})")


class MicroVmGuest(VmmGuest):
    """A guest of a microVM VMM: its API on a UNIX socket in the run directory."""
    # Its vCPU threads' names: group 1 is the vCPU's index.
    vcpu_thread: ClassVar[re.Pattern[str]]
    # The API's requests that pause and resume the guest: (method, path, body); None: the
    # guest is left running between measurements (an idle KVM guest costs little).
    pause_request: ClassVar[tuple[str, str, Any] | None]
    resume_request: ClassVar[tuple[str, str, Any] | None]

    def __init__(self, name: str, target: MicroVmTarget, journal: Journal, work_dir: Path,
                 network: str = "none", net: Any = None):
        super().__init__(name, target.opts, journal, work_dir, network, net)
        self.target = target
        # What was sent to the VMM, less what changes at each boot (run paths, tap name).
        self.sent: Any = None

    def _agent_socket(self, run_dir: Path) -> Path:
        return run_dir / f"vsock.sock_{AGENT_VSOCK_PORT}"

    @staticmethod
    def vsock_socket(files: GuestFiles) -> Path:
        """The VMM's own vsock socket, which it proxies guest connections from."""
        return files.run_dir / "vsock.sock"

    @staticmethod
    def api_socket(files: GuestFiles) -> Path:
        return files.run_dir / "api.sock"

    def under_kvm(self) -> bool:
        return True

    def _vcpu_threads(self) -> list[int]:
        assert self._proc is not None   # vcpu_threads() found it alive
        return thread_ids(self._proc.pid, self.vcpu_thread)

    def _api(self, request: tuple[str, str, Any] | None) -> None:
        if request is None:
            return
        assert self.files is not None
        method, url, body = request
        unix_http.request(str(self.api_socket(self.files)), method, url, body, API_TIMEOUT)

    def _pause(self) -> None:
        self._api(self.pause_request)

    def _resume(self) -> None:
        self._api(self.resume_request)

    def _check_running(self) -> None:
        # While it boots only: a running guest's jobs fail, they raise nothing.
        if self.session is None and self._proc is not None and self._proc.poll() is not None:
            assert self.files is not None
            refusal = self.target.refusal(self.files)
            if refusal is not None:   # no nested fault: never booted again
                raise TargetError(f"{self.name}: {refusal}")
        super()._check_running()

    def _setup_args(self) -> tuple[Any, ...]:
        return (*super()._setup_args(), "virtio-blk", self.target.tree_serials())


class MicroVmTarget(VmmTarget):
    """A target whose guest a microVM VMM boots."""
    opts: Any
    # How the VMM builds from its release source (vmtax.helpers.vmm_build).
    source_build: ClassVar[vmm_build.CargoBuild]
    # How its virtio devices attach ("mmio", "pci").
    bus: ClassVar[str]
    # The guest of its VMM: what it launches and how it is paused and stopped.
    guest_class: ClassVar[type[MicroVmGuest]]
    # The guest's serial console: the kernel's messages (and, with `quiet`, little else).
    guest_noun = "guest"
    # What makes the guest's instances small for density and boot: the minimal kernel
    # boots in seconds where Debian's takes a minute in a nested lab.
    small_options = {"vcpus": 1, "memory": "128M", "disk_size": "64M", "kernel": "minimal"}

    def _new_guest(self, name: str, network: str, net: Any) -> MicroVmGuest:
        return self.guest_class(name, self, self.ctx.journal, Path(self.ctx.work_dir),
                                network, net)

    def __init__(self, name: str, options: plugin.Options, ctx: Any):
        super().__init__(name, options, ctx)
        self.opts = options
        self.guest = None
        self.boot_history: list[float] = []
        self._vmm: str | None = None
        self._version: str | None = None

    # -- the VMM's binary --

    @classmethod
    def default_vmm(cls) -> str:
        return str(plugin.option_infos(cls.Options)["vmm"].default)

    @classmethod
    def find_vmm(cls, vmm: str, source: str | None) -> str:
        """The VMM's binary: the one named (a path, or found on PATH), else the build of
        source (built now if need be), else the newest build in the cache; VmtaxError,
        saying how to get one, when there is none."""
        found = shutil.which(vmm)
        if found is not None:
            return found
        if vmm != cls.default_vmm():
            raise VmtaxError(f"{cls.name}: vmm = {vmm!r}: no such program")
        if source is not None:
            return str(vmm_build.built_from(cls.source_build, Path(source)))
        cached = vmm_build.cached(cls.source_build)
        if cached is not None:
            return str(cached)
        raise VmtaxError(cls.how_to_get())

    @classmethod
    def how_to_get(cls) -> str:
        return f"{cls.name}: expected {how_to_get(cls.source_build, cls.default_vmm())}"

    def vmm_path(self) -> str:
        if self._vmm is None:
            self._vmm = self.find_vmm(self.opts.vmm, self.opts.source)
        return self._vmm

    def qemu_path(self) -> str:   # GuestTarget's name for the program it runs
        return self.vmm_path()

    def vmm_version(self) -> str:
        if self._version is None:
            out = proc.run([self.vmm_path(), "--version"], timeout=30)
            self._version = next((line.strip() for line in out.stdout.splitlines()
                                  if line.strip()), "unknown")
        return self._version

    # -- what the kind is --

    @classmethod
    def _kvm_problem(cls) -> str | None:
        from vmtax.host import kvm  # probing runs a tiny vCPU: only when asked
        status = kvm.probe()
        if status.usable:
            return None
        return (f"{cls.source_build.title} needs KVM, and {status.reason}; `vmtax lab` runs "
                "it in a nested KVM")

    @classmethod
    def unavailable(cls) -> str | None:
        return cls._kvm_problem()

    @classmethod
    def doctor(cls) -> tuple[bool, str]:
        try:
            vmm = cls.find_vmm(cls.default_vmm(), None)
        except VmtaxError as exc:
            return False, str(exc).removeprefix(f"{cls.name}: ")
        problem = cls._kvm_problem()
        return problem is None, f"{vmm}" + (f"; {problem}" if problem else "; KVM runs it")

    # -- the guest --

    def guest_programs(self) -> dict[str, Path]:
        return {vsock_relay.GUEST_NAME: vsock_relay.relay()}

    def cmdline(self) -> str:
        kernel = self.image().kernel_info()
        # Told the TSC's rate as a microvm guest is: their machines are as bare.
        return guest_cmdline(self.bus, host_tsc_khz(), kernel.hz, self.opts.guest_hugepages,
                             self.opts.kernel_args, params=kernel.params, early_tsc=True,
                             vsock=True)

    def tree_serials(self) -> tuple[tuple[str, str], ...]:
        """(serial, mountpoint) of each read-only tree's disk, as the guest sees it."""
        return tuple((self.tree_serial(i, image), str(tree))
                     for i, (tree, image) in enumerate(self.tree_images()))

    def tree_images(self) -> list[tuple[Path, Path]]:
        from vmtax.host import trees
        return [(tree, trees.ext4_image(tree)) for tree in self.ctx.trees]

    @abc.abstractmethod
    def tree_serial(self, index: int, image: Path) -> str:
        """The serial the VMM gives the index-th tree's disk."""

    def refusal(self, files: GuestFiles) -> str | None:
        """Why the VMM refused to run this guest at all, from what it logged (a KVM that
        lacks a capability it needs): no nested fault, and no boot to try again."""
        return None

    def prepare(self) -> None:
        problem = self._kvm_problem()
        if problem is not None:
            raise TargetError(f"{self.name}: {problem}")
        self.vmm_path()   # a missing binary is said before a kernel is fetched
        super().prepare()

    def vmm_fingerprint(self) -> dict[str, Any]:
        vmm = self.vmm_path()
        # accel as a vm target's says it: what every view labels a KVM guest by (nested KVM
        # in a lab; a lab's table showed vm:kvm's column nested, and not these).
        return {"accel": "kvm", "vmm": vmm, "vmm_version": self.vmm_version(),
                "vmm_sha256": binary.identity(vmm)["sha256"],
                "append": self.cmdline(),
                "config": self.guest.sent if isinstance(self.guest, MicroVmGuest) else None}
