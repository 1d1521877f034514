"""libvirt, reached through virsh: the daemons, one call with a deadline, and the undo of
what vmtax made through it (a domain, a tap lent to libvirt, a NAT network).

virsh rather than libvirt-python: every call has a deadline of vmtax's own (a libvirtd that
accepts and never answers costs a timeout and one line, not a thread stuck in C), libvirt's
own message is what virsh prints, the guardian undoing a dead vmtax's domain in a fresh
process needs nothing but the binary, and `make deps` compiles nothing against libvirt-dev.
A call costs a process (~20 ms): paid at setup and teardown only, since jobs go over
vmtax's agent socket, never through libvirt.

This host has no systemd, so vmtax starts libvirtd and virtlogd itself where none answers
(vmtax.host.daemon). Where /dev/kvm exists but cannot run a guest (kvm.probe), libvirtd
probes QEMU as root with KVM and then finds /dev/kvm closed to the QEMU user: it calls its
capability cache stale and probes every QEMU binary again on every lookup (80 s per
`virsh create` here). The libvirtd vmtax starts there sees /dev/kvm masked by an empty
root-only file, in a mount namespace of its own, and reads a qemu.conf that is the host's
plus `namespaces = []` (libvirt cannot move that mask into each QEMU's private /dev); the
host's files are left as they are.
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from vmtax.core.errors import VmtaxError
from vmtax.host import daemon, machine, proc
from vmtax.host.daemon import Daemon
from vmtax.host.journal import Journal, undone_by
from vmtax.host.proc import running

DEFAULT_URI = "qemu:///system"
# Where QEMU, run by libvirt as libvirt-qemu, can read what vmtax copies for it (/root is
# closed to that user).
IMAGES = Path("/var/lib/libvirt/images")
# Seconds for one virsh call: a domain's start under a loaded TCG host takes a few.
CALL_TIMEOUT = 60.0
QEMU_CONF = Path("/etc/libvirt/qemu.conf")
RUN_DIR = Path("/run/libvirt")
# Where libvirtd logs each domain's QEMU (one file per name: a transient domain's outlives it).
QEMU_LOGS = Path("/var/log/libvirt/qemu")

VIRTLOGD = Daemon("virtlogd", ("virtlogd",), RUN_DIR / "virtlogd-sock")
LIBVIRTD = Daemon("libvirtd", ("libvirtd",), RUN_DIR / "libvirt-sock", needs=(VIRTLOGD,))
# $1 the private qemu.conf, $2 the mask of /dev/kvm, then libvirtd's argv.
_MASK_KVM = ('mount --bind "$1" /etc/libvirt/qemu.conf && mount --bind "$2" /dev/kvm '
             '&& shift 2 && exec "$@"')


def one_line(text: str) -> str:
    """virsh's message in one line: "error: " prefixes dropped, lines joined."""
    lines = [re.sub(r"^error:\s*", "", line.strip()) for line in text.strip().splitlines()]
    return "; ".join(line for line in lines if line)


class Virsh:
    """virsh on one connection URI; every call has a deadline."""

    def __init__(self, uri: str = DEFAULT_URI, timeout: float | None = None):
        self.uri = uri
        # In a lab (vmtax lab) libvirtd probes QEMU and starts domains under TCG.
        self.timeout = timeout or machine.lab_scaled(CALL_TIMEOUT)

    def argv(self, *args: str) -> list[str]:
        return ["virsh", "--quiet", "-c", self.uri, *args]

    def call(self, *args: str, timeout: float | None = None) -> proc.Completed:
        if shutil.which("virsh") is None:
            raise VmtaxError("virsh is not installed; install libvirt-clients")
        return proc.run(self.argv(*args), timeout=timeout or self.timeout)

    def must(self, *args: str, what: str, timeout: float | None = None) -> str:
        """virsh's stdout; VmtaxError in one line with libvirt's message when it fails or
        does not answer in time."""
        limit = timeout or self.timeout
        done = self.call(*args, timeout=limit)
        if done.timed_out:
            raise VmtaxError(f"{what}: libvirt at {self.uri} did not answer within "
                             f"{limit:g} s")
        if done.exit_code != 0:
            raise VmtaxError(f"{what}: {one_line(done.stderr or done.stdout)}")
        return done.stdout

    # A libvirtd's first answer waits for its QEMU capabilities: probed anew, that took
    # 3.6 min in a lab (lab_scaled: 5 min there).
    def connect(self, who: str = "libvirt", timeout: float = 60.0) -> str:
        """virsh's version lines; VmtaxError naming the URI when it refuses or hangs."""
        return self.must("version", what=f"{who}: uri = {self.uri!r}",
                         timeout=machine.lab_scaled(timeout))


def hugetlbfs_mounted(mounts: Path = Path("/proc/mounts")) -> bool:
    try:
        return any(line.split()[2:3] == ["hugetlbfs"] for line in mounts.read_text().splitlines())
    except OSError:
        return False


def hugetlbfs_hint(size: str = "2M") -> str:
    """What a libvirtd started without a hugetlbfs mount needs: it looks for them only when
    it starts, so one made after (vmtax's own) is never used."""
    return (f"a libvirtd finds hugetlbfs mounts only when it starts: mount one for {size} pages "
            f"before starting it (mount -t hugetlbfs -o pagesize={size} hugetlbfs "
            "/dev/hugepages), then restart it, or stop it and vmtax starts its own")


def kvm_masked() -> bool:
    """Does a libvirtd vmtax starts need /dev/kvm masked (it exists, but runs no guest)?"""
    if not os.path.exists("/dev/kvm"):
        return False
    from vmtax.host import kvm   # probing runs a tiny vCPU: only when asked
    return not kvm.probe().usable


def libvirtd(work_dir: Path, hugetlbfs: tuple[Path, ...] = ()) -> Daemon:
    """The libvirtd vmtax starts when none answers: as it is (it finds hugetlbfs mounts
    itself), or with /dev/kvm masked (see the module's doc) and told where hugetlbfs is,
    from files it writes in work_dir."""
    if not kvm_masked():
        return LIBVIRTD
    work_dir.mkdir(parents=True, exist_ok=True)
    conf = work_dir / "qemu.conf"
    try:
        host_conf = QEMU_CONF.read_text()
    except OSError:
        host_conf = ""
    mounts = (f"hugetlbfs_mount = {json.dumps([str(p) for p in hugetlbfs])}\n"
              if hugetlbfs else "")
    conf.write_text(host_conf + "\n# vmtax: /dev/kvm is masked in this libvirtd's mount "
                    "namespace\nnamespaces = []\n" + mounts)
    mask = work_dir / "no-kvm"
    mask.touch(mode=0o600)
    binary = shutil.which("libvirtd") or "libvirtd"
    return replace(LIBVIRTD, argv=("unshare", "--mount", "--propagation", "slave", "--",
                                   "sh", "-c", _MASK_KVM, "sh", str(conf), str(mask), binary))


def ensure_daemon(journal: Journal, uri: str, work_dir: Path,
                  hugetlbfs: tuple[Path, ...] = ()) -> bool:
    """Start libvirtd (and virtlogd) for a local qemu:///system URI when none answers:
    True if vmtax started it. Other URIs are the user's to run. The firewall chains that
    libvirtd makes with its first network (a NAT target's, of this vmtax or of one sharing
    the daemon) are journaled first, so they are removed after it stops."""
    if uri != DEFAULT_URI:
        return False
    if daemon.answers(LIBVIRTD.socket):
        return False
    if shutil.which("libvirtd") is None:
        raise VmtaxError("libvirtd is not installed; install libvirt-daemon-system")
    if not libvirt_chains():
        journal.add(type="libvirt-firewall-chain", undo=undone_by(remove_chains),
                    dnsmasq_dir=not DNSMASQ_DIR.exists(),
                    tables=sorted(set(IPTABLES_TABLES) - nft_tables()))
    return daemon.ensure(journal, libvirtd(work_dir, hugetlbfs), work_dir / "logs",
                         timeout=machine.lab_scaled(60.0))


def startable() -> str | None:
    """Why vmtax cannot reach or start libvirtd here (None: it can), for doctor and list."""
    for program, package in (("virsh", "libvirt-clients"), ("libvirtd", "libvirt-daemon-system"),
                             ("virtlogd", "libvirt-daemon-system")):
        if shutil.which(program) is None:
            return f"{program} is not installed; install {package}"
    if not daemon.answers(LIBVIRTD.socket) and os.geteuid() != 0:
        return "no libvirtd answers, and starting one needs root"
    return None


# --- undo ---------------------------------------------------------------------------------

def journal_domain(journal: Journal, uri: str, name: str) -> int:
    """Record a domain about to be created; its undo destroys it (a transient domain is
    then gone). Once it runs, `journal.update(token, pid=, start=)` names its QEMU, killed
    if libvirtd cannot destroy it."""
    return journal.add(type="libvirt-domain", undo=undone_by(destroy_domain), uri=uri,
                       name=name)


def destroy_domain(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo of journal_domain: destroy the domain if it is still there (libvirtd first, so
    it has recorded the domain's end before its log is removed), else kill its QEMU; then
    remove the log libvirtd kept of it."""
    name, uri = entry.get("name"), entry.get("uri")
    if not (isinstance(name, str) and re.fullmatch(r"vmtax-[A-Za-z0-9_-]+", name)
            and isinstance(uri, str)):
        return   # only vmtax's own domains are destroyed
    if shutil.which("virsh") is not None:
        try:
            subprocess.run(["virsh", "--quiet", "-c", uri, "destroy", name],
                           capture_output=True, timeout=10)
        except subprocess.TimeoutExpired:
            pass
    pid, start = entry.get("pid"), entry.get("start")
    if isinstance(pid, int) and pid > 1 and isinstance(start, int) and running(pid, start):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if uri == DEFAULT_URI:
        (QEMU_LOGS / f"{name}.log").unlink(missing_ok=True)


def journal_host_tap(journal: Journal, device: str) -> int:
    """Record a tap device about to be moved into the host's network namespace (for
    libvirt to open by name); its undo deletes it there."""
    return journal.add(type="libvirt-tap", undo=undone_by(delete_host_tap), device=device)


def delete_host_tap(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo of journal_host_tap: delete the tap if it is still in the host's namespace."""
    device = entry.get("device")
    if not isinstance(device, str) or not re.fullmatch(r"vt[0-9a-z]{1,10}", device):
        return
    if Path("/sys/class/net", device).exists():
        subprocess.run(["ip", "link", "delete", device], capture_output=True, timeout=30)


def journal_guest_dir(journal: Journal, uri: str, domain: str, path: str) -> int:
    """Record a directory about to be made in a domain's guest through its QEMU guest
    agent; its undo removes it the same way."""
    return journal.add(type="libvirt-guest-dir", undo=undone_by(remove_guest_dir), uri=uri,
                       domain=domain, path=path)


# --- a domain of the user's, as it runs ------------------------------------------------------

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
        xml = pattern.sub(replacement, xml)   # type: ignore[arg-type]
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
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError:
        return {"summary": None}
    vcpu = root.find("vcpu")
    vcpus = int(vcpu.get("current") or vcpu.text or 0) if vcpu is not None else None
    memory = _bytes(root.find("currentMemory")) or _bytes(root.find("memory"))
    os_type = root.find("os/type")
    machine = os_type.get("machine") if os_type is not None else None
    cpu = root.find("cpu")
    cpu_mode = (cpu.get("mode") or (cpu.findtext("model") or None)) if cpu is not None else None
    hugepages = root.find("memoryBacking/hugepages")
    page: int | None = None
    granted: int | None = None
    if hugepages is not None:
        page = _bytes(hugepages.find("page"), "kib") or 2 << 20   # none named: the default
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


def journal_guest_file(journal: Journal, uri: str, domain: str, handle: int) -> int:
    """Record a file the guest agent holds open for vmtax (guest-file-open's handle); its
    undo closes it. Killed mid-copy, vmtax would otherwise leave qemu-ga holding a deleted
    file's blocks on the guest's disk until qemu-ga restarts."""
    return journal.add(type="libvirt-guest-file", undo=undone_by(close_guest_file), uri=uri,
                       domain=domain, handle=handle)


def close_guest_file(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo of journal_guest_file: guest-file-close of the handle."""
    uri, domain, handle = entry.get("uri"), entry.get("domain"), entry.get("handle")
    if not (isinstance(uri, str) and isinstance(domain, str) and type(handle) is int):
        return
    _guest_agent(uri, domain, {"execute": "guest-file-close", "arguments": {"handle": handle}})


def _guest_agent(uri: str, domain: str, command: dict[str, Any]) -> None:
    """One guest agent command of an undo: best effort, within 30 s."""
    if shutil.which("virsh") is None:
        return
    try:
        subprocess.run(["virsh", "--quiet", "-c", uri, "qemu-agent-command", domain,
                        json.dumps(command)], capture_output=True, timeout=30)
    except subprocess.TimeoutExpired:
        pass


def remove_guest_dir(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo of journal_guest_dir: rm -rf the directory vmtax made in the guest."""
    uri, domain, path = entry.get("uri"), entry.get("domain"), entry.get("path")
    if not (isinstance(uri, str) and isinstance(domain, str) and isinstance(path, str)
            and re.fullmatch(r"/[^\s\"']*/\.vmtax-[0-9a-f]{12}", path)):
        return   # only a scratch directory vmtax names
    _guest_agent(uri, domain, {"execute": "guest-exec",
                               "arguments": {"path": "rm", "arg": ["-rf", "--", path]}})


# --- a NAT network of vmtax's own ----------------------------------------------------------
#
# libvirt's NAT network as a libvirt user gets it (a virbr-style bridge, dnsmasq, iptables
# rules that masquerade its subnet), but transient and vmtax's own: the user's networks
# ('default' too, active or not) are never started, changed or used, since a guest of
# vmtax's would need an address in them that no one else has. What net-destroy leaves
# behind, measured with libvirt 9.0 here, is undone too: net.ipv4.ip_forward set to 1,
# dnsmasq's pid file, and, made once per libvirtd with its first network, the LIBVIRT_*
# chains (iptables and ip6tables: filter, nat, mangle) with the jumps to them, the tables
# iptables-nft made for them and /var/lib/libvirt/dnsmasq. Those last stay with a libvirtd
# of the user's, which needs them for its next network (without them it fails it: "No
# chain/target/match by that name"); the libvirtd vmtax starts takes them with it.

FORWARDING = Path("/proc/sys/net/ipv4/ip_forward")
DNSMASQ_DIR = Path("/var/lib/libvirt/dnsmasq")
NETWORK_RUN_DIR = RUN_DIR / "network"
# (table, built-in chain, libvirt's chain), in the order libvirt 9.0 adds the jumps.
LIBVIRT_JUMPS = (("filter", "INPUT", "LIBVIRT_INP"), ("filter", "OUTPUT", "LIBVIRT_OUT"),
                 ("filter", "FORWARD", "LIBVIRT_FWX"), ("filter", "FORWARD", "LIBVIRT_FWI"),
                 ("filter", "FORWARD", "LIBVIRT_FWO"), ("nat", "POSTROUTING", "LIBVIRT_PRT"),
                 ("mangle", "POSTROUTING", "LIBVIRT_PRT"))
IPTABLES = ("iptables", "ip6tables")
# The nf_tables tables iptables-nft makes for libvirt's chains: "FAMILY NAME".
IPTABLES_TABLES = ("ip filter", "ip nat", "ip mangle", "ip6 filter", "ip6 nat", "ip6 mangle")
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


def _iptables_save(program: str) -> str:
    save = shutil.which(f"{program}-save")
    if save is None:
        return ""
    return subprocess.run([save], capture_output=True, text=True, timeout=30).stdout


def nft_tables() -> set[str]:
    """The nf_tables tables that exist ("ip filter"); all of them where nft is missing (so
    none is taken for vmtax's to remove)."""
    if shutil.which("nft") is None:
        return set(IPTABLES_TABLES)
    done = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, timeout=30)
    return {line.removeprefix("table ").strip() for line in done.stdout.splitlines()
            if line.startswith("table ")}


def libvirt_chains() -> set[str]:
    """libvirt's chains ("iptables filter LIBVIRT_INP") that exist now."""
    found = set()
    for program in IPTABLES:
        table = ""
        for line in _iptables_save(program).splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":LIBVIRT_"):
                found.add(f"{program} {table} {line[1:].split()[0]}")
    return found


def start_nat_network(journal: Journal, virsh: Virsh, work_dir: Path) -> NatNetwork:
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
                                  uri=virsh.uri, name=net.name, bridge=net.bridge))
    work_dir.mkdir(parents=True, exist_ok=True)
    xml_file = work_dir / f"{net.name}.xml"
    xml_file.write_text(net.xml())
    try:
        virsh.must("net-create", str(xml_file),
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
    if uri == DEFAULT_URI:
        # A libvirtd gone (killed, or stopped before this undo) destroyed nothing: its
        # dnsmasq runs on, its state files stay.
        for pid in _dnsmasq_of(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        (NETWORK_RUN_DIR / f"{name}.pid").unlink(missing_ok=True)
        (NETWORK_RUN_DIR / f"{name}.xml").unlink(missing_ok=True)
        shutil.rmtree(NETWORK_RUN_DIR / name, ignore_errors=True)
        for leftover in [*DNSMASQ_DIR.glob(f"{name}.*"), *DNSMASQ_DIR.glob(f"{bridge}.*")]:
            leftover.unlink(missing_ok=True)


def _dnsmasq_of(name: str) -> list[int]:
    """The dnsmasq processes libvirt started for network name (by their conf file)."""
    wanted = f"--conf-file={DNSMASQ_DIR / name}.conf".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if wanted in (entry / "cmdline").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
    return found


def remove_chains(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo of libvirt's chains, which a libvirtd makes once, with its first network, and
    never removes: gone, with the jumps to them, once that libvirtd has stopped (a running
    one would fail its next network without them) and no rule is left in them."""
    if daemon.answers(LIBVIRTD.socket):
        return   # the libvirtd vmtax started serves another vmtax still: it made them
    if not libvirt_chains():   # it started no network
        _remove_dnsmasq_dir(entry)
        return
    saved = {program: _iptables_save(program) for program in IPTABLES}
    if any(re.search(r"^-A LIBVIRT_", text, re.M) for text in saved.values()):
        return   # a libvirt network runs still
    for program in IPTABLES:
        if shutil.which(program) is None:
            continue
        for table, chain, target in LIBVIRT_JUMPS:
            subprocess.run([program, "-w", "-t", table, "-D", chain, "-j", target],
                           capture_output=True, timeout=30)
        for table, _, target in LIBVIRT_JUMPS:
            subprocess.run([program, "-w", "-t", table, "-X", target], capture_output=True,
                           timeout=30)
    # The tables iptables-nft made for them, where no rule or chain of anyone's is left.
    tables = entry.get("tables")
    for table in tables if isinstance(tables, list) and shutil.which("nft") else ():
        family, _, name = str(table).partition(" ")
        if table not in IPTABLES_TABLES:
            continue
        text = _iptables_save("iptables" if family == "ip" else "ip6tables")
        body = text.partition(f"*{name}\n")[2].partition("COMMIT")[0]
        if not re.search(r"^(-A |:(?!(PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) ))", body,
                         re.M):
            subprocess.run(["nft", "delete", "table", family, name], capture_output=True,
                           timeout=30)
    _remove_dnsmasq_dir(entry)


def _remove_dnsmasq_dir(entry: dict[str, Any]) -> None:
    if entry.get("dnsmasq_dir") is True:
        with contextlib.suppress(OSError):
            DNSMASQ_DIR.rmdir()   # only when empty


def restore_forwarding(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo of the ip_forward libvirt turns on with a NAT network (and never off): back to
    what it was, unless a libvirt network still forwards."""
    value = entry.get("value")
    if value not in ("0", "1"):
        return
    if any(re.search(r"^-A LIBVIRT_", _iptables_save(program), re.M)
           for program in IPTABLES):
        return
    FORWARDING.write_text(value)
