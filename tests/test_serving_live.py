"""Client-server workloads end to end: iperf3's server in every kind of target, its client
on the host, host CPU recorded by a collector, and nothing of the network left after."""

import json
import re
import shutil
import subprocess

import pytest
from conftest import vmtax

pytestmark = pytest.mark.live


def _netns() -> set[str]:
    """vmtax's network namespaces (a network's, and its containers')."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {name for line in out.splitlines() if line.strip()
            if re.fullmatch(r"vmtax-[0-9a-f]{6}(-c[0-9a-f]{6})?", name := line.split()[0])}


PLAN = """
runs = 1
warmup = 1
time = 1
collect = ["host-cpu"]
[targets.native]
[targets.runc]
kind = "container"
runtime = "runc"
[targets.vm]
accel = "tcg"
network = ["bridge", "user"]   # a tap on vmtax's bridge, and the slirp fallback
[[workloads]]
name = "iperf3"
"""


def test_iperf3_in_native_container_and_guests_with_host_cpu(tmp_path):
    if shutil.which("iperf3") is None:
        pytest.skip("iperf3 is not installed (apt-get install iperf3)")
    before = _netns()
    plan = tmp_path / "iperf3.toml"
    plan.write_text(PLAN)
    run = vmtax("run", str(plan), "--results", str(tmp_path), "--json", timeout=600)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    rows = data["summary"]["rows"]
    guests = {"vm[network=bridge]", "vm[network=user]"}
    every = {"native", "runc", *guests}
    throughput = next(r for r in rows if r["metric"] == "throughput")
    assert set(throughput["cells"]) == every
    for target, cell in throughput["cells"].items():
        assert cell["n"] == 1 and cell["summary"]["median"] > 0, (target, cell)
    host_cpu = next(r for r in rows if r["metric"] == "host cpu")
    assert host_cpu["workload"] == "iperf3 (host)"
    # The guests' QEMU and the container's and host's servers were all observed.
    assert {t for t, c in host_cpu["cells"].items() if c["n"] == 1} == every
    for guest in guests:
        fingerprint = data["run"]["targets"][guest]["fingerprint"]
        assert fingerprint["boot_seconds"] > 0
        assert fingerprint["boots_seconds"] == [round(fingerprint["boot_seconds"], 4)]
        assert fingerprint["network"] == guest.split("=")[1].rstrip("]")
    assert _netns() - before == set()   # the run's network namespaces are gone
    assert not list(tmp_path.glob(".work-*"))


@pytest.mark.parametrize("runtime", ["podman", "runsc"])
def test_iperf3_server_in_podman_and_gvisor(tmp_path, runtime):
    """Runtimes that take a network namespace their own way (podman's --network=ns:,
    gVisor's netstack taking over the veth) serve a host-side client too."""
    from vmtax.core.runtime import runtimes
    why = runtimes()[runtime].unavailable()
    if why:
        pytest.skip(why)
    plan = tmp_path / "plan.toml"
    plan.write_text(f'runs = 1\nwarmup = 0\ntime = 1\n[targets.c]\nkind = "container"\n'
                    f'runtime = "{runtime}"\n[[workloads]]\nname = "iperf3"\n')
    run = vmtax("run", str(plan), "--results", str(tmp_path), "--json", timeout=600)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    throughput = next(r for r in data["summary"]["rows"] if r["metric"] == "throughput")
    assert throughput["cells"]["c"]["summary"]["median"] > 0
    assert data["run"]["targets"]["c"]["fingerprint"]["runtime"] == runtime
