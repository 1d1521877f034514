"""libvirt's NAT network for a libvirt target's guests, as a libvirt user gets it (a virbr-
style bridge, dnsmasq, iptables rules that masquerade its subnet), but transient and vmtax's
own: the user's networks ('default' too, active or not) are never started, changed or used,
since a guest of vmtax's would need an address in them that no one else has. What net-
destroy leaves behind, measured with libvirt 9.0 here, is undone too: net.ipv4.ip_forward
set to 1, dnsmasq's pid file; and the firewall chains a libvirtd makes with its first
network (vmtax.targets.libvirt.virsh: they are the daemon's).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmtax.core.errors import VmtaxError
from vmtax.host import proc
from vmtax.host.journal import Journal, undone_by
from vmtax.targets.libvirt import virsh

FORWARDING = Path("/proc/sys/net/ipv4/ip_forward")
NETWORK_RUN_DIR = virsh.RUN_DIR / "network"
_NAT_NAME = re.compile(r"vmtax-nat-[0-9a-f]{8}")
_NAT_BRIDGE = re.compile(r"vtnat[0-9a-f]{8}")


@dataclass(frozen=True)
class NatLease:
    """One guest's place on a NAT network: its NIC's MAC, its address/prefix, the gateway."""
    network: str
    mac: str
    cidr: str
    gateway: str

    @property
    def address(self) -> str:
        return self.cidr.partition("/")[0]


@dataclass
class NatNetwork:
    """A transient NAT network vmtax defined: its name, bridge and IPv4 subnet (the bridge
    is .1; guests get static addresses from .2 on, outside any DHCP range: there is none),
    and the journal entries that undo it."""
    name: str
    bridge: str
    subnet: ipaddress.IPv4Network
    next_host: int = 2
    tokens: list[int] = field(default_factory=list)

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    def lease(self) -> NatLease:
        """The next guest's place (a MAC in QEMU's 52:54:00 range, as libvirt gives)."""
        if self.next_host >= self.subnet.num_addresses - 1:
            raise VmtaxError(f"libvirt network {self.name}: no address left in {self.subnet}")
        address = self.subnet.network_address + self.next_host
        self.next_host += 1
        mac = "52:54:00:" + ":".join(f"{b:02x}" for b in secrets.token_bytes(3))
        return NatLease(self.name, mac, f"{address}/{self.subnet.prefixlen}", self.gateway)

    def xml(self) -> str:
        return (f"<network>\n  <name>{self.name}</name>\n  <forward mode='nat'/>\n"
                f"  <bridge name='{self.bridge}' stp='off' delay='0'/>\n"
                f"  <ip address='{self.gateway}' netmask='{self.subnet.netmask}'/>\n"
                "</network>\n")


def host_subnets() -> list[ipaddress.IPv4Network]:
    """Every IPv4 subnet this host routes or has an address in (all routing tables)."""
    found = []
    for argv in (["ip", "-j", "-4", "route", "show", "table", "all"], ["ip", "-j", "-4", "addr"]):
        done = proc.run(argv, timeout=30)
        try:
            entries = json.loads(done.stdout or "[]")
        except json.JSONDecodeError:
            entries = []
        for entry in entries:
            prefixes = [entry.get("dst")] + [f"{a.get('local')}/{a.get('prefixlen')}"
                                             for a in entry.get("addr_info", [])]
            for prefix in prefixes:
                if isinstance(prefix, str) and prefix not in ("default", "None/None"):
                    with contextlib.suppress(ValueError):
                        found.append(ipaddress.IPv4Network(prefix, strict=False))
    return found


def free_subnet(taken: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/13 that overlaps none of `taken`, picked at random (two vmtax runs
    at once rarely try the same; libvirt refuses a subnet in use all the same)."""
    choices = list(ipaddress.IPv4Network("10.200.0.0/13").subnets(new_prefix=24))
    for subnet in secrets.SystemRandom().sample(choices, len(choices)):
        if not any(subnet.overlaps(t) for t in taken):
            return subnet
    raise VmtaxError("no free /24 in 10.200.0.0/13 for a libvirt NAT network: the host "
                     "routes all of it")


def start_nat_network(journal: Journal, connection: virsh.Virsh,
                      work_dir: Path) -> NatNetwork:
    """Define and start a transient NAT network of vmtax's own, each host change it brings
    journaled first: ip_forward, then the network (newest undone first). libvirt's chains
    are ensure_daemon's (networks=True)."""
    tag = secrets.token_hex(4)
    net = NatNetwork(f"vmtax-nat-{tag}", f"vtnat{tag}", free_subnet(host_subnets()))
    forwarding = FORWARDING.read_text().strip()
    if forwarding != "1":
        net.tokens.append(journal.add(type="ip-forwarding",
                                      undo=undone_by(restore_forwarding), value=forwarding))
    net.tokens.append(journal.add(type="libvirt-network", undo=undone_by(destroy_network),
                                  uri=connection.uri, name=net.name, bridge=net.bridge))
    work_dir.mkdir(parents=True, exist_ok=True)
    xml_file = work_dir / f"{net.name}.xml"
    xml_file.write_text(net.xml())
    try:
        connection.must("net-create", str(xml_file),
                   what=f"libvirt network {net.name} ({net.subnet})")
    except BaseException:
        for token in reversed(net.tokens):
            journal.undo(token)
        raise
    return net


def destroy_network(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo of a NAT network: net-destroy (libvirt removes its bridge, dnsmasq and rules),
    then what it leaves: dnsmasq's pid file and the network's ports directory; the bridge
    if libvirtd was gone."""
    name, uri, bridge = entry.get("name"), entry.get("uri"), entry.get("bridge")
    if not (isinstance(name, str) and _NAT_NAME.fullmatch(name) and isinstance(uri, str)
            and isinstance(bridge, str) and _NAT_BRIDGE.fullmatch(bridge)):
        return   # only vmtax's own networks
    if shutil.which("virsh") is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(["virsh", "--quiet", "-c", uri, "net-destroy", name],
                           capture_output=True, timeout=30)
    if Path("/sys/class/net", bridge).exists():
        subprocess.run(["ip", "link", "delete", bridge], capture_output=True, timeout=30)
    if uri == virsh.DEFAULT_URI:
        # A libvirtd gone (killed, or stopped before this undo) destroyed nothing: its
        # dnsmasq runs on, its state files stay.
        for pid in _dnsmasq_of(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        (NETWORK_RUN_DIR / f"{name}.pid").unlink(missing_ok=True)
        (NETWORK_RUN_DIR / f"{name}.xml").unlink(missing_ok=True)
        shutil.rmtree(NETWORK_RUN_DIR / name, ignore_errors=True)
        dnsmasq = virsh.DNSMASQ_DIR
        for leftover in [*dnsmasq.glob(f"{name}.*"), *dnsmasq.glob(f"{bridge}.*")]:
            leftover.unlink(missing_ok=True)


def _dnsmasq_of(name: str) -> list[int]:
    """The dnsmasq processes libvirt started for network name (by their conf file)."""
    wanted = f"--conf-file={virsh.DNSMASQ_DIR / name}.conf".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if wanted in (entry / "cmdline").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
    return found


def restore_forwarding(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo of the ip_forward libvirt turns on with a NAT network (and never off): back to
    what it was, unless a libvirt network still forwards."""
    value = entry.get("value")
    if value not in ("0", "1"):
        return
    if any(re.search(r"^-A LIBVIRT_", virsh.iptables_save(program), re.M)
           for program in virsh.IPTABLES):
        return
    FORWARDING.write_text(value)
