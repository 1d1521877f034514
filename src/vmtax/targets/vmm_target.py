"""What the target kinds whose VMM vmtax starts itself share (vm: QEMU; firecracker;
cloud-hypervisor): a guest's options (vCPUs, memory, kernel, huge pages on both sides,
pinning, the network) and their checks, the guest's network and the servers a host-side
client reaches in it, and the fingerprint's common part. A VMM's target module adds its own
options, its guest (a vmtax.guest.vmm_guest.VmmGuest: its command line or API) and its part
of the fingerprint. Not a plugin: it sets no `name`.

Huge pages, E5's two sides: `hugepages` backs guest RAM with host huge pages (reserved by
vmtax.host.hugepages before the VMM starts), `guest_hugepages` has the guest kernel reserve
2 MiB pages at boot for the workload (sysbench --memory-hugetlb). What was granted on each
side is in the fingerprint.
"""

from __future__ import annotations

import abc
import os
from typing import Any, ClassVar, Literal, cast

from vmtax.core import plugin
from vmtax.core.errors import TargetError
from vmtax.core.option_types import (GuestKernel, HostCpus, NonEmpty, Programs, Seconds,
                                     Size, cpulist)
from vmtax.core.target import SERVES, Feature
from vmtax.core.types import Endpoint, Job
from vmtax.guest import minimal_kernel
from vmtax.guest.qemu import parse_size
from vmtax.guest.vmm_guest import VmmGuest
from vmtax.host import hugepages, machine
from vmtax.targets.guest_target import GuestTarget

# What a guest needs beside the huge pages it reserves: kernel, the initramfs rootfs (held
# in RAM), sysbench's own buffers when it does not use huge pages.
GUEST_MIN_FREE = 256 << 20
# A pin for the default two vCPUs, the knob `vmtax tune` tries: the first two usable CPUs.
PIN_CANDIDATE = cpulist(sorted(os.sched_getaffinity(0))[:2])


class VmmOptions(plugin.Options):
    """The options of a guest whose VMM vmtax starts; a VMM's own model adds to them."""
    vcpus: int = plugin.option(2, "Virtual CPUs", unit="vCPUs", ge=1, cli=True, tune=(1, 2, 4))
    memory: Size = plugin.option("1G", "Guest memory", unit="bytes", cli=True)
    kernel: GuestKernel = plugin.option(
        "debian", 'Guest kernel: "debian" (Debian\'s linux-image-amd64), "debian-rt" '
        '(linux-image-rt-amd64, PREEMPT_RT), "minimal" (built from linux-source with '
        "only what vmtax's guests use, all built in: the fastest boot) or a vmlinux/bzImage "
        "path", cli=True)
    disk_size: Size = plugin.option("4G", "Scratch disk (ext4) for workloads that write "
                                    "files", unit="bytes")
    boot_timeout: Seconds = plugin.option(60.0, "Give up on a boot after this long",
                                          unit="s")
    binaries: Programs = plugin.option(
        [], "Host programs to carry into the guest beside those the workloads need")
    hugepages: Literal["2M", "1G"] | None = plugin.option(
        None, "Back guest RAM with host huge pages of this size (reserved for the run)",
        tune=("2M",))
    guest_hugepages: int = plugin.option(0, "2 MiB huge pages the guest kernel reserves at "
                                         "boot", unit="pages", ge=0)
    pin: HostCpus | None = plugin.option(None, "Host CPU of each vCPU's thread, in vCPU "
                                         "order; none: the host scheduler decides",
                                         tune=(PIN_CANDIDATE,))
    # After vmtax's own, so one of them given again wins (e.g. "mitigations=off", or a
    # wrong tsc_early_khz for a deliberately skewed clock).
    kernel_args: NonEmpty | None = plugin.option(
        None, "Extra guest kernel arguments, after vmtax's own", cli=True,
        tune=("mitigations=off", "clocksource=tsc"),
        safety={"mitigations=off": "removes the guest kernel's protections against CPU "
                                   "side channels (Spectre, Meltdown, ...)"})
    network: Literal["auto", "none", "bridge"] = plugin.option(
        "auto", "The guest's network for servers a host-side client reaches: bridge is a "
        "tap on a bridge in a namespace vmtax owns (needs root); auto: bridge for plans "
        "with client-server workloads, else none")

    def problems(self) -> list[tuple[str, str]]:
        problems = []
        memory = parse_size(self.memory)
        host_memory = hugepages.meminfo().get("MemTotal", 0) << 10
        if host_memory and memory > host_memory:
            problems.append(("memory", "at most the host's memory "
                             f"({hugepages.human(host_memory)})"))
        size = self.hugepages
        if size is not None and memory % hugepages.SIZES[size]:
            problems.append(("memory", f"a whole number of {hugepages.label(size)} huge pages "
                                       f'(hugepages = "{size}")'))
        most = max(0, (memory - GUEST_MIN_FREE) // hugepages.GUEST_PAGE)
        if self.guest_hugepages > most:
            problems.append(("guest_hugepages", f"at most {most} 2 MiB pages, which leaves the "
                             f"guest {GUEST_MIN_FREE >> 20} MiB of its memory "
                             f"({self.memory}); or more memory"))
        if self.pin is not None and len(self.pin) != self.vcpus:
            problems.append(("pin", f"one host CPU per vCPU (vcpus = {self.vcpus})"))
        return problems


def bridge_possible() -> str | None:
    """Why this process cannot put a guest on a tap of its own network (None: it can)."""
    if os.geteuid() != 0:
        return "making network namespaces and tap devices needs root"
    if not machine.has_device("/dev/net/tun"):
        return "/dev/net/tun is missing"
    return None


class VmmTarget(GuestTarget):
    """A target whose jobs run in one guest booted by a VMM vmtax starts (`_new_guest`)."""
    opts: Any
    guest: VmmGuest | None
    vmm_process = True
    guest_clock = True
    # What building the guest's kernel, initramfs and scratch disk takes, whichever VMM.
    packages: ClassVar[tuple[str, ...]] = ("e2fsprogs", "kmod", "cpio", "xz-utils")
    # kernel = "minimal" builds the guest's kernel from linux-source on first use.
    option_packages = minimal_kernel.PACKAGES

    @classmethod
    def packages_for(cls, options: plugin.Options) -> tuple[str, ...]:
        kernel = cls.option_packages if cast(VmmOptions, options).kernel == "minimal" else ()
        return tuple(dict.fromkeys((*cls.packages, *kernel)))

    @classmethod
    def host_hugepages(cls, options: plugin.Options) -> dict[str, int]:
        opts = cast(VmmOptions, options)
        if opts.hugepages is None:
            return {}
        return {opts.hugepages: hugepages.pages_needed(parse_size(opts.memory), opts.hugepages)}

    @classmethod
    def refuses(cls, options: plugin.Options) -> dict[Feature, str]:
        return {SERVES: 'network = "none"'} if cast(VmmOptions, options).network == "none" \
            else {}

    @classmethod
    def workload_hugepages(cls, options: plugin.Options) -> int | None:
        return cast(VmmOptions, options).guest_hugepages

    def _network(self) -> str:
        """The network of the plan's guest: one only where a server needs it."""
        wanted = self.opts.network
        if wanted != "auto":
            return str(wanted)
        if not self.ctx.serves:
            return "none"
        why_not = bridge_possible()
        if why_not is not None:
            raise TargetError(f"{self.name}: its servers need a network, and {why_not}")
        return "bridge"

    def prepare(self) -> None:
        self.cleanup()
        self._boot()

    # -- servers for host-side clients --

    def start_server(self, job: Job, port: int) -> Endpoint:
        guest = self._need_guest()
        if guest.network == "none":
            raise TargetError(f"{self.name}: the guest has no network (network = "
                              f"\"{self.opts.network}\"); give it network = \"bridge\"")
        guest_pid = guest.spawn(job)
        address, host_port = guest.reach(port)
        return self._listening(guest, job, port, Endpoint(
            address, host_port, guest.host_pids(), handle=(guest_pid, host_port),
            client_preexec=guest.client_preexec, listening=True))

    def stop_server(self, endpoint: Endpoint) -> None:
        guest_pid, host_port = cast("tuple[int, int]", endpoint.handle)
        if self.guest is None or not self.guest.alive():
            return
        self.guest.signal_group(guest_pid)
        self.guest.unreach(host_port)

    # -- identity --

    @abc.abstractmethod
    def vmm_fingerprint(self) -> dict[str, Any]:
        """The VMM's part of the fingerprint: its binary, version and configuration."""

    def fingerprint(self) -> dict[str, Any]:
        guest = self.guest
        size = self.opts.hugepages
        host_pages: dict[str, Any] = {"size": None, "requested": 0, "granted": 0}
        if size:
            host_pages = {"size": size, "requested": hugepages.pages_needed(
                parse_size(self.opts.memory), size),
                "granted": guest.host_hugepages_granted if guest else None}
        return {
            "kind": self.kind,
            "kernel": self.opts.kernel,
            **self.vmm_fingerprint(),
            "vcpus": self.opts.vcpus,
            "memory": self.opts.memory,
            "job_overhead_s": guest.job_overhead if guest else None,
            # VMM start to agent READY, as the host saw it, and the guest's uptime then.
            "boot_seconds": guest.boot_seconds if guest else None,
            "guest_boot_seconds": guest.guest_boot_seconds if guest else None,
            "boots_seconds": list(self.boot_history),
            # Requested and granted on each side: E5's precondition, kept with the results.
            "host_hugepages": host_pages,
            "guest_hugepages": {"requested": self.opts.guest_hugepages,
                                "granted": guest.guest_hugepages_granted if guest else None},
            "pin": self.opts.pin,
            "network": guest.network if guest else self._network(),
            "vcpu_affinity": guest.vcpu_affinity if guest else None,
            **self.image().fingerprint(),
        }
