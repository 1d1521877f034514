"""A libvirt domain's XML: written for a vmtax guest from a resolved specification, and read
back from a running domain (what each boot changes left out; what matters of it in a line).

Pure functions of the specification, so the KVM host's domain (type kvm, host-passthrough,
vCPU pinning, huge pages) is checked against libvirt's schema on a host where KVM cannot
run. What is not given is left to libvirt's defaults (the disk's cache and I/O modes, the
machine's default devices): that is the configuration a libvirt user gets, which the
`libvirt` target measures against vmtax's own QEMU command line.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmtax.host import hugepages

# CPU modes libvirt names; any other cpu is a named model (mode custom).
CPU_MODES = ("host-passthrough", "host-model", "maximum")


@dataclass(frozen=True)
class DomainSpec:
    """Everything that decides a vmtax guest's domain XML, already resolved."""
    name: str
    domain_type: str           # "qemu" (TCG) | "kvm"
    emulator: str              # a QEMU binary's path
    machine: str               # a machine type QEMU knows: "q35", "pc", "pc-q35-7.2"
    cpu: str                   # a CPU_MODES mode or a named model
    vcpus: int
    memory: int                # bytes
    kernel: Path
    initrd: Path
    cmdline: str
    console_log: Path
    agent_socket: Path         # the host listens; QEMU connects (mode "connect")
    agent_port: str            # the virtio-serial port's name the guest's /init looks for
    disk: Path | None = None
    disk_cache: str | None = None   # None: libvirt's (QEMU's) default, writeback
    disk_aio: str | None = None     # None: libvirt's default, threads
    disk_bus: str = "virtio-blk"    # "virtio-blk" (vda) | "virtio-scsi" (sda), as vm names them
    pin: tuple[int, ...] | None = None     # host CPU of each vCPU
    emulator_cpus: tuple[int, ...] = ()    # QEMU's other threads' CPUs (with pin)
    hugepages: str | None = None    # "2M" | "1G": guest RAM on host huge pages
    tap: str | None = None          # an existing tap device (vmtax's bridge)
    mac: str | None = None
    network: str | None = None      # a libvirt network's name (its NAT)


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    element = ET.SubElement(parent, tag, {k.rstrip("_"): v for k, v in attrs.items()})
    if text is not None:
        element.text = text
    return element


def _cpuset(cpus: tuple[int, ...]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def _cpu(domain: ET.Element, spec: DomainSpec) -> None:
    if spec.cpu in CPU_MODES:
        _sub(domain, "cpu", mode=spec.cpu)
    else:
        cpu = _sub(domain, "cpu", mode="custom", match="exact")
        _sub(cpu, "model", spec.cpu, fallback="forbid")


def _memory(domain: ET.Element, spec: DomainSpec) -> None:
    _sub(domain, "memory", str(spec.memory >> 10), unit="KiB")
    if spec.hugepages:
        backing = _sub(domain, "memoryBacking")
        pages = _sub(backing, "hugepages")
        _sub(pages, "page", size=str(hugepages.SIZES[spec.hugepages] >> 10), unit="KiB")


def _vcpus(domain: ET.Element, spec: DomainSpec) -> None:
    _sub(domain, "vcpu", str(spec.vcpus), placement="static")
    if spec.pin:
        tune = _sub(domain, "cputune")
        for vcpu, cpu in enumerate(spec.pin):
            _sub(tune, "vcpupin", vcpu=str(vcpu), cpuset=str(cpu))
        if spec.emulator_cpus:
            _sub(tune, "emulatorpin", cpuset=_cpuset(spec.emulator_cpus))


def _os(domain: ET.Element, spec: DomainSpec) -> None:
    os_ = _sub(domain, "os")
    _sub(os_, "type", "hvm", arch="x86_64", machine=spec.machine)
    _sub(os_, "kernel", str(spec.kernel))
    _sub(os_, "initrd", str(spec.initrd))
    _sub(os_, "cmdline", spec.cmdline)


def _devices(domain: ET.Element, spec: DomainSpec) -> None:
    devices = _sub(domain, "devices")
    _sub(devices, "emulator", spec.emulator)
    if spec.disk is not None:
        disk = _sub(devices, "disk", type_="file", device="disk")
        driver = {"name": "qemu", "type": "raw"}
        if spec.disk_cache:
            driver["cache"] = spec.disk_cache
        if spec.disk_aio:
            driver["io"] = spec.disk_aio
        _sub(disk, "driver", **driver)
        _sub(disk, "source", file=str(spec.disk))
        if spec.disk_bus == "virtio-scsi":
            _sub(disk, "target", dev="sda", bus="scsi")
            _sub(devices, "controller", type_="scsi", index="0", model="virtio-scsi")
        else:
            _sub(disk, "target", dev="vda", bus="virtio")
    if spec.tap is not None:
        nic = _sub(devices, "interface", type_="ethernet")
        if spec.mac:
            _sub(nic, "mac", address=spec.mac)
        _sub(nic, "target", dev=spec.tap, managed="no")
        _sub(nic, "model", type_="virtio")
    elif spec.network is not None:
        nic = _sub(devices, "interface", type_="network")
        if spec.mac:
            _sub(nic, "mac", address=spec.mac)
        _sub(nic, "source", network=spec.network)
        _sub(nic, "model", type_="virtio")
    serial = _sub(devices, "serial", type_="file")
    _sub(serial, "source", path=str(spec.console_log))
    channel = _sub(devices, "channel", type_="unix")
    _sub(channel, "source", mode="connect", path=str(spec.agent_socket))
    _sub(channel, "target", type_="virtio", name=spec.agent_port)


def domain_xml(spec: DomainSpec) -> str:
    """The domain's XML: direct kernel boot into vmtax's /init, which finds the agent's
    virtio-serial port; off (destroyed) when the guest powers off, reboots or panics."""
    domain = ET.Element("domain", type=spec.domain_type)
    _sub(domain, "name", spec.name)
    _memory(domain, spec)
    _vcpus(domain, spec)
    _os(domain, spec)
    # As virt-install writes them: without <acpi/>, libvirt starts QEMU with -no-acpi.
    features = _sub(domain, "features")
    _sub(features, "acpi")
    _sub(features, "apic")
    _cpu(domain, spec)
    for event in ("on_poweroff", "on_reboot", "on_crash"):
        _sub(domain, event, "destroy")
    _devices(domain, spec)
    ET.indent(domain)
    return ET.tostring(domain, encoding="unicode") + "\n"


# What changes in a running domain's XML from one boot to the next, and what it becomes: a
# fingerprint keeps the definition, not the boot.
_PER_BOOT = (
    (re.compile(r"(<domain\b[^>]*?)\s+id='\d+'"), r"\1"),
    (re.compile(r"/dev/pts/\d+"), "/dev/pts/N"),
    (re.compile(r"\bdomain-\d+-"), "domain-N-"),            # channel and monitor sockets
    (re.compile(r"(<target dev=')vnet\d+'"), r"\1vnetN'"),   # the domain's tap devices
    (re.compile(r"(<target type='virtio' name='[^']*') state='\w+'"), r"\1"),
    (re.compile(r"(<graphics\b[^>]*?\b(?:port|websocket)=')\d+'(?=[^>]*autoport='yes')"),
     r"\1N'"),
    (re.compile(r"(<seclabel type='dynamic'.*?</seclabel>)", re.S),
     lambda m: re.sub(r"<(label|imagelabel)>[^<]*</", r"<\1>dynamic</", m[1])),
)


def stable_xml(xml: str) -> str:
    """A running domain's XML without what each boot changes (its id, pty and socket paths,
    tap names, agent state, autoport ports, dynamic security labels)."""
    for pattern, replacement in _PER_BOOT:
        xml = pattern.sub(replacement, xml)
    return xml


_UNITS = {"b": 1, "bytes": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 1000, "m": 1 << 20,
          "mib": 1 << 20, "mb": 1000 ** 2, "g": 1 << 30, "gib": 1 << 30, "gb": 1000 ** 3}


def _bytes(element: Any, default_unit: str = "kib") -> int | None:
    if element is None or not (element.text or "").strip().isdigit():
        return None
    return int(element.text) * _UNITS.get(element.get("unit", default_unit).lower(), 1 << 10)


def hugetlb_bytes(pid: int | None, proc_root: Path = Path("/proc")) -> int | None:
    """Bytes of huge pages mapped by a process (its smaps_rollup); None if unknown."""
    if pid is None:
        return None
    try:
        text = (proc_root / str(pid) / "smaps_rollup").read_text()
    except OSError:
        return None
    found = re.findall(r"^(?:Shared|Private)_Hugetlb:\s+(\d+) kB", text, re.M)
    return sum(int(kb) << 10 for kb in found) if found else None


def domain_summary(xml: str, pid: int | None,
                   proc_root: Path = Path("/proc")) -> dict[str, Any]:
    """What matters of a running domain, from its XML and its QEMU: machine type, CPU mode,
    vCPUs, memory, huge pages and how many its QEMU was actually granted (None unknown: a
    remote URI's domain), with a one-line "summary"."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return {"summary": None}
    vcpu = root.find("vcpu")
    vcpus = int(vcpu.get("current") or vcpu.text or 0) if vcpu is not None else None
    memory = _bytes(root.find("currentMemory")) or _bytes(root.find("memory"))
    os_type = root.find("os/type")
    machine = os_type.get("machine") if os_type is not None else None
    cpu = root.find("cpu")
    cpu_mode = (cpu.get("mode") or (cpu.findtext("model") or None)) if cpu is not None else None
    backing = root.find("memoryBacking/hugepages")
    page: int | None = None
    granted: int | None = None
    if backing is not None:
        page = _bytes(backing.find("page"), "kib") or 2 << 20   # none named: the default
        mapped = hugetlb_bytes(pid, proc_root)
        granted = mapped // page if mapped is not None else None
    parts = [machine or "machine ?", f"{root.get('type')}", f"cpu {cpu_mode or 'default'}",
             f"{vcpus} vCPUs", f"{(memory or 0) >> 20} MiB"]
    if page is None:
        parts.append("no huge pages")
    else:
        wanted = (memory or 0) // page
        parts.append(f"{page >> 20} MiB huge pages: "
                     + (f"{granted} of {wanted} granted" if granted is not None
                        else f"{wanted} asked, granted unknown"))
    return {"machine": machine, "cpu": cpu_mode, "vcpus": vcpus, "memory_bytes": memory,
            "host_hugepages": {"size": f"{page >> 20}M" if page and page < 1 << 30
                               else "1G" if page else None, "granted": granted},
            "summary": " · ".join(parts)}
