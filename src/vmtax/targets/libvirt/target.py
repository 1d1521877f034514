"""A libvirt domain as a target: how most KVM users run their guests.

`libvirt` defines a transient domain from vmtax's own guest image and kernel, with vmtax's
agent on a virtio-serial channel, so every workload and collector that works on `vm` works
here; the options users set in domain XML (vCPUs and their pinning, memory on huge pages,
machine type, CPU model, the disk's cache and I/O modes, the network, kernel arguments,
any QEMU binary as the emulator) map onto it, and everything else is libvirt's default:
that is what `libvirt` against `vm` on the same QEMU measures. The domain's XML is kept in
the fingerprint.

Its type is "kvm" where KVM really runs a guest (vmtax.host.kvm's probe, as for `vm`),
else "qemu" (TCG). libvirt is reached through virsh (vmtax.targets.libvirt.virsh says
why) at `uri`; where no libvirtd answers on qemu:///system vmtax starts one, and the
journal stops it after the domain is gone, also after kill -9.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from pydantic import StringConstraints

from vmtax.core import plugin
from vmtax.core.errors import TargetError
from vmtax.core.instance import Instance
from vmtax.core.plugin import Expect
from vmtax.core.option_types import (
    GuestKernel,
    HostCpus,
    NonEmpty,
    Program,
    Programs,
    Seconds,
    Size,
    cpulist,
)
from vmtax.core.target import SERVES, Feature, TargetContext
from vmtax.core.types import Endpoint, Job, JobResult
from vmtax.guest.image import AGENT_PORT, GuestImage
from vmtax.guest.agent_session import direct_io_works
from vmtax.guest.qemu import (
    find_qemu,
    host_tsc_khz,
    io_uring_problem,
    kernel_cmdline,
    parse_size,
    resolve_accel,
)
from vmtax.host import binary, daemon, hugepages, ssh_session
from vmtax.targets.guest_target import GuestTarget
from vmtax.targets.libvirt.domain_xml import DomainSpec, domain_summary, stable_xml
from vmtax.targets.libvirt.existing import ExistingDomain
from vmtax.targets.libvirt.instance import LibvirtInstance
from vmtax.targets.libvirt.nat import NatLease, NatNetwork, start_nat_network
from vmtax.targets.libvirt.virsh import (
    DEFAULT_URI,
    IMAGES,
    LIBVIRTD,
    Virsh,
    ensure_daemon,
    hugetlbfs_hint,
    hugetlbfs_mounted,
    kvm_masked,
    startable,
)

# A pin for the default two vCPUs, the knob `vmtax tune` tries: the first two usable CPUs.
PIN_CANDIDATE = cpulist(sorted(os.sched_getaffinity(0))[:2])
_DOMAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
_SSH_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
SshHost = Annotated[str, StringConstraints(
    pattern=rf"^(?:{_SSH_NAME}@)?{_SSH_NAME}(?::[0-9]{{1,5}})?$"),
    Expect('a host like "10.0.0.2", "bench@guest" or "guest:2222"')]


class _Domains(dict[str, "str | None"]):
    """libvirt's variants: every domain name (libvirt:NAME), none listed."""

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and _DOMAIN_NAME.fullmatch(key) is not None


class LibvirtOptions(plugin.Options):
    domain: NonEmpty | None = plugin.option(
        None, "An existing domain to measure (libvirt:NAME), left exactly as it is; none: "
        "vmtax defines a transient domain of its own")
    uri: NonEmpty = plugin.option(DEFAULT_URI, "libvirt connection URI", cli=True)
    emulator: Program = plugin.option("qemu-system-x86_64", "The domain's QEMU binary (any "
                                      "build)", cli=True)
    accel: Literal["auto", "kvm", "tcg"] = plugin.option(
        "auto", 'Domain type: kvm, or qemu (TCG) for "tcg"; auto: kvm only where KVM '
        "really runs a vCPU")
    machine: NonEmpty = plugin.option("q35", "QEMU machine type libvirt gives the domain "
                                      '("q35", "pc", "pc-q35-7.2"; not microvm)', cli=True,
                                      tune=("pc",))
    cpu: NonEmpty | None = plugin.option(
        None, 'CPU: "host-passthrough", "host-model", "maximum" or a named model '
        '("Skylake-Server"); none: host-passthrough under KVM, maximum under TCG',
        # Neither is the default's own CPU under KVM or TCG.
        tune=("host-model", "qemu64"))
    vcpus: int = plugin.option(2, "Virtual CPUs", unit="vCPUs", ge=1, cli=True, tune=(1, 2, 4))
    memory: Size = plugin.option("1G", "Guest memory", unit="bytes", cli=True)
    pin: HostCpus | None = plugin.option(None, "Host CPU of each vCPU (<vcpupin>), in vCPU "
                                         "order; QEMU's other threads go to the rest",
                                         tune=(PIN_CANDIDATE,))
    hugepages: Literal["2M", "1G"] | None = plugin.option(
        None, "Back guest RAM with host huge pages of this size (<memoryBacking>; reserved "
        "for the run)", tune=("2M",))
    disk_cache: Literal["default", "none", "writeback", "writethrough", "directsync",
                        "unsafe"] = plugin.option(
        "default", "The scratch disk's cache mode; default: libvirt's (QEMU's writeback)",
        tune=("none", "unsafe"),
        safety={"unsafe": "ignores the guest's flushes: a host crash loses what it wrote"})
    disk_aio: Literal["default", "threads", "native", "io_uring"] = plugin.option(
        "default", "The scratch disk's I/O mode (<driver io=...>); native needs disk_cache "
        "none or directsync; default: libvirt's (threads)", tune=("native", "io_uring"))
    kernel: GuestKernel = plugin.option("debian", "Guest kernel, as for vm", cli=True)
    kernel_args: NonEmpty | None = plugin.option(
        None, "Extra guest kernel arguments, after vmtax's own", cli=True,
        tune=("mitigations=off", "clocksource=tsc"),
        safety={"mitigations=off": "removes the guest kernel's protections against CPU "
                                   "side channels (Spectre, Meltdown, ...)"})
    disk_bus: Literal["virtio-blk", "virtio-scsi"] = plugin.option(
        "virtio-blk", "The scratch disk's bus, named as vm names it: virtio-blk or a disk on "
        "a virtio-scsi controller (as many clouds give; not with the minimal kernel)",
        tune=("virtio-scsi",))
    disk_size: Size = plugin.option("4G", "Scratch disk (ext4) for workloads that write "
                                    "files", unit="bytes")
    network: Literal["auto", "none", "bridge", "nat"] = plugin.option(
        "auto", "The guest's network for servers a host-side client reaches: bridge is a tap "
        "on vmtax's bridge (in a namespace vmtax owns); nat is libvirt's NAT network as "
        "libvirt sets it up (virbr-style bridge, dnsmasq, iptables masquerading), a "
        "transient one of vmtax's on a free subnet, undone after with what libvirt leaves "
        "(the user's networks are not used or touched); auto: bridge only for plans with "
        "client-server workloads")
    boot_timeout: Seconds = plugin.option(90.0, "Give up on a boot after this long", unit="s")
    binaries: Programs = plugin.option(
        [], "Host programs to carry into the guest beside those the workloads need")
    workdir: NonEmpty = plugin.option(
        "/var/tmp", "An existing domain: the guest directory where vmtax makes its scratch "
        "directory (removed at the end)")
    host: SshHost | None = plugin.option(
        None, "An existing domain: reach its guest over SSH at [USER@]HOST[:PORT]; none: "
        "through the QEMU guest agent (either way the host's programs are shipped into the "
        "guest as for ssh targets)")
    identity: NonEmpty | None = plugin.option(
        None, "With host: private key file; none: the SSH agent and ~/.ssh keys")
    known_hosts: NonEmpty = plugin.option(
        "~/.ssh/known_hosts", "With host: known hosts file the guest's host key must be in")
    host_key_check: Literal["strict", "accept-new"] = plugin.option(
        "strict", "With host: strict, the host key must be known; accept-new: an unknown one "
        "is trusted and added")

    def problems(self) -> list[tuple[str, str]]:
        problems = []
        if self.domain is not None:
            if _DOMAIN_NAME.fullmatch(self.domain) is None:
                problems.append(("domain", "a libvirt domain name (letters, digits, . _ + -)"))
            return problems
        if self.host is not None:
            problems.append(("host", "none: ssh reaches an existing domain (libvirt:NAME), "
                                     "vmtax's own domain talks to vmtax's agent"))
        memory = parse_size(self.memory)
        host_memory = hugepages.meminfo().get("MemTotal", 0) << 10
        if host_memory and memory > host_memory:
            problems.append(("memory", "at most the host's memory "
                             f"({hugepages.human(host_memory)})"))
        if self.hugepages is not None and memory % hugepages.SIZES[self.hugepages]:
            problems.append(("memory", f"a whole number of {hugepages.label(self.hugepages)} "
                             f'huge pages (hugepages = "{self.hugepages}")'))
        if self.pin is not None and len(self.pin) != self.vcpus:
            problems.append(("pin", f"one host CPU per vCPU (vcpus = {self.vcpus})"))
        if self.machine == "microvm":
            problems.append(("machine", "a machine type libvirt supports, like q35 or pc"))
        if self.disk_bus == "virtio-scsi" and self.kernel == "minimal":
            problems.append(("disk_bus", '"virtio-blk" with kernel = "minimal" (built '
                                         "without SCSI)"))
        return problems + self._host_problems()

    def _host_problems(self) -> list[tuple[str, str]]:
        """What this host cannot give (`vmtax tune` drops such a knob value before it runs;
        huge pages are counted for all targets at once, through host_hugepages)."""
        problems = []
        if (self.cpu == "host-passthrough" and self.accel != "kvm"
                and resolve_accel(self.accel) == "tcg"):
            problems.append(("cpu", '"host-model", "maximum" or a named model under TCG '
                                    "(libvirt passes the host's CPU through only with KVM)"))
        if self.disk_aio == "native" and self.disk_cache not in ("none", "directsync"):
            problems.append(("disk_aio", f'"threads" or "io_uring" with disk_cache = '
                                         f'"{self.disk_cache}" (Linux AIO needs O_DIRECT)'))
        if self.disk_aio == "io_uring" and (why := io_uring_problem(self.emulator)):
            problems.append(("disk_aio", f'"threads" or "native": {why}'))
        if (self.disk_cache in ("none", "directsync") and IMAGES.is_dir()
                and not direct_io_works(IMAGES)):
            problems.append(("disk_cache", f'"default", "writeback" or "unsafe": '
                                           f"{IMAGES} refuses O_DIRECT"))
        return problems


class LibvirtTarget(GuestTarget):
    name = "libvirt"
    guest_noun = "domain"
    description = ("A libvirt domain: a transient one vmtax defines from its guest image, or "
                   "an existing one (libvirt:NAME), reached through libvirtd")
    Options = LibvirtOptions
    variant_option = "domain"
    packages = ("libvirt-daemon-system", "libvirt-clients", "libxml2-utils",
                "qemu-system-x86", "e2fsprogs", "kmod", "cpio", "xz-utils",
                # network = "nat": libvirt's DNS for the network, its firewall rules, and
                # nft to remove the empty tables iptables-nft made for them
                "dnsmasq-base", "iptables", "nftables")
    # libvirtd's start, the domain's, then the boot to agent READY under TCG (q35: SeaBIOS).
    startup_seconds = 8.0
    ksm_mergeable = True
    guest_clock = True
    vmm_process = True
    small_options = {"vcpus": 1, "memory": "256M", "disk_size": "64M"}

    @classmethod
    def variants(cls) -> dict[str, str | None]:
        return _Domains()

    @classmethod
    def unavailable(cls) -> str | None:
        return startable()

    @classmethod
    def doctor(cls) -> tuple[bool, str]:
        why = startable()
        if why is not None:
            return False, why
        from vmtax.host import kvm   # probing runs a tiny vCPU: only when asked
        status = kvm.probe()
        domains = ("domains of type kvm" if status.usable
                   else f"domains of type qemu (TCG): {status.reason}")
        if daemon.answers(LIBVIRTD.socket):
            pages = ("" if hugetlbfs_mounted() else
                     "; no hugetlbfs is mounted, so hugepages domains fail: "
                     + hugetlbfs_hint())
            return True, (f"libvirtd answers on {LIBVIRTD.socket} (used, left "
                          f"running); {domains}{pages}")
        masked = " with /dev/kvm masked" if kvm_masked() else ""
        return True, (f"no libvirtd runs: vmtax starts one{masked} (and virtlogd) when a "
                      f"libvirt target needs it, and stops it after; {domains}")

    @classmethod
    def refuses(cls, options: plugin.Options) -> dict[Feature, str]:
        opts: LibvirtOptions = options  # type: ignore[assignment]
        if opts.domain is not None:
            return {SERVES: "an existing domain: its address is the user's network's"}
        return {SERVES: 'network = "none"'} if opts.network == "none" else {}

    @classmethod
    def host_hugepages(cls, options: plugin.Options) -> dict[str, int]:
        opts: LibvirtOptions = options  # type: ignore[assignment]
        if opts.hugepages is None or opts.domain is not None:
            return {}
        return {opts.hugepages: hugepages.pages_needed(parse_size(opts.memory), opts.hugepages)}

    def __init__(self, name: str, options: plugin.Options, ctx: TargetContext):
        super().__init__(name, options, ctx)
        self.opts: LibvirtOptions = options  # type: ignore[assignment]
        self.virsh = Virsh(self.opts.uri)
        self.guest: LibvirtInstance | None = None
        self.nat: NatNetwork | None = None   # network = "nat", once started
        # An existing domain (libvirt:NAME), once prepared.
        self.existing: ExistingDomain | None = None
        self._hypervisor: str | None = None
        self._qemu_version: str | None = None
        self.boot_history: list[float] = []

    # -- configuration --

    def qemu_path(self) -> str:
        return self.opts.emulator

    def domain_type(self) -> str:
        return "kvm" if resolve_accel(self.opts.accel) == "kvm" else "qemu"

    def cpu_mode(self, domain_type: str) -> str:
        return self.opts.cpu or ("host-passthrough" if domain_type == "kvm" else "maximum")

    def _cmdline(self, image: GuestImage, domain_type: str) -> str:
        kernel = image.kernel_info()
        return kernel_cmdline(self.opts.machine, host_tsc_khz(), kernel.hz, 0,
                              self.opts.kernel_args, tcg=domain_type == "qemu",
                              params=kernel.params)

    def specify(self, domain: str, directory: Path, disk: Path | None, nic: Any) -> DomainSpec:
        """The domain's specification, its kernel and initramfs copied into directory
        (where libvirt-qemu can read them); nic: a tap of vmtax's bridge or a NatLease."""
        emulator = find_qemu(self.opts.emulator)
        domain_type = self.domain_type()
        image = self.image()
        kernel, initrd = directory / "vmlinux", directory / "initramfs.cpio"
        for source, copy in ((image.kernel(), kernel), (image.initramfs(), initrd)):
            copy.write_bytes(Path(source).read_bytes())
        pin = tuple(self.opts.pin) if self.opts.pin else None
        rest = tuple(sorted(os.sched_getaffinity(0) - set(pin))) if pin else ()
        return DomainSpec(
            name=domain, domain_type=domain_type, emulator=emulator,
            machine=self.opts.machine, cpu=self.cpu_mode(domain_type), vcpus=self.opts.vcpus,
            memory=parse_size(self.opts.memory), kernel=kernel, initrd=initrd,
            cmdline=self._cmdline(image, domain_type), console_log=directory / "console.log",
            agent_socket=directory / "agent.sock", agent_port=AGENT_PORT, disk=disk,
            disk_cache=None if self.opts.disk_cache == "default" else self.opts.disk_cache,
            disk_aio=None if self.opts.disk_aio == "default" else self.opts.disk_aio,
            disk_bus=self.opts.disk_bus,
            pin=pin, emulator_cpus=rest, hugepages=self.opts.hugepages,
            tap=None if nic is None or isinstance(nic, NatLease) else nic.name,
            network=nic.network if isinstance(nic, NatLease) else None,
            mac=nic.mac if nic is not None else None)

    def _network(self) -> str:
        wanted = self.opts.network
        if wanted != "auto":
            return wanted
        return "bridge" if self.ctx.serves else "none"

    def _domain_name(self) -> str:
        safe = re.sub(r"[^A-Za-z0-9_-]", "-", self.name)[:32]
        return f"vmtax-{safe}-{secrets.token_hex(4)}"

    def _new_guest(self, name: str, network: str, net: Any) -> LibvirtInstance:
        domain = self._domain_name()
        return LibvirtInstance(name, domain, self.opts,
                               lambda d, disk, nic: self.specify(domain, d, disk, nic),
                               self._connect,
                               self.virsh, self.ctx.journal, network, net, self._nat_lease)

    def _nat_lease(self) -> NatLease:
        """A place on this target's NAT network, started with the first guest that asks."""
        if self.nat is None:
            self.nat = start_nat_network(self.ctx.journal, self.virsh,
                                                 Path(self.ctx.work_dir) / "libvirt-net")
        return self.nat.lease()

    # -- lifecycle --

    def _connect(self, hugetlbfs: tuple[Path, ...] = ()) -> None:
        """libvirtd up (started and journaled when none answers, told of the hugetlbfs
        mounts guest RAM goes on), and the URI answering."""
        ensure_daemon(self.ctx.journal, self.opts.uri,
                              Path(self.ctx.work_dir) / "libvirtd", hugetlbfs)
        self.virsh.connect(self.name)

    def prepare(self) -> None:
        self.cleanup()
        if self.opts.domain is not None:
            self._open_existing(self.opts.domain)
            return
        if self.ctx.trees:
            raise TargetError(f"{self.name}: libvirt targets cannot carry read-only trees yet "
                              f"({', '.join(map(str, self.ctx.trees))}, the compile workload's)")
        self.image().initramfs()   # built before libvirtd is asked for anything
        self._boot()

    def _open_existing(self, domain: str) -> None:
        if self.ctx.trees:
            raise TargetError(f"{self.name}: an existing domain cannot be given read-only "
                              f"trees ({', '.join(map(str, self.ctx.trees))})")
        self._connect()
        version = self.virsh.connect(self.name)
        running = re.search(r"Running hypervisor:\s*(.+)", version)
        self._hypervisor = running[1].strip() if running else None
        self.existing = ExistingDomain(self.name, domain, self.virsh, self.ctx.journal,
                                       self.opts.workdir, self._ssh_config())
        try:
            self.existing.open((*self.ctx.binaries, *self.opts.binaries))
        except BaseException:
            self.existing.close()
            raise

    def _ssh_config(self) -> ssh_session.SshConfig | None:
        if self.opts.host is None:
            return None
        user, host, port = ssh_session.parse_spec(self.opts.host)
        return ssh_session.SshConfig(host=host, port=port or 22, user=user,
                                     identity=self.opts.identity,
                                     known_hosts=self.opts.known_hosts,
                                     host_key_check=self.opts.host_key_check)

    def make_instance(self, index: int, network: Any, job: Job | None = None) -> Instance:
        """Another transient domain of this configuration, on a tap of `network`."""
        if self.opts.domain is not None:
            raise TargetError(f"{self.name}: an existing domain has no copies")
        return super().make_instance(index, network, job)

    def run(self, job: Job) -> JobResult:
        if self.existing is not None:
            return self.existing.run(job)
        return super().run(job)

    def start_server(self, job: Job, port: int) -> Endpoint:
        if self.opts.domain is not None:
            raise TargetError(f"{self.name}: vmtax cannot serve from an existing domain yet "
                              "(its address is the user's network's)")
        guest = self._need_guest()
        if guest.address is None:
            raise TargetError(f"{self.name}: the domain has no network (network = "
                              f"\"{self.opts.network}\"); give it network = \"bridge\"")
        guest_pid = guest.spawn(job)
        return self._listening(guest, job, port, Endpoint(
            guest.address, port, guest.host_pids(), handle=guest_pid,
            client_preexec=guest.client_preexec, listening=True))

    def stop_server(self, endpoint: Endpoint) -> None:
        if self.guest is not None:
            self.guest.signal_group(cast(int, endpoint.handle))

    def host_pids(self) -> list[int]:
        if self.existing is not None:
            return self.existing.host_pids()
        return super().host_pids()

    def vcpu_threads(self) -> list[int]:
        if self.existing is not None:
            return []   # asking QEMU's monitor would taint a domain of the user's
        return super().vcpu_threads()

    def alive(self) -> bool:
        if self.existing is not None:
            return self.existing.alive()
        return super().alive()

    def cleanup(self) -> None:
        if self.existing is not None:
            self.existing.close()
            self.existing = None
        super().cleanup()
        if self.nat is not None:   # after its guests: net-destroy, then what libvirt leaves
            for token in reversed(self.nat.tokens):
                self.ctx.journal.undo(token)
            self.nat = None

    # -- identity --

    def fingerprint(self) -> dict[str, Any]:
        if self.opts.domain is not None:
            return self._existing_fingerprint(self.opts.domain)
        guest = self.guest
        spec = guest.spec if guest else None
        domain_type = spec.domain_type if spec else self.domain_type()
        size = self.opts.hugepages
        return {
            "kind": self.kind,
            "uri": self.opts.uri,
            "domain_type": domain_type,
            "emulator": find_qemu(self.opts.emulator),
            "qemu_version": self.qemu_version(),
            "emulator_sha256": binary.short_id(find_qemu(self.opts.emulator)),
            "machine": self.opts.machine,
            "cpu": self.cpu_mode(domain_type),
            "vcpus": self.opts.vcpus,
            "memory": self.opts.memory,
            "kernel": self.opts.kernel,
            "disk_cache": self.opts.disk_cache,
            "disk_aio": self.opts.disk_aio,
            "disk_bus": self.opts.disk_bus,
            "pin": self.opts.pin,
            "host_hugepages": {"size": size, "granted": guest.host_hugepages_granted
                               if guest else None},
            "network": guest.network if guest else self._network(),
            "nat_subnet": str(self.nat.subnet) if self.nat else None,
            "job_overhead_s": guest.job_overhead if guest else None,
            "boot_seconds": guest.boot_seconds if guest else None,
            "guest_boot_seconds": guest.guest_boot_seconds if guest else None,
            "boots_seconds": list(self.boot_history),
            # The domain as vmtax defined it (the file names in it change with each boot).
            "domain_xml": guest.xml if guest else None,
            **self.image().fingerprint(),
        }

    def _existing_fingerprint(self, domain: str) -> dict[str, Any]:
        """A domain of the user's: what matters of it in one line and as fields (machine,
        vCPUs, memory, huge pages and how many were granted, as a transient domain's
        fingerprint has them), its definition as libvirt gave it less what changes each boot,
        the hypervisor, and its QEMU's pid (what host-side collectors attach to)."""
        existing = self.existing
        xml = existing.xml if existing else None
        found = re.search(r"<domain type='([^']+)'", xml or "")
        bundle = existing and (existing.ssh.bundle if existing.ssh else existing.bundle)
        summary = domain_summary(xml, existing.pid if existing else None) if xml else {}
        return {"kind": self.kind, "uri": self.opts.uri, "domain": domain, **summary,
                "transport": existing.transport if existing else None,
                "ssh_host": self.opts.host,
                # The host's programs shipped into the guest, as the ssh target records them.
                "bundle": bundle.digest[:16] if bundle else None,
                # What the report shows beside its name: kvm, or qemu (TCG).
                "hypervisor": found[1] if found else None,
                "hypervisor_version": self._hypervisor,
                "qemu_pid": existing.pid if existing else None,
                "domain_xml": stable_xml(xml) if xml else None}
