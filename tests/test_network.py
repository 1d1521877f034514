"""vmtax.host.network without touching the host: the `ip`/`nsenter` argv it runs are captured by a
fake runner, which also sees what the journal held at the moment of each command."""

from __future__ import annotations

import ipaddress
import json
import os
import socket

import pytest

from vmtax.core.errors import VmtaxError
from vmtax.host import journal, network, proc


def ok(stdout: str = "") -> proc.Completed:
    return proc.Completed(0, stdout, "", 0.0, False)


def failed(stderr: str) -> proc.Completed:
    return proc.Completed(2, "", stderr, 0.0, False)


class FakeIp:
    """Answers `ip -j netns list` and `ip -n NS -j -4 addr show` from `namespaces`
    ({name: [addresses]}, None: removed after the listing); every other command succeeds
    unless it starts with one of `failing`. Records each argv with the journal's undo
    argvs at that moment."""

    def __init__(self, j: journal.Journal, namespaces=None, failing=()):
        self.journal = j
        self.namespaces = namespaces or {}
        self.failing = [list(f) for f in failing]
        self.calls: list[list[str]] = []
        self.journaled_at: list[list[list[str]]] = []

    def __call__(self, argv):
        self.calls.append(list(argv))
        self.journaled_at.append([e["argv"] for e in self.journal.entries.values()])
        if any(argv[:len(f)] == f for f in self.failing):
            return failed("RTNETLINK answers: File exists")
        if argv == ["ip", "-j", "netns", "list"]:
            return ok(json.dumps([{"name": n} for n in self.namespaces]))
        if argv[:2] == ["ip", "-n"] and argv[3:] == ["-j", "-4", "addr", "show"]:
            if self.namespaces.get(argv[2]) is None:
                return failed(f'Cannot open network namespace "{argv[2]}"')
            return ok(json.dumps([{"ifname": "x", "addr_info": [
                {"family": "inet", "local": a, "prefixlen": 24}
                for a in self.namespaces[argv[2]]]}]))
        return ok()

    def changes(self):
        """The commands that change something (not the look-ups)."""
        return [c for c in self.calls
                if c != ["ip", "-j", "netns", "list"] and c[-3:] != ["-4", "addr", "show"]]


@pytest.fixture(autouse=True)
def _no_real_netns(tmp_path, monkeypatch):
    """Names are checked against, and the subnet lock taken on, a private directory."""
    monkeypatch.setattr(network, "NETNS_DIR", tmp_path / "netns")


@pytest.fixture
def j(tmp_path):
    d = tmp_path / "journal-dir"
    d.mkdir()
    return journal.Journal(d)


# Pids no process can have (beyond pid_max): the fake never looks at them, and the check
# against the host's own namespace finds nothing there.
PID = 9_000_000


def make(j, **fake):
    ip = FakeIp(j, **fake)
    return network.Network(j, runner=ip), ip


def test_create_makes_namespace_loopback_and_bridge_in_that_order(j):
    net, ip = make(j)
    net.create()
    name, br = net.name, net.bridge
    assert name.startswith("vmtax-") and len(name) == len("vmtax-") + 6
    int(net.id, 16)
    assert br == f"vt{net.id}br" and len(br) <= 15
    gw = net.gateway
    assert ipaddress.ip_address(gw) in network.POOL and gw.endswith(".1")
    assert ip.changes() == [
        ["ip", "netns", "add", name],
        ["ip", "-n", name, "link", "set", "lo", "up"],
        ["ip", "-n", name, "link", "add", br, "address", network.mac_address(net.id, 1),
         "type", "bridge", "forward_delay", "0", "stp_state", "0"],
        ["ip", "-n", name, "addr", "add", f"{gw}/{network.PREFIX}", "dev", br],
        ["ip", "-n", name, "link", "set", br, "up"],
    ]
    assert [e["argv"] for e in j.entries.values()] == [
        ["ip", "netns", "delete", name], ["ip", "-n", name, "link", "delete", br]]


def _journal_before_each_change(ip: FakeIp) -> None:
    """Each command that makes a thing ran with that thing's undo already journaled."""
    for argv, entries in zip(ip.calls, ip.journaled_at):
        if argv[:3] == ["ip", "netns", "add"]:
            assert ["ip", "netns", "delete", argv[3]] in entries, argv
        elif argv[3:5] == ["link", "add"]:
            assert ["ip", "-n", argv[2], "link", "delete", argv[5]] in entries, argv
        elif argv[3:5] == ["tuntap", "add"]:
            assert ["ip", "-n", argv[2], "link", "delete", argv[6]] in entries, argv


def test_every_device_is_journaled_before_it_is_made(j, tmp_path):
    net, ip = make(j)
    net.create()
    net.attach_tap()
    net.attach_veth(PID)
    net.attach_veth(tmp_path / "ns")
    made = [c for c in ip.calls if c[3:5] in (["link", "add"], ["tuntap", "add"])
            or c[:3] == ["ip", "netns", "add"]]
    assert len(made) == 5
    _journal_before_each_change(ip)
    assert len(j.entries) == 5


def test_subnet_comes_from_the_id_and_skips_those_of_other_vmtax_networks():
    # The /22s of 10.213.0.0/16 but its first and last: 62 candidates, 1..62.
    assert network.choose_subnet("000000", []) == 1
    assert network.choose_subnet("0000ff", []) == 8      # 255 % 62 = 7 -> candidates[7]
    n = network.choose_subnet("abcdef", [])
    assert network.choose_subnet("abcdef", []) == n      # stable for one id
    assert network.choose_subnet("abcdef", [n]) == n + 1 if n < 62 else 1
    assert network.choose_subnet("00003d", [62]) == 1    # wraps around
    with pytest.raises(VmtaxError, match="in use"):
        network.choose_subnet("000000", range(64))
    assert str(network.subnet(7)) == "10.213.28.0/22"
    assert network.subnet_index("10.213.28.9") == network.subnet_index("10.213.31.200") == 7
    assert network.subnet_index("10.214.7.9") is None


def test_used_subnets_looks_only_at_other_vmtax_namespaces(j):
    net, ip = make(j, namespaces={
        "vmtax-aaaaaa": ["10.213.20.1", "127.0.0.1"],
        "vmtax-bbbbbb": ["10.213.36.1", "10.99.0.1"],
        "other": ["10.213.77.1"],                      # not vmtax's: its subnet is free
        "vmtax-gone00": None,                          # listed, then removed
    })
    net.create()
    assert net.used_subnets() == {5, 9}
    assert net.n not in (5, 9)


def test_create_avoids_a_subnet_in_use(j, monkeypatch):
    monkeypatch.setattr(network.secrets, "token_hex", lambda n: "000004")  # -> subnet 5
    net, ip = make(j, namespaces={"vmtax-aaaaaa": ["10.213.20.1"]})   # subnet 5
    net.create()
    assert net.n == 6 and net.gateway == "10.213.24.1"


def test_attach_tap_builds_the_device_and_qemu_argv(j):
    net, ip = make(j)
    net.create()
    before = len(ip.calls)
    tap = net.attach_tap()
    assert tap.kind == "tap" and tap.name == f"vt{net.id}t2" and len(tap.name) <= 15
    assert ip.calls[before:] == [
        ["ip", "-n", net.name, "tuntap", "add", "dev", tap.name, "mode", "tap"],
        ["ip", "-n", net.name, "link", "set", tap.name, "master", net.bridge, "up"]]
    prefix = net.subnet.network_address
    assert tap.address == str(prefix + 2) and tap.gateway == str(prefix + 1)
    assert tap.cidr == f"{tap.address}/22" and tap.netmask == "255.255.252.0"
    assert tap.kernel_ip == f"ip={tap.address}::{tap.gateway}:255.255.252.0::eth0:off"
    assert tap.qemu_args("mmio") == [
        "-netdev", f"tap,id=net0,ifname={tap.name},script=no,downscript=no,vhost=off",
        "-device", f"virtio-net-device,netdev=net0,mac={tap.mac}"]
    assert tap.qemu_args("pci")[3] == f"virtio-net-pci,netdev=net0,mac={tap.mac}"
    assert "vhost=on" not in " ".join(tap.qemu_args())


def test_attach_veth_moves_the_peer_into_the_container_and_configures_it(j):
    net, ip = make(j)
    net.create()
    before = len(ip.calls)
    veth = net.attach_veth(PID)
    ns = f"/proc/{PID}/ns/net"
    inside = ["nsenter", f"--net={ns}", "ip"]
    assert veth.netns == ns and veth.ifname == "eth0"
    assert ip.calls[before:] == [
        ["ip", "-n", net.name, "link", "add", veth.name, "type", "veth", "peer", "name",
         "eth0", "address", veth.mac, "netns", ns],
        ["ip", "-n", net.name, "link", "set", veth.name, "master", net.bridge, "up"],
        [*inside, "addr", "add", veth.cidr, "dev", "eth0"],
        [*inside, "link", "set", "eth0", "up"],
        [*inside, "route", "add", "default", "via", net.gateway, "dev", "eth0"]]
    by_path = net.attach_veth("/run/netns/c1")
    assert by_path.netns == "/run/netns/c1"
    assert ["nsenter", "--net=/run/netns/c1", "ip", "link", "set", "eth0", "up"] in ip.calls
    with pytest.raises(VmtaxError, match="not a tap"):
        veth.qemu_args()


def test_nothing_is_made_in_the_root_namespace(j):
    net, ip = make(j)
    net.create()
    net.attach_tap()
    net.attach_veth(PID)
    for argv in ip.changes():
        # Every change runs in our namespace (ip -n) or the container's (nsenter --net);
        # the only root-namespace commands manage the named namespace itself.
        assert (argv[:3] == ["ip", "-n", net.name] or argv[:3] == ["ip", "netns", "add"]
                or argv[:2] == ["nsenter", f"--net=/proc/{PID}/ns/net"]), argv


def test_macs_are_unique_locally_administered_unicast(j, monkeypatch):
    net, _ = make(j)
    net.create()
    # 1,021 instances a network (a /22): density studies of 500 containers and more.
    eps = [net.attach_tap() if i % 2 else net.attach_veth(PID + i) for i in range(1021)]
    macs = [e.mac for e in eps] + [network.mac_address(net.id, 1)]
    assert len(set(macs)) == 1022
    assert len({e.address for e in eps}) == 1021 and len({e.name for e in eps}) == 1021
    assert max(len(e.name) for e in eps) <= 15   # IFNAMSIZ
    for mac in macs:
        first = int(mac.split(":")[0], 16)
        assert first & 0x02 and not first & 0x01
    with pytest.raises(VmtaxError, match="taken"):
        net.attach_tap()
    other = network.Network(j, runner=FakeIp(j))
    other.create()
    assert other.id != net.id
    assert network.mac_address(other.id, 2) != network.mac_address(net.id, 2)


def test_addresses_are_not_reused_at_once(j):
    net, _ = make(j)
    net.create()
    a, b = net.attach_tap(), net.attach_tap()
    net.detach(a)
    c = net.attach_tap()
    assert c.address not in (a.address, b.address)
    assert ipaddress.ip_address(c.address) == ipaddress.ip_address(b.address) + 1


def test_a_failed_step_undoes_the_device_at_once(j):
    net, ip = make(j, failing=[["nsenter"]])
    net.create()
    entries = dict(j.entries)
    with pytest.raises(VmtaxError, match="nsenter"):
        net.attach_veth(PID)
    name = f"vt{net.id}v2"
    assert ip.calls[-1] == ["ip", "-n", net.name, "link", "delete", name]
    assert j.entries == entries and net.endpoints == []


def test_a_namespace_that_could_not_be_added_is_never_deleted(j):
    # `ip netns add` failing (the name exists) must not leave an undo that would delete
    # somebody else's namespace.
    net, ip = make(j, failing=[["ip", "netns", "add"]])
    with pytest.raises(VmtaxError, match="cannot create network namespace"):
        net.create()
    assert j.entries == {} and not net.exists
    assert not any(c[:3] == ["ip", "netns", "delete"] for c in ip.calls)


def test_a_failed_bridge_removes_the_namespace(j):
    net, ip = make(j, failing=[["ip", "-n"]])
    with pytest.raises(VmtaxError):
        net.create()
    assert j.entries == {}
    assert ip.calls[-1][:3] == ["ip", "netns", "delete"]


def test_destroy_removes_newest_first_and_is_idempotent(j):
    net, ip = make(j)
    net.create()
    t, v = net.attach_tap(), net.attach_veth(PID)
    before = len(ip.calls)
    net.destroy()
    assert ip.calls[before:] == [
        ["ip", "-n", net.name, "link", "delete", v.name],
        ["ip", "-n", net.name, "link", "delete", t.name],
        ["ip", "-n", net.name, "link", "delete", net.bridge],
        ["ip", "netns", "delete", net.name]]
    assert j.entries == {} and not net.exists and net.endpoints == []
    after = len(ip.calls)
    net.destroy()
    assert len(ip.calls) == after
    with pytest.raises(VmtaxError, match="create"):
        net.attach_tap()
    old = net.name
    net.create()                                  # a new network, from scratch
    assert net.exists and net.name != old and net.endpoints == []
    assert net.attach_tap().address.endswith(".2")


def test_context_manager(j):
    with network.Network(j, runner=FakeIp(j)) as net:
        net.attach_tap()
        assert len(j.entries) == 3
    assert j.entries == {}


def test_recovery_after_a_crash_undoes_in_a_working_order(j, monkeypatch):
    net, _ = make(j)
    net.create()
    net.attach_tap(), net.attach_veth(PID)
    # The owner dies: another process finds its journal and undoes it whole. The devices
    # go with the namespace, which the same undo deletes (one `ip`, not one per device:
    # at 200 guests those took seconds; tests/test_density_undo.py).
    ran = []
    monkeypatch.setattr(journal.subprocess, "run", lambda argv, **kw: ran.append(argv))
    left = journal.Journal.at(j.path)
    assert left.undo_all() == []
    assert ran == [["ip", "netns", "delete", net.name]]
    assert left.entries == {}


def test_processes_in_the_namespace(j):
    net, _ = make(j)
    net.create()
    assert net.argv_in(["iperf3", "-c", "x"]) == ["ip", "netns", "exec", net.name,
                                                  "iperf3", "-c", "x"]
    assert net.path == str(network.NETNS_DIR / net.name)
    # The preexec opens the namespace's file (missing here: the fake made none); it is
    # only ever called in a child, never in this process.
    with pytest.raises(FileNotFoundError):
        net.client_preexec()()
    with pytest.raises(FileNotFoundError):
        net.preexec()()
    assert network.netns_path(12) == network.netns_path("12") == "/proc/12/ns/net"
    assert network.netns_path("/run/netns/x") == "/run/netns/x"


def test_user_net_fallback_forwards_a_free_loopback_port():
    args, port = network.user_net_args(5201, transport="mmio")
    assert args == ["-netdev", f"user,id=net0,hostfwd=tcp:127.0.0.1:{port}-:5201",
                    "-device", "virtio-net-device,netdev=net0"]
    with socket.socket() as s:      # free right now
        s.bind(("127.0.0.1", port))
    assert network.user_net_args(80, host_port=8080)[1] == 8080
    assert network.user_net_args(80)[0][3] == "virtio-net-pci,netdev=net0"


def test_the_host_namespace_is_refused_for_a_container(j):
    net, ip = make(j)
    net.create()
    before = len(ip.calls)
    for target in (os.getpid(), "/proc/self/ns/net", f"/proc/{os.getpid()}/ns/net"):
        with pytest.raises(VmtaxError, match="host's network namespace"):
            net.attach_veth(target)
    assert len(ip.calls) == before and net.endpoints == []


def test_a_hung_namespace_add_is_undone_not_forgotten(j):
    # A timed-out `ip netns add` may have made the namespace: its undo runs.
    net, ip = make(j)
    ip_call = ip.__call__

    def hang(argv):
        if argv[:3] == ["ip", "netns", "add"]:
            ip_call(argv)
            return proc.Completed(None, "", "", 30.0, True)
        return ip_call(argv)
    net._run = hang
    with pytest.raises(VmtaxError, match="timed out"):
        net.create()
    assert ip.calls[-1][:3] == ["ip", "netns", "delete"] and j.entries == {}


def test_tcp_listening_reads_the_socket_table_without_connecting():
    from vmtax.host.network import tcp_listening, wait_tcp_listening
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        assert not tcp_listening(os.getpid(), port)   # bound, not yet listening
        server.listen(1)
        assert tcp_listening(os.getpid(), port)
        assert wait_tcp_listening(lambda: [os.getpid()], port, 1.0, lambda: True)
        # Nobody was taken for a client: no connection waits to be accepted.
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()
    assert not wait_tcp_listening(lambda: [os.getpid()], port, 0.2, lambda: True)
    assert not wait_tcp_listening(lambda: [os.getpid()], port, 5.0, lambda: False)
