"""Live tests of container:docker: the real dockerd, started by vmtax as a user's run starts
it; cpu and iperf3 on Docker's bridge and on the host's network; the host's network as it was
afterwards; nothing of vmtax's left within 5 s of a kill -9."""

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import processes, start_vmtax, vmtax, wait_for

from vmtax.host import daemon
from vmtax.targets import docker

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(os.geteuid() != 0, reason="dockerd needs root"),
    pytest.mark.skipif(docker.Docker.unavailable() is not None,
                       reason=str(docker.Docker.unavailable())),
]

PLAN = """\
runs = 1
warmup = 0
time = 1
baseline = "bridge"

[targets.bridge]
kind = "container"
runtime = "docker"

[targets.host]
kind = "container"
runtime = "docker"
network = "host"

[[workloads]]
name = "cpu"

[[workloads]]
name = "iperf3"
"""
KILLED_PLAN = """\
runs = 1
warmup = 0
time = 60

[targets.bridge]
kind = "container"
runtime = "docker"

[[workloads]]
name = "iperf3"
"""
SYSCTLS = ("net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding",
           "net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables",
           "net/bridge/bridge-nf-call-arptables")


def run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout


def host_network() -> dict[str, object]:
    """What a default dockerd changes for good: firewall rules and policies (without their
    packet counters), forwarding and bridge-netfilter settings, network devices."""
    rules = {tool: [re.sub(r"\[\d+:\d+\]", "", line) for line in run(tool).splitlines()
                    if not line.startswith("#")]
             for tool in ("iptables-save", "ip6tables-save")}
    sysctls = {name: Path("/proc/sys", name).read_text().strip() for name in SYSCTLS
               if Path("/proc/sys", name).exists()}
    links = sorted(re.sub(r" state \S+", "", line.split("\\")[0])
                   for line in run("ip", "-o", "link").splitlines())
    return {"rules": rules, "sysctls": sysctls, "links": links}


def leftovers(dockerds_before: set[int]) -> list[str]:
    """vmtax's Docker objects and daemons: containers, networks, bridges, cgroups, and any
    dockerd or containerd shim that was not running before."""
    found = [f"dockerd {pid}" for pid in processes("dockerd") - dockerds_before]
    if daemon.answers(docker.SOCKET):
        for what in (("ps", "--all"), ("network", "ls")):
            out = run(*docker.cli(), *what, "--filter=name=vmtax-", "--format={{.Names}}"
                      if what[0] == "ps" else "--format={{.Name}}")
            found += [f"{what[0]} {name}" for name in out.split()]
    found += [line.split(":")[1].strip() for line in run("ip", "-o", "link").splitlines()
              if re.match(r"\d+: vtd", line)]
    found += [str(p) for p in Path("/sys/fs/cgroup").glob("*/vmtax-docker-*")]
    return found


@pytest.fixture
def dockerds():
    """The dockerd processes already running (someone else's, left alone)."""
    return processes("dockerd")


def test_cpu_and_iperf3_on_the_bridge_and_the_hosts_network(tmp_path, dockerds):
    ours = not daemon.answers(docker.SOCKET)    # vmtax starts dockerd itself
    before = host_network()
    plan = tmp_path / "docker.toml"
    plan.write_text(PLAN)
    done = vmtax("run", str(plan), "--json", "--results", str(tmp_path / "results"),
                 timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["metric"]: r["cells"] for r in json.loads(done.stdout)["summary"]["rows"]}
    for metric in ("events/s", "throughput"):
        for target in ("bridge", "host"):
            cell = rows[metric][target]
            assert cell["failed"] == 0 and cell["summary"]["median"] > 0, (metric, target)
    assert leftovers(dockerds) == []
    if ours:   # a dockerd that was running may have changed the host before; ours must not
        assert host_network() == before


def test_kill_9_mid_run_leaves_nothing_within_5_s(tmp_path, dockerds):
    plan = tmp_path / "docker.toml"
    plan.write_text(KILLED_PLAN)
    owner = start_vmtax("run", str(plan), "--results", str(tmp_path / "results"))
    try:
        # Mid-run: iperf3's client on the host measures the server in the job container.
        assert wait_for(lambda: any(b"-c" in Path(f"/proc/{pid}/cmdline").read_bytes()
                                    for pid in processes("iperf3")), 120, step=0.1), \
            owner.stderr.read() if owner.poll() is not None else "no iperf3 client"
        assert any(name.startswith("ps vmtax-") for name in leftovers(dockerds))
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        # The guardian undoes the journal: containers, network, cgroups, then the daemon.
        assert wait_for(lambda: leftovers(dockerds) == [], 5, step=0.1), leftovers(dockerds)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_boot_starts_containers_that_answer_http(tmp_path, dockerds):
    done = vmtax("boot", "--target", "container:docker", "--count", "2", "--json",
                 "--results", str(tmp_path / "results"), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    times = json.loads(done.stdout)["targets"]["container:docker"]
    # Both measured starts were ready, and both answered HTTP on Docker's bridge.
    assert times["ready"]["n"] == times["first http"]["n"] == 2, times
    assert 0 < times["ready"]["max"] <= times["first http"]["max"] < 60, times
    assert leftovers(dockerds) == []
