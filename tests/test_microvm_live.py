"""Firecracker and Cloud Hypervisor, live, through the lab (their KVM is the lab's nested
one): one lab session runs a plan that sets them beside native (every workload kind: CPU,
disk, a server in the guest; VM exits recorded on each VMM's process), cold boots of each,
a small density study, and a kill -9 of vmtax while each one's guest is up. The VMMs are
the builds `make builds` made from ../shared/vendor's release tarballs
(vmtax.helpers.vmm_build), which the targets find in the cache. (QEMU's KVM guests have
their own lab session: tests/test_lab_live.py.)"""

import json
import os
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from conftest import vmtax
from vmtax.host import guardian, kvm
from vmtax.host.journal import Journal
from vmtax.host.machine import LAB_LABEL
from vmtax.studies import lab as lab_study

pytestmark = [pytest.mark.live,
              pytest.mark.skipif(os.geteuid() != 0, reason="the lab's KVM needs root"),
              pytest.mark.skipif(kvm.probe().usable,
                                 reason="this host's KVM runs guests itself: no lab needed")]

MICROVMS = ("firecracker", "cloud-hypervisor")
# The minimal kernel (everything built in): an L2 boots in seconds, not a minute. iperf3's
# server in each guest, its client in the lab: each VMM's tap and virtio-net carry it. A
# small fileio: a microVM's disk does a few MB/s in the lab (each request nested exits).
PLAN = """
runs = 1
warmup = 0
time = 1
collect = ["exits"]
baseline = "native"

[targets.native]
kind = "native"

[targets.firecracker]
kind = "firecracker"
kernel = "minimal"
memory = "256M"

[targets.cloud-hypervisor]
kind = "cloud-hypervisor"
kernel = "minimal"
memory = "256M"

[[workloads]]
name = "cpu"

[[workloads]]
name = "fileio"
params = { file-total-size = "8M", threads = 2 }

[[workloads]]
name = "iperf3"
"""
SESSION = {
    "run": ["run", "plan.toml", "--name", "microvms"],
    # A profile of Firecracker's process (its vCPU threads told apart by their names).
    "profile": ["run", "--targets", "firecracker", "--workloads", "cpu", "--collect",
                "profile", "--kernel", "minimal", "--runs", "1", "--warmup", "0", "--time",
                "1", "--name", "fcprofile"],
    "boot": ["boot", "--target", ",".join(MICROVMS), "--count", "1", "--warmup", "0",
             "--kernel", "minimal", "--json"],
    "density": ["density", "--targets", ",".join(MICROVMS), "--max", "2", "--singles", "2",
                "--ksm", "off", "--json"],
    **{f"kill9 {kind}": ["kill9", kind] for kind in MICROVMS},
}
PROGRAM = (sys.executable, str(Path(__file__).parent / "lab_programs" / "session.py"))


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    work = tmp_path_factory.mktemp("microvms")
    (work / "plan.toml").write_text(PLAN)
    said: dict[str, list[bytes]] = {"out": [], "err": []}
    cwd = os.getcwd()
    os.chdir(work)
    started = time.monotonic()
    journal = Journal()
    try:
        with guardian.guard(journal.path):
            outcome = lab_study.run(list(SESSION.values()), lab_study.LabConfig(),
                                    results=work / "results", journal=journal,
                                    echo=(said["out"].append, said["err"].append),
                                    say=print, program=PROGRAM)
    finally:
        os.chdir(cwd)
    print(f"lab session: {time.monotonic() - started:.0f} s, {outcome.seconds}")
    for name, done in zip(SESSION, outcome.commands):
        print(f"--- {name}: exit {done.exit_code}\n{done.stdout.decode(errors='replace')}"
              f"\n{done.stderr.decode(errors='replace')[-3000:]}")
    return work, dict(zip(SESSION, outcome.commands))


def _done(session, name: str) -> str:
    """What the session's command printed on stdout (its exit status 0 asserted)."""
    done = session[1][name]
    assert done.exit_code == 0, done.stderr.decode(errors="replace")[-3000:]
    return done.stdout.decode(errors="replace")


def _db(work: Path) -> sqlite3.Connection:
    db = sqlite3.connect(work / "results" / "vmtax.sqlite")
    db.row_factory = sqlite3.Row
    return db


def _targets(work: Path, run_id: str) -> dict[str, dict]:
    return {row["name"]: json.loads(row["fingerprint"]) for row in _db(work).execute(
        "SELECT name, fingerprint FROM targets WHERE run_id = ?", (run_id,))}


def _run_id(work: Path, name: str) -> str:
    row = _db(work).execute("SELECT id FROM runs WHERE json_extract(plan, '$.name') = ?",
                            (name,)).fetchone()
    return str(row["id"])


def test_each_vmm_runs_every_workload_kind_labelled_nested(session):
    out = _done(session, "run")
    work = session[0]
    run_id = _run_id(work, "microvms")
    reps = _db(work).execute("SELECT target, workload, status, error FROM reps WHERE "
                             "run_id = ? AND phase = 'measure'", (run_id,)).fetchall()
    for target in MICROVMS:
        for workload in ("cpu", "fileio", "iperf3"):
            cell = [r for r in reps if (r["target"], r["workload"]) == (target, workload)]
            assert cell and all(r["status"] == "ok" for r in cell), [dict(r) for r in cell]
    host, = _db(work).execute("SELECT host FROM runs WHERE id = ?", (run_id,)).fetchone()
    assert json.loads(host)["lab"] == LAB_LABEL
    assert LAB_LABEL in " ".join(out.split())   # the table's title says so


def test_the_fingerprint_names_the_vmm_its_build_and_the_config_sent(session):
    _done(session, "run")
    targets = _targets(session[0], _run_id(session[0], "microvms"))
    fc, ch = targets["firecracker"], targets["cloud-hypervisor"]
    assert fc["vmm_version"] == "Firecracker v1.16.1" and len(fc["vmm_sha256"]) == 64
    assert ch["vmm_version"].startswith("cloud-hypervisor v53.0")
    assert fc["config"]["machine-config"]["vcpu_count"] == 2
    assert "vmtax.vsock=1024" in fc["append"] and "vmtax.bus=pci" in ch["append"]
    assert "boot=2" in ch["config"]
    assert fc["network"] == ch["network"] == "bridge"   # iperf3's server in the guest
    assert fc["lab"] == ch["lab"] == LAB_LABEL


def test_exits_are_recorded_on_each_vmms_process(session):
    _done(session, "run")
    for target in MICROVMS:
        shown = vmtax("exits", f"microvms:{target}", "--workload", "cpu", "--results",
                      str(session[0] / "results"), "--json")
        assert shown.returncode == 0, shown.stderr
        print(target, shown.stdout[:1500])
        assert json.loads(shown.stdout), target


def test_a_profile_of_the_vmms_process_by_thread_class(session):
    _done(session, "profile")
    shown = vmtax("profile", "show", "fcprofile:firecracker", "--results",
                  str(session[0] / "results"), "--json")
    assert shown.returncode == 0, shown.stderr
    print(shown.stdout[:2000])
    assert "vcpu" in shown.stdout.lower()


def test_cold_boots_of_each_vmm_with_the_guests_share(session):
    started = json.loads(_done(session, "boot"))["targets"]
    for target in MICROVMS:
        times = started[f"{target}@minimal"]
        assert times["ready"]["n"] == 1
        # The guest's own uptime at READY is part of the VMM's start to READY.
        assert 0 < times["guest ready"]["p50"] < times["ready"]["p50"] <= times[
            "first http"]["p50"]
        assert 0 < times["vmm before the guest"]["p50"] < times["ready"]["p50"]


def test_density_splits_a_guests_memory_into_its_ram_and_the_vmms_own(session):
    found = json.loads(_done(session, "density"))
    rows = {s["target"]: s for s in found["summaries"]}
    for target in MICROVMS:
        row = rows[target]
        assert row["instances"] == 2 and row["all_answered"], row
        assert 0 < row["guest_ram"] < row["pss"], row


@pytest.mark.parametrize("kind", MICROVMS)
def test_kill_9_leaves_no_vmm_socket_tap_or_file_within_5_s(session, kind):
    """Inside the lab: vmtax killed while its guest serves iperf3; its guardian undoes
    what the journal holds (tests/lab_programs/kill9_microvm.py)."""
    assert f"{kind}: nothing left " in _done(session, f"kill9 {kind}")
