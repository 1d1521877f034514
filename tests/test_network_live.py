"""vmtax.host.network on the real host: a network with 8 containers' stand-ins on veth pairs and
taps for guests, reached from a client in the namespace, then removed without a trace; the
same after the owner is SIGKILLed and the journal is recovered.

Only namespaces these tests make are touched: the network's own, and the stand-ins (named
namespaces `vmtaxtest-<hex>-<i>` and `unshare --net` sleepers). Leak checks look only for
names and MACs carrying the network's id."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from vmtax.host import journal, network

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(shutil.which("ip") is None or shutil.which("nsenter") is None,
                       reason="needs iproute2 and util-linux"),
]

PORT = 7777
ROOT = Path(__file__).resolve().parent.parent


def ip_json(*args: str, ns: str | None = None) -> list[dict]:
    argv = ["ip", *(["-n", ns] if ns else []), "-j", *args]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout or "[]") if out.returncode == 0 else []


def links_in(path: str) -> list[dict]:
    out = subprocess.run(["nsenter", f"--net={path}", "ip", "-j", "link", "show"],
                         capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout or "[]") if out.returncode == 0 else []


class StandIns:
    """Network namespaces standing in for containers: half named (`ip netns add`, given as
    a path), half held by `unshare --net` sleepers (given as a pid)."""

    def __init__(self, count: int):
        self.tag = secrets.token_hex(3)
        self.names = [f"vmtaxtest-{self.tag}-{i}" for i in range(count // 2)]
        self.sleepers: list[subprocess.Popen] = []
        self.targets: list[int | str] = []
        self.paths: list[str] = []
        try:
            for name in self.names:
                subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
                self.targets.append(f"/run/netns/{name}")
            own = os.stat("/proc/self/ns/net").st_ino
            for _ in range(count - len(self.names)):
                sleeper = subprocess.Popen(["unshare", "--net", "sleep", "120"])
                self.sleepers.append(sleeper)
                # Until unshare has run, /proc/PID/ns/net is still the host's own.
                deadline = time.monotonic() + 10
                while os.stat(f"/proc/{sleeper.pid}/ns/net").st_ino == own:
                    assert time.monotonic() < deadline, "unshare --net did not start"
                    time.sleep(0.01)
                self.targets.append(sleeper.pid)
            self.paths = [network.netns_path(t) for t in self.targets]
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        for sleeper in self.sleepers:
            sleeper.kill()
            sleeper.wait()
        for name in self.names:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)


@pytest.fixture
def stand_ins(request):
    made = []

    def make(count: int) -> StandIns:
        made.append(StandIns(count))
        return made[-1]
    yield make
    for s in made:
        s.remove()


@pytest.fixture
def net():
    j = journal.Journal()       # conftest: a private runtime directory per test
    n = network.Network(j)
    yield n
    n.destroy()
    assert j.entries == {}


# One process listens in every stand-in's namespace (a socket stays in the namespace it was
# made in) and answers each connection with its index and the peer's address.
SERVER = textwrap.dedent("""
    import ctypes, os, select, socket, sys
    libc = ctypes.CDLL(None, use_errno=True)
    listeners = {}
    for index, path in enumerate(sys.argv[2:]):
        fd = os.open(path, os.O_RDONLY)
        assert libc.setns(fd, 0x40000000) == 0, ctypes.get_errno()
        os.close(fd)
        s = socket.socket()
        s.bind(("0.0.0.0", int(sys.argv[1])))
        s.listen()
        listeners[s] = index
    print("ready", flush=True)
    while listeners:
        ready, _, _ = select.select(list(listeners), [], [], 15)
        if not ready:
            sys.exit("no client came")
        for s in ready:
            conn, peer = s.accept()
            data = conn.recv(100)
            conn.sendall(f"{listeners.pop(s)} {peer[0]} ".encode() + data)
            conn.close()
""")

CLIENT = textwrap.dedent("""
    import socket, sys
    for address in sys.argv[2:]:
        with socket.create_connection((address, int(sys.argv[1])), timeout=5) as c:
            c.sendall(b"echo")
            print(c.recv(200).decode(), flush=True)
""")


def assert_reachable(net: network.Network, endpoints, paths) -> None:
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(PORT), *paths],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        client = subprocess.run([sys.executable, "-c", CLIENT, str(PORT),
                                 *(e.address for e in endpoints)],
                                preexec_fn=net.client_preexec(), capture_output=True,
                                text=True, timeout=30)
        assert client.returncode == 0, client.stderr
        # Each address answered from its own container, the client coming from the bridge.
        assert client.stdout.splitlines() == [f"{i} {net.gateway} echo"
                                              for i in range(len(endpoints))]
        assert server.wait(timeout=10) == 0
    finally:
        server.kill()
        server.wait()


def assert_nothing_left(net_id: str, name: str, container_paths, within: float = 5) -> None:
    mac = network.mac_address(net_id, 0)[:-3]        # 02:76:<id>
    deadline = time.monotonic() + within              # namespace teardown is asynchronous

    def leftovers() -> list[str]:
        found = []
        if any(ns.get("name") == name for ns in ip_json("netns", "list")):
            found.append(f"namespace {name}")
        found += [f"root: {link['ifname']}" for link in ip_json("link", "show")
                  if net_id in link["ifname"] or link.get("address", "").startswith(mac)]
        for ns in ip_json("netns", "list"):          # every named namespace, ours or not
            found += [f"{ns['name']}: {link['ifname']}"
                      for link in ip_json("link", "show", ns=ns["name"])
                      if net_id in link["ifname"] or link.get("address", "").startswith(mac)]
        for path in container_paths:
            found += [f"{path}: {link['ifname']}" for link in links_in(path)
                      if link["ifname"] != "lo"]
        return found
    while (left := leftovers()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == []


def test_eight_containers_and_taps_reachable_then_nothing_left(net, stand_ins):
    containers = stand_ins(8)
    net.create()
    assert os.path.exists(net.path)
    endpoints = [net.attach_veth(target) for target in containers.targets]
    assert len({e.address for e in endpoints}) == 8 and len({e.mac for e in endpoints}) == 8

    # Inside each container: eth0 with its address and MAC, a default route via the bridge.
    for endpoint, path in zip(endpoints, containers.paths):
        out = subprocess.run(["nsenter", f"--net={path}", "ip", "-j", "addr", "show", "eth0"],
                             capture_output=True, text=True, check=True)
        (eth0,) = json.loads(out.stdout)
        assert eth0["address"] == endpoint.mac and "UP" in eth0["flags"]
        assert [(a["local"], a["prefixlen"]) for a in eth0["addr_info"]
                if a["family"] == "inet"] == [(endpoint.address, network.PREFIX)]
        out = subprocess.run(["nsenter", f"--net={path}", "ip", "-j", "route", "show",
                              "default"], capture_output=True, text=True, check=True)
        assert [(r["gateway"], r["dev"]) for r in json.loads(out.stdout)] == \
            [(net.gateway, "eth0")]
    assert_reachable(net, endpoints, containers.paths)
    # argv_in is the other way in: the bridge and its address, seen from the namespace.
    out = subprocess.run(net.argv_in(["ip", "-j", "-4", "addr", "show", net.bridge]),
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)[0]["addr_info"][0]["local"] == net.gateway

    taps = [net.attach_tap() for _ in range(2)]
    links = {link["ifname"]: link for link in ip_json("link", "show", ns=net.name)}
    for tap in taps:
        assert links[tap.name].get("master") == net.bridge
    assert {e.name for e in endpoints} <= {n for n, link in links.items()
                                           if link.get("master") == net.bridge}
    # Nothing of the network is in the root namespace.
    assert not [link for link in ip_json("link", "show") if net.id in link["ifname"]]

    net_id, name = net.id, net.name
    with pytest.raises(AssertionError):             # the check sees what is there
        assert_nothing_left(net_id, name, containers.paths, within=0)
    net.destroy()
    assert_nothing_left(net_id, name, containers.paths)
    net.destroy()                                   # idempotent


@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="needs QEMU")
def test_qemu_opens_its_tap_from_inside_the_namespace(net):
    net.create()
    tap = net.attach_tap()
    # -S: QEMU opens its netdev at start and runs no guest code; no kernel needed.
    qemu = subprocess.Popen(["qemu-system-x86_64", "-nodefaults", "-no-user-config",
                             "-display", "none", "-S", "-machine", "microvm", "-accel", "tcg",
                             *tap.qemu_args("mmio")], preexec_fn=net.preexec(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            (link,) = ip_json("link", "show", tap.name, ns=net.name)
            if "LOWER_UP" in link["flags"]:        # a tap has carrier once a file holds it
                break
            assert qemu.poll() is None, qemu.stderr.read()
            assert time.monotonic() < deadline, link
            time.sleep(0.05)
        assert tap.name not in [link["ifname"] for link in ip_json("link", "show")]
    finally:
        qemu.kill()
        qemu.wait()
    net_id, name = net.id, net.name
    net.destroy()
    assert_nothing_left(net_id, name, [])


CRASHING_OWNER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from vmtax.host import journal
    from vmtax.host import network
    net = network.Network(journal.Journal(Path(sys.argv[1]))).create()
    for target in sys.argv[2:]:
        net.attach_veth(target)
    net.attach_tap()
    print(net.id, net.name, flush=True)
    time.sleep(120)
""")


def test_recovery_after_sigkill_removes_everything(tmp_path, stand_ins):
    containers = stand_ins(2)
    directory = tmp_path / "crashed"
    directory.mkdir()
    owner = subprocess.Popen([sys.executable, "-c", CRASHING_OWNER, str(directory),
                              *map(str, containers.targets)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=ROOT)
    try:
        line = owner.stdout.readline().split()
        assert line, owner.stderr.read()
        net_id, name = line
        assert any(ns.get("name") == name for ns in ip_json("netns", "list"))
        assert all(any(link["ifname"] == "eth0" for link in links_in(p))
                   for p in containers.paths)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        left = journal.left_behind(directory)
        lines = journal.recover(directory)      # also when the owner failed early
    assert [len(j.entries) for j in left] == [5]   # namespace, bridge, 2 veth pairs, a tap
    assert len(lines) == 1 and "undid 5" in lines[0] and "failed" not in lines[0]
    assert list(directory.glob("journal-*")) == []
    assert_nothing_left(net_id, name, containers.paths)
