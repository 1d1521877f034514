"""Host huge pages end to end with real TCG guests: `vmtax run` on a tiny plan reserves the
pages, records what was granted on both sides and puts the pool back, also on SIGINT."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import start_vmtax, vmtax

from vmtax.host import hugepages
from vmtax.results.store import Store

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(os.geteuid() != 0, reason="reserving huge pages needs root"),
    pytest.mark.skipif(hugepages.capacity_problem({"2M": 256}) is not None,
                       reason="this host cannot reserve 256 2 MiB huge pages"),
]
NR = Path("/proc/sys/vm/nr_hugepages")
PLAN = """
    runs = {runs}
    warmup = 0
    time = 1
    [targets.vm]
    accel = "tcg"
    hugepages = "2M"
    memory = "512M"
    guest_hugepages = 8
    [[workloads]]
    name = "memory"
    params = {{ memory-hugetlb = ["on", "off"], memory-block-size = "1M" }}
"""


def nr() -> int:
    return int(NR.read_text())


def our_qemus(marker: str) -> list[int]:
    """QEMU processes of this test (their scratch disk is under its results directory)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if entry.name.isdigit() and b"qemu-system" in cmdline and marker.encode() in cmdline:
            pids.append(int(entry.name))
    return pids


def hugetlbfs_mounts() -> list[str]:
    return [line for line in Path("/proc/mounts").read_text().splitlines()
            if "vmtax-hugetlbfs" in line]


def write_plan(tmp_path, runs: int) -> Path:
    plan = tmp_path / "plan.toml"
    plan.write_text(textwrap.dedent(PLAN.format(runs=runs)))
    return plan


def test_two_point_sweep_records_granted_pages_and_restores_the_pool(tmp_path):
    before = nr()
    results = tmp_path / "results"
    done = vmtax("run", str(write_plan(tmp_path, 1)), "--results", str(results), timeout=120)
    assert done.returncode == 0, done.stderr
    assert nr() == before
    assert not our_qemus(str(tmp_path)) and not hugetlbfs_mounts()
    run = Store(results).load_run("last")
    fp = run.targets["vm"]["fingerprint"]
    assert fp["host_hugepages"] == {"size": "2M", "requested": 256, "granted": 256}
    # Read from the guest's own /proc/meminfo after boot.
    assert fp["guest_hugepages"] == {"requested": 8, "granted": 8}
    assert "hugepages=8" in fp["append"].split()
    points = {(r.params["memory-hugetlb"], r.status) for r in run.reps}
    assert points == {("on", "ok"), ("off", "ok")}


def test_sigint_mid_plan_restores_the_pool_and_stops_qemu(tmp_path):
    before = nr()
    results = tmp_path / "results"
    proc = start_vmtax("run", str(write_plan(tmp_path, 20)), "--results", str(results))
    try:
        # Up: the pages are reserved and the run is stored (only once every target booted).
        deadline = time.monotonic() + 60
        while not (nr() == before + 256 and results.exists()
                   and Store(results).list_runs() and our_qemus(str(tmp_path))):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the guest did not come up within 60 s"
            time.sleep(0.2)
        time.sleep(1.5)    # into the measurements
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert nr() == before
    assert not our_qemus(str(tmp_path)) and not hugetlbfs_mounts()
    # Nothing left for the next vmtax to recover.
    assert not list(Path(os.environ["VMTAX_RUNTIME"]).glob("journal-*"))
    assert Store(results).load_run("last").status == "interrupted"


# A run as `vmtax run` holds the pool: its journal, its guardian, pages reserved.
HOLDER = """
import sys
from vmtax.host import guardian
from vmtax.host import hugepages
from vmtax.host import journal
j = journal.Journal()
with guardian.guard(j.path):
    reservation = hugepages.pool(j, "2M").reserve(int(sys.argv[1]))
    print(reservation.mountpoint, flush=True)
    sys.stdin.readline()             # until told to finish, or killed
    reservation.release()
    j.undo_all()
"""


def test_concurrent_runs_one_done_one_killed_give_the_pool_back(tmp_path):
    """Issue 16: A reserves, B reserves on top, A finishes, B is killed: the pool goes
    back to what it was before A, at once (B's guardian), not to what B found."""
    before = nr()
    runs = []
    for _ in range(2):
        run = subprocess.Popen([sys.executable, "-c", HOLDER, "16"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
        runs.append((run, run.stdout.readline().strip()))
        assert runs[-1][1], run.communicate()
    (a, _), (b, b_mount) = runs
    assert nr() == before + 32
    a.communicate("\n", timeout=30)
    assert a.returncode == 0 and nr() == before + 16
    b.kill()
    b.wait()
    deadline = time.monotonic() + 5
    while nr() != before or b_mount in Path("/proc/mounts").read_text():
        assert time.monotonic() < deadline, (nr(), before)
        time.sleep(0.05)
    assert not list(Path(os.environ["VMTAX_RUNTIME"]).glob("journal-*"))
