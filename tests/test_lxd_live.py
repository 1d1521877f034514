"""Live tests of the lxd target: a real LXD daemon, started as vmtax starts it when none
runs, real containers, vmtax's bridge; kill -9 of vmtax leaves nothing of it in LXD."""

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
from conftest import start_vmtax, wait_for

from vmtax.core import plugin
from vmtax.core import target as targets
from vmtax.core import workload as workloads
from vmtax.core.target import TargetContext
from vmtax.core.types import Endpoint, Job
from vmtax.helpers import lxd_api
from vmtax.host import daemon
from vmtax.host.journal import Journal
from vmtax.host.network import Network
from vmtax.studies import density
from vmtax.studies.factory import InstanceFactory
from vmtax.targets import lxd
from vmtax.targets.lxd import LxdTarget

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(os.geteuid() != 0, reason="LXD needs root"),
    pytest.mark.skipif(LxdTarget.unavailable() is not None,
                       reason=str(LxdTarget.unavailable())),
]
LXD_DIR = Path("/var/lib/lxd")
# The guardian undoes a killed vmtax's journal: its containers, profile, pool and network,
# then stops the daemon it started (~1 s with no container left).
UNDONE_WITHIN = 5.0


def vmtax_objects() -> list[str]:
    """What vmtax made in LXD or LXC, as their directories show it (with or without a
    daemon): containers, storage pools; and the monitors of vmtax's containers."""
    found = [str(p) for d in (LXD_DIR / "containers", LXD_DIR / "storage-pools", lxd.LXC_ROOT)
             for p in d.glob(f"{lxd_api.PREFIX}*")]
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if cmdline.startswith("[lxc monitor]") and f" {lxd_api.PREFIX}" in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


def lxd_config(client: lxd_api.Lxd) -> dict:
    """LXD's own configuration: the default profile, every profile, pool and network LXD
    manages (its network list also names every host interface, which other programs add and
    remove while the test runs)."""
    return {"default": client.do("GET", "/1.0/profiles/default"),
            **{collection: sorted(client.do("GET", f"/1.0/{collection}"))
               for collection in ("profiles", "storage-pools")},
            "networks": sorted(n["name"] for n in client.do("GET", "/1.0/networks?recursion=1")
                               if n.get("managed")),
            "server": client.do("GET", "/1.0").get("config")}


@pytest.mark.parametrize("name", ["lxd", "lxd:lxc"])
def test_kill_9_of_vmtax_leaves_no_container_network_or_daemon_of_its_own(name, tmp_path):
    assert not vmtax_objects(), "vmtax's LXD objects before the test"
    ran_before = daemon.answers(lxd_api.SOCKET)
    proc = start_vmtax("run", "--targets", name, "--workloads", "iperf3,cpu", "--runs", "20",
                       "--warmup", "0", "--time", "1", "--results", str(tmp_path / "results"))
    runtime = Path(os.environ["VMTAX_RUNTIME"])
    deadline = time.monotonic() + 120
    while not any("monitor" in p for p in vmtax_objects()) or not namespaces(runtime):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no LXD container of vmtax's serving after 120 s"
        time.sleep(0.1)
    time.sleep(1)    # an iperf3 cell under way
    made = namespaces(runtime)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    killed = time.monotonic()
    while True:
        left = [*vmtax_objects(), *(str(p) for p in runtime.glob("journal-*")),
                *(["the daemon vmtax started"] if not ran_before
                  and daemon.answers(lxd_api.SOCKET, timeout=0.2) else []),
                *(f"netns {n}" for n in made if (Path("/run/netns") / n).exists())]
        if not left:
            break
        assert time.monotonic() - killed < UNDONE_WITHIN, left
        time.sleep(0.1)


def namespaces(runtime: Path) -> set[str]:
    """The network namespaces the journals in runtime list (the run's own network)."""
    found = set()
    for path in runtime.glob("journal-*.json"):
        try:
            entries = json.loads(path.read_text()).values()
        except (OSError, ValueError):   # being rewritten
            continue
        found |= {e["argv"][3] for e in entries
                  if e.get("type") == "argv" and e["argv"][1:3] == ["netns", "delete"]}
    return found


@pytest.fixture(scope="module", params=["lxd", "lxc"])
def lxd_target(request, tmp_path_factory):
    manager = request.param
    if LxdTarget.variants()[manager] is not None:
        pytest.skip(str(LxdTarget.variants()[manager]))
    base = tmp_path_factory.mktemp(manager)
    journal = Journal(base / "journal")
    client = lxd_api.Lxd()
    # As vmtax itself does: started when none answers, journaled, stopped by the journal.
    started = manager == "lxd" and lxd.ensure_daemon(journal, base / "logs", client)
    before = lxd_config(client) if manager == "lxd" else None
    binaries = ("sysbench", "iperf3", *(("nginx",) if shutil.which("nginx") else ()))
    ctx = TargetContext(work_dir=base / "work", journal=journal, binaries=binaries,
                        serves=True, make_network=lambda: Network(journal).create())
    target = targets.create(f"lxd:{manager}", "lxd", {"cpus": 1, "manager": manager}, ctx)
    try:
        target.prepare()
        yield target
    finally:
        target.cleanup()
        if ctx.network is not None:
            ctx.network.destroy()
        after = lxd_config(client) if manager == "lxd" else None
        left = vmtax_objects()
        journal.undo_all()
    assert after == before, "LXD's configuration changed"
    assert not left, left
    if started:
        assert not daemon.answers(lxd_api.SOCKET), "the daemon vmtax started still runs"


def test_sysbench_cpu_in_a_container_of_one_cpu(lxd_target):
    result = lxd_target.run(Job(["sysbench", "cpu", "--cpu-max-prime=2000", "--time=1",
                                 "run"], timeout=60))
    assert result.ok, result.stderr
    assert re.search(r"events per second:\s+[0-9.]+", result.stdout)
    assert 0.9 < result.host_elapsed < 20
    nproc = lxd_target.run(Job(["nproc"], timeout=60))
    assert nproc.stdout.strip() == "1"   # limits.cpu
    scratch = lxd_target.run(Job(["sh", "-c", 'pwd; test -n "$SECRET" && echo set'],
                                 env={"SECRET": "x"}, in_scratch=True, timeout=60))
    assert scratch.stdout.split() == ["/work", "set"]


def test_a_job_past_its_timeout_is_killed_and_the_container_runs_on(lxd_target):
    result = lxd_target.run(Job(["sh", "-c", "sleep 4711 & sleep 4711"], timeout=1))
    assert result.timed_out and result.exit_code is None
    left = lxd_target.run(Job(["sh", "-c", "ps -o args | grep -c '^sleep 4711'"], timeout=60))
    assert left.stdout.strip() == "0", left
    assert lxd_target.alive()


def test_iperf3_from_the_host_to_a_server_in_the_container(lxd_target):
    iperf3 = workloads.get("iperf3")
    workload = iperf3(plugin.build(iperf3.Options, {"time": 1}, "iperf3", strict=False))
    endpoint = lxd_target.start_server(workload.server_job(), iperf3.server_port)
    try:
        assert endpoint.listening and endpoint.address.startswith("10.213.")
        job = workload.client_job(endpoint)
        from vmtax.host import proc
        done = proc.run(job.argv, timeout=job.timeout, preexec=endpoint.client_preexec)
        assert done.exit_code == 0, done.stderr
        throughput = {m.name: m.value for m in workload.parse(done.stdout)}["throughput"]
        assert throughput > 0.1    # Gbit/s
    finally:
        lxd_target.stop_server(endpoint)
    lxd_target.stop_server(Endpoint("", 0, handle=endpoint.handle))   # again: nothing


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed")
def test_density_of_two_instances_each_answering_http(lxd_target):
    network = lxd_target.ctx.shared_network()
    with InstanceFactory(lxd_target, network) as factory:
        instances = factory.start(2, parallel=2, job=density.serve_job())
        answers = density.probe_http(instances, timeout=60)
        assert len(answers) == 2 and all(v is not None for v in answers.values()), answers
        rss, pss = density.memory_of([p for i in instances for p in i.host_pids()])
        assert pss > 1024 and rss >= pss           # KiB: nginx, init and the monitor
        assert all(i.boot_seconds and i.boot_seconds < 60 for i in instances)
        monitors = [i.host_pids()[-1] for i in instances]
    # The monitors exit once their containers are gone.
    assert wait_for(lambda: not [p for p in monitors if Path(f"/proc/{p}").exists()], 10)
