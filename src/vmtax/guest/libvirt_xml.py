"""A libvirt domain's XML for a vmtax guest, from a resolved specification.

Pure functions of the specification, so the KVM host's domain (type kvm, host-passthrough,
vCPU pinning, huge pages) is checked against libvirt's schema on a host where KVM cannot
run. What is not given is left to libvirt's defaults (the disk's cache and I/O modes, the
machine's default devices): that is the configuration a libvirt user gets, which the
`libvirt` target measures against vmtax's own QEMU command line.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

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

