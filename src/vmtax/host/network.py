"""Networks vmtax creates, owns, journals and removes: a bridge in a network namespace of
its own, with VMs on tap devices and containers on veth pairs, at addresses vmtax assigns.

Layout of one network (id: 6 hex digits, `vmtax-<id>` the namespace):

    namespace vmtax-<id>          (nothing of it is in the host's root namespace)
      lo                          up
      vt<id>br   bridge           the subnet's first address, the instances' gateway;
                                  MAC 02:<id>:00:01
      vt<id>t<h> tap, on bridge   a QEMU guest's NIC (QEMU opens it from inside the namespace)
      vt<id>v<h> veth, on bridge  its peer is eth0 in a container's network namespace
    instance h                    the subnet's h-th address (h = 2..1022), MAC 02:<id>:<h, 2 octets>

The subnet is the n-th /22 of 10.213.0.0/16: 1,021 instances a network, which density
studies of containers need (500 and more; a /24 ended them at 253).

The subnet `n` is derived from the id and skips the subnets of the other vmtax networks in
existence (found in their namespaces under a host-wide lock on /run/netns). The networks are
in separate namespaces, so an overlap would do no harm; distinct subnets keep addresses in
logs and results unambiguous.

Host-side clients (a load generator) run on the host but inside the namespace: start them
with `client_preexec()` as preexec_fn (or `argv_in(argv)`, `ip netns exec`); they reach every
instance through the bridge. QEMU must open its tap from inside the namespace too
(`preexec()`): the tap is found by name in the caller's namespace, and a QEMU left in the
root namespace would silently create a new, unconnected tap of that name there.

Every namespace and device is journaled (an argv undo entry) before it is made, newest
undone first: endpoints, then the bridge, then the namespace. `destroy()` runs those undo
entries (and is idempotent); after a crash, the guardian or the next start's
`journal.recover()` runs them. Deleting the namespace would remove the devices in it anyway,
but only once no process holds it any more: a device deleted by name goes at once. (A whole
journal undone after a crash leaves them to the namespace's deletion, its processes killed
by the same undo: one by one, 200 guests' taps took seconds; `Journal.undo_all`.) Addresses
and routes live on those devices and go with them. A container's end of a veth pair is
removed with its peer (and with the container's namespace). One host change is not undone:
the first `ip netns add` on a host makes /run/netns a shared bind mount, which iproute2
keeps for every user of named namespaces.

Fallback: QEMU's user-mode network (slirp), `user_net_args()`: `-netdev user` with a
`hostfwd` from a free loopback port to the guest's server port. It needs no root, namespace
or device, but every packet passes through slirp's user-space TCP/IP stack in the QEMU
process: iperf3 host->guest measured ~0.77 Gbit/s on the reference host against ~2.6 Gbit/s
through a tap on a bridge in a namespace. Throughput and the host CPU per Gbit measured over
it are slirp's, not the virtual NIC's; results must say which network was used. vhost-net
is not used either way (`vhost=off`): the reference host has no /dev/vhost-net.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import json
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from vmtax.core.errors import VmtaxError
from vmtax.host import proc
from vmtax.host.journal import Journal

# Private addresses vmtax hands out: one /22 of this pool per network.
POOL = ipaddress.ip_network("10.213.0.0/16")
PREFIX = 22
GATEWAY_HOST = 1                    # the bridge's address in every subnet
FIRST_HOST, LAST_HOST = 2, (1 << (32 - PREFIX)) - 2   # instances' addresses
NETNS_DIR = Path("/run/netns")
DEVICE_PREFIX = "vt"                # vt<id>br, vt<id>t<h>, vt<id>v<h>: at most 13 characters
MAC_PREFIX = "02"                   # locally administered, unicast
NETDEV = "net0"
IP_TIMEOUT = 30.0

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)

Runner = Callable[[list[str]], proc.Completed]


def _run_ip(argv: list[str]) -> proc.Completed:
    try:
        return proc.run(argv, timeout=IP_TIMEOUT)
    except FileNotFoundError:
        raise VmtaxError(f"{argv[0]} is not installed (apt-get install iproute2 util-linux)") \
            from None


def enter_netns(path: str | os.PathLike[str]) -> Callable[[], None]:
    """A preexec_fn that moves the child into the network namespace at path (setns) before
    it execs. Only the child moves; mounts (/sys) stay the host's."""
    path = os.fspath(path)

    def enter() -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _libc.setns(fd, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns({path}, CLONE_NEWNET): {os.strerror(err)}")
        finally:
            os.close(fd)
    return enter


def netns_path(target: int | str | os.PathLike[str]) -> str:
    """The network namespace of a process (a pid, also as digits) or at a path (/run/netns/X,
    /proc/P/ns/net)."""
    if isinstance(target, bool):
        raise TypeError("a pid or a path, not a bool")
    if isinstance(target, str) and target.isdigit():   # a pid from a command line
        target = int(target)
    if isinstance(target, int):
        return f"/proc/{target}/ns/net"
    return os.fspath(target)


def mac_address(net_id: str, host: int) -> str:
    """The MAC of host h of network net_id: locally administered, unicast, unique among the
    networks in existence (their ids differ) and within one (h differs)."""
    octets = [net_id[i:i + 2] for i in range(0, 6, 2)]
    return ":".join([MAC_PREFIX, *octets, f"{host >> 8:02x}", f"{host & 0xFF:02x}"])


def subnet(n: int) -> ipaddress.IPv4Network:
    """The pool's n-th subnet (/PREFIX)."""
    return ipaddress.IPv4Network((int(POOL.network_address) + (n << (32 - PREFIX)), PREFIX))


def subnet_index(address: str) -> int | None:
    """n of the pool's subnet holding address (None: not in the pool)."""
    ip = ipaddress.ip_address(address)
    if ip not in POOL:
        return None
    return (int(ip) - int(POOL.network_address)) >> (32 - PREFIX)


def choose_subnet(net_id: str, used: Iterable[int]) -> int:
    """The third octet for network net_id: derived from its id, skipping those in use."""
    used = set(used)
    count = 2 ** (PREFIX - POOL.prefixlen)
    candidates = range(1, count - 1)            # not the pool's first or last: no surprises
    start = int(net_id, 16) % len(candidates)
    for i in range(len(candidates)):
        n = candidates[(start + i) % len(candidates)]
        if n not in used:
            return n
    raise VmtaxError(f"all {len(candidates)} subnets of {POOL} are in use by vmtax networks; "
                     "`vmtax cleanup` removes those of dead runs")


@dataclass
class Endpoint:
    """One instance's interface on the network: a tap for a VM or a veth pair for a
    container. `name` is the device on the bridge inside the network's namespace; `mac`,
    `address` belong to the instance's own interface (`ifname`)."""
    kind: str                    # "tap" or "veth"
    name: str
    mac: str
    address: str
    prefix: int
    gateway: str
    ifname: str = "eth0"
    netns: str | None = None     # the container's network namespace (veth)
    token: int | None = field(default=None, repr=False)   # its journal entry

    @property
    def netmask(self) -> str:
        return str(ipaddress.ip_network(f"0.0.0.0/{self.prefix}").netmask)

    @property
    def cidr(self) -> str:
        """ADDRESS/PREFIX, as `ip addr add` and the guest's /vmtax/net script take it."""
        return f"{self.address}/{self.prefix}"

    @property
    def kernel_ip(self) -> str:
        """The kernel command line's `ip=` for the guest (needs CONFIG_IP_PNP and the NIC's
        driver built in: Debian's kernel has neither, use /vmtax/net CIDR GATEWAY there)."""
        return f"ip={self.address}::{self.gateway}:{self.netmask}::{self.ifname}:off"

    def qemu_args(self, transport: str = "pci", netdev: str = NETDEV,
                  vhost: bool = False) -> list[str]:
        """QEMU's argv for a virtio-net NIC on this tap (transport "mmio" on microvm, else
        "pci"), its data path in QEMU or (vhost) in the host kernel's vhost-net; QEMU must
        start with the network's preexec() to find the tap."""
        if self.kind != "tap":
            raise VmtaxError(f"{self.name} is a {self.kind} endpoint, not a tap for QEMU")
        suffix = "device" if transport == "mmio" else "pci"
        return ["-netdev", f"tap,id={netdev},ifname={self.name},script=no,downscript=no,"
                           f"vhost={'on' if vhost else 'off'}",
                "-device", f"virtio-net-{suffix},netdev={netdev},mac={self.mac}"]


class Network:
    """A bridge in a network namespace of vmtax's own; instances attach to it."""

    def __init__(self, journal: Journal, name_prefix: str = "vmtax",
                 runner: Runner | None = None):
        self.journal = journal
        self.name_prefix = name_prefix
        self._run = runner or _run_ip
        self.id: str | None = None
        self.name: str | None = None       # the namespace
        self.n: int | None = None          # third octet of the subnet
        self.endpoints: list[Endpoint] = []
        self._ns_token: int | None = None
        self._bridge_token: int | None = None
        self._last_host = GATEWAY_HOST
        # Guests of a factory attach from threads: one address handed out at a time.
        self._lock = threading.RLock()

    # -- names and addresses --

    @property
    def bridge(self) -> str:
        return f"{DEVICE_PREFIX}{self._need_id()}br"

    @property
    def path(self) -> str:
        """The namespace's file, for setns and `nsenter --net=`."""
        return str(NETNS_DIR / self._need_name())

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        if self.n is None:
            raise VmtaxError("the network has no subnet yet: create() it first")
        return subnet(self.n)

    @property
    def gateway(self) -> str:
        return str(self.subnet[GATEWAY_HOST])

    def _need_id(self) -> str:
        if self.id is None:
            raise VmtaxError("the network does not exist: create() it first")
        return self.id

    def _need_name(self) -> str:
        self._need_id()
        return self.name  # type: ignore[return-value]

    def _ip(self, *args: str) -> list[str]:
        return ["ip", "-n", self._need_name(), *args]

    # -- running ip --

    def _must(self, argv: list[str]) -> proc.Completed:
        result = self._run(argv)
        if result.exit_code != 0:
            why = (result.stderr.strip() or result.stdout.strip()
                   or ("timed out" if result.timed_out else f"exit code {result.exit_code}"))
            raise VmtaxError(f"network {self.name}: `{' '.join(argv)}` failed: {why[-300:]}")
        return result

    def _journaled(self, undo: list[str], steps: list[list[str]]) -> int:
        """Journal undo, then run steps; if one fails, undo at once and raise."""
        token = self.journal.add(type="argv", argv=undo)
        try:
            for argv in steps:
                self._must(argv)
        except BaseException:
            with contextlib.suppress(Exception):
                self._undo(token)
            raise
        return token

    def _undo(self, token: int) -> None:
        """Run a journal entry's undo argv (as the journal would, through our runner) and
        drop the entry. A thing already gone is fine; a hung `ip` stays journaled."""
        entry = self.journal.entries.get(token)
        if entry is None:
            return
        result = self._run(entry["argv"])
        if result.timed_out:
            raise VmtaxError(f"`{' '.join(entry['argv'])}` timed out")
        self.journal.forget(token)

    # -- the network --

    @property
    def exists(self) -> bool:
        """Created and not destroyed (by this object)."""
        return self._ns_token is not None

    def create(self) -> "Network":
        """Make the namespace and its bridge; an existing network is kept as it is."""
        if self.exists:
            return self
        self.endpoints, self.n, self._last_host = [], None, GATEWAY_HOST
        for _ in range(8):
            net_id = secrets.token_hex(3)
            if not (NETNS_DIR / f"{self.name_prefix}-{net_id}").exists():
                break
        self.id, self.name = net_id, f"{self.name_prefix}-{net_id}"
        # `ip netns add` refuses an existing name, and then its undo must not run: it would
        # delete someone else's namespace.
        self._ns_token = self.journal.add(type="argv", argv=["ip", "netns", "delete", self.name])
        try:
            result = self._run(["ip", "netns", "add", self.name])
            if result.timed_out:             # it may have been made: delete it
                raise VmtaxError(f"`ip netns add {self.name}` timed out")
        except BaseException:
            with contextlib.suppress(Exception):
                self.destroy()
            raise
        if result.exit_code != 0:            # refused: nothing was made
            self._abandon()
            raise VmtaxError(f"cannot create network namespace {self.name}: "
                             f"{result.stderr.strip()[-300:]} (vmtax needs root for its "
                             "networks)")
        try:
            self._must(self._ip("link", "set", "lo", "up"))
            with self._subnet_lock():
                self.n = choose_subnet(self.id, self.used_subnets())
                self._bridge_token = self._journaled(
                    self._ip("link", "delete", self.bridge),
                    [self._ip("link", "add", self.bridge, "address",
                              mac_address(self.id, GATEWAY_HOST), "type", "bridge",
                              "forward_delay", "0", "stp_state", "0"),
                     self._ip("addr", "add", f"{self.gateway}/{PREFIX}", "dev", self.bridge),
                     self._ip("link", "set", self.bridge, "up")])
        except BaseException:
            with contextlib.suppress(Exception):   # the first failure is the one to tell
                self.destroy()
            raise
        return self

    def _abandon(self) -> None:
        if self._ns_token is not None:
            self.journal.forget(self._ns_token)
        self._ns_token = None
        self.id = self.name = None

    @contextlib.contextmanager
    def _subnet_lock(self) -> Iterator[None]:
        """Host-wide: one vmtax at a time picks a subnet and puts it on its bridge."""
        try:
            fd = os.open(NETNS_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:      # a faked ip in tests made no /run/netns
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def used_subnets(self) -> set[int]:
        """Third octets of the pool's subnets on the other vmtax networks' namespaces."""
        listing = self._run(["ip", "-j", "netns", "list"])
        if listing.exit_code != 0:
            return set()
        used = set()
        for ns in _json(listing.stdout):
            name = ns.get("name", "")
            if name == self.name or not name.startswith(f"{self.name_prefix}-"):
                continue
            addrs = self._run(["ip", "-n", name, "-j", "-4", "addr", "show"])
            if addrs.exit_code != 0:   # removed meanwhile
                continue
            for link in _json(addrs.stdout):
                for info in link.get("addr_info", []):
                    with contextlib.suppress(ValueError, KeyError):
                        n = subnet_index(info["local"])
                        if n is not None:
                            used.add(n)
        return used

    def destroy(self) -> None:
        """Remove every endpoint, the bridge and the namespace; again: nothing to do."""
        errors = []
        for endpoint in reversed(self.endpoints):
            try:
                self.detach(endpoint)
            except Exception as exc:
                errors.append(str(exc))
        for attr in ("_bridge_token", "_ns_token"):
            token = getattr(self, attr)
            if token is None:
                continue
            try:
                self._undo(token)
            except Exception as exc:    # left journaled: the final undo or next start retries
                errors.append(str(exc))
            setattr(self, attr, None)
        if errors:
            raise VmtaxError(f"network {self.name}: removing it failed: {'; '.join(errors)}")

    def __enter__(self) -> "Network":
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # -- endpoints --

    def _next_host(self) -> int:
        base = int(self.subnet.network_address)
        taken = {int(ipaddress.ip_address(e.address)) - base for e in self.endpoints}
        span = LAST_HOST - FIRST_HOST + 1
        # Round robin: an address just given back is not reused at once (stale ARP caches).
        for i in range(span):
            h = FIRST_HOST + (self._last_host - FIRST_HOST + 1 + i) % span
            if h not in taken:
                self._last_host = h
                return h
        raise VmtaxError(f"network {self.name}: all {span} addresses of {self.subnet} are "
                         "taken")

    def _need_live(self) -> None:
        if not self.exists:
            raise VmtaxError("the network does not exist: create() it first")

    def _endpoint(self, kind: str, host: int, netns: str | None = None) -> Endpoint:
        letter = {"tap": "t", "veth": "v"}[kind]
        return Endpoint(kind, f"{DEVICE_PREFIX}{self._need_id()}{letter}{host}",
                        mac_address(self._need_id(), host), str(self.subnet[host]), PREFIX,
                        self.gateway, netns=netns)

    def attach_tap(self) -> Endpoint:
        """A tap on the bridge for a QEMU guest: start QEMU with preexec() and
        endpoint.qemu_args(); the guest sets endpoint.cidr and the gateway itself."""
        with self._lock:
            self._need_live()
            endpoint = self._endpoint("tap", self._next_host())
            endpoint.token = self._journaled(
                self._ip("link", "delete", endpoint.name),
                [self._ip("tuntap", "add", "dev", endpoint.name, "mode", "tap"),
                 self._ip("link", "set", endpoint.name, "master", self.bridge, "up")])
            self.endpoints.append(endpoint)
            return endpoint

    def attach_veth(self, target: int | str | os.PathLike[str],
                    ifname: str = "eth0") -> Endpoint:
        """A veth pair from the bridge into a container's network namespace (a pid or a
        namespace path): ifname there, with the endpoint's address and default route."""
        with self._lock:
            self._need_live()
            path = netns_path(target)
            if _same_file(path, "/proc/1/ns/net") or _same_file(path, "/proc/self/ns/net"):
                # A pid that has not entered its own namespace yet (or a wrong path) would put
                # the peer, its address and a default route among the host's real interfaces.
                raise VmtaxError(f"{target} is the host's network namespace, not a container's")
            endpoint = self._endpoint("veth", self._next_host(), path)
            endpoint.ifname = ifname
            inside = ["nsenter", f"--net={path}", "ip"]
            # The peer is made in the container's namespace directly: it is never in ours or
            # the root namespace, and is removed with its peer (the undo) or with the container.
            endpoint.token = self._journaled(
                self._ip("link", "delete", endpoint.name),
                [self._ip("link", "add", endpoint.name, "type", "veth", "peer", "name", ifname,
                          "address", endpoint.mac, "netns", path),
                 self._ip("link", "set", endpoint.name, "master", self.bridge, "up"),
                 [*inside, "addr", "add", endpoint.cidr, "dev", ifname],
                 [*inside, "link", "set", ifname, "up"],
                 [*inside, "route", "add", "default", "via", self.gateway, "dev", ifname]])
            self.endpoints.append(endpoint)
            return endpoint

    def detach(self, endpoint: Endpoint) -> None:
        """Remove one endpoint's device (a veth pair goes as a whole)."""
        with self._lock:
            if endpoint.token is not None:
                self._undo(endpoint.token)
                endpoint.token = None
            with contextlib.suppress(ValueError):
                self.endpoints.remove(endpoint)

    # -- processes in the namespace --

    def preexec(self) -> Callable[[], None]:
        """preexec_fn for QEMU: it opens its tap from inside the namespace."""
        return enter_netns(self.path)

    def client_preexec(self) -> Callable[[], None]:
        """preexec_fn for host-side clients (load generators): on the host, in the
        namespace, reaching every endpoint's address through the bridge."""
        return enter_netns(self.path)

    def argv_in(self, argv: list[str]) -> list[str]:
        """argv run in the namespace by `ip netns exec` (which also gives it the
        namespace's own /sys)."""
        return ["ip", "netns", "exec", self._need_name(), *argv]


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _json(text: str) -> list[dict[str, Any]]:
    try:
        value = json.loads(text or "[]")
    except json.JSONDecodeError:
        return []
    return value if isinstance(value, list) else []


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 right now (another process may take it before QEMU)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def user_net_args(guest_port: int, transport: str = "pci", host_port: int | None = None,
                  netdev: str = NETDEV) -> tuple[list[str], int]:
    """The fallback: QEMU's user-mode network with guest_port forwarded from a free port on
    the host's loopback (~0.77 against ~2.6 Gbit/s through a tap here). Returns the argv
    fragment and the host port; the guest's address is 10.0.2.15/24, gateway 10.0.2.2."""
    port = host_port or free_loopback_port()
    suffix = "device" if transport == "mmio" else "pci"
    return (["-netdev", f"user,id={netdev},hostfwd=tcp:127.0.0.1:{port}-:{guest_port}",
             "-device", f"virtio-net-{suffix},netdev={netdev}"], port)


def tcp_listening(pid: int, port: int) -> bool:
    """Whether a TCP socket listens on port in the network namespace of process pid: read
    from the kernel's socket table, without a connection the server could take for a
    client."""
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local_address is ADDR:PORT in hex; state 0A is LISTEN.
            if (len(fields) > 3 and fields[3] == "0A"
                    and int(fields[1].rsplit(":", 1)[1], 16) == port):
                return True
    return False


def wait_tcp_listening(pids: Callable[[], list[int]], port: int, timeout: float,
                       alive: Callable[[], bool]) -> bool:
    """Until a TCP socket listens on port where the first of pids() lives; False after
    timeout or once alive() says the server is gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        found = pids()
        if found and tcp_listening(found[0], port):
            return True
        time.sleep(0.01)
    return False
