"""Client-server workloads end to end: iperf3's server in every kind of target, its client
on the host, host CPU recorded by a collector, and nothing of the network left after."""

import json
import shutil
import subprocess

import pytest

from conftest import vmtax

pytestmark = pytest.mark.live


def _netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_iperf3_in_native_container_and_guest_with_host_cpu(tmp_path):
    if shutil.which("iperf3") is None:
        pytest.skip("iperf3 is not installed (apt-get install iperf3)")
    before = _netns()
    run = vmtax("run", "--targets", "native,container:runc,vm:tcg", "--workloads", "iperf3",
                "--collect", "host-cpu", "--runs", "1", "--warmup", "1", "--time", "1",
                "--results", str(tmp_path), "--json", timeout=600)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    rows = data["summary"]["rows"]
    throughput = next(r for r in rows if r["metric"] == "throughput")
    assert set(throughput["cells"]) == {"native", "container:runc", "vm:tcg"}
    for target, cell in throughput["cells"].items():
        assert cell["n"] == 1 and cell["summary"]["median"] > 0, (target, cell)
    host_cpu = next(r for r in rows if r["metric"] == "host cpu")
    assert host_cpu["workload"] == "iperf3 (host)"
    # The guest's QEMU and the container's and host's servers were all observed.
    assert {t for t, c in host_cpu["cells"].items() if c["n"] == 1} == {
        "native", "container:runc", "vm:tcg"}
    assert data["run"]["targets"]["vm:tcg"]["fingerprint"]["boot_seconds"] > 0
    assert data["run"]["targets"]["vm:tcg"]["fingerprint"]["network"] == "user"
    assert _netns() - before == set()   # the run's network namespaces are gone
    assert not list(tmp_path.glob(".work-*"))
