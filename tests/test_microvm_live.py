"""Firecracker and Cloud Hypervisor, live, through the lab (their KVM is the lab's nested
one): one lab session runs a plan that sets them beside native and QEMU's microvm under
KVM (VM exits recorded on each VMM's process), then cold boots of each, then a small
density study. The VMMs are the builds `make builds` made from ../shared/vendor's release
tarballs (vmtax.helpers.vmm_build), which the targets find in the cache."""

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from conftest import vmtax
from vmtax.host import kvm
from vmtax.host.machine import LAB_LABEL

pytestmark = [pytest.mark.live,
              pytest.mark.skipif(os.geteuid() != 0, reason="the lab's KVM needs root"),
              pytest.mark.skipif(kvm.probe().usable,
                                 reason="this host's KVM runs guests itself: no lab needed")]

MICROVMS = ("firecracker", "cloud-hypervisor")
# The minimal kernel (everything built in): an L2 boots in seconds, not a minute. iperf3's
# server in each guest, its client in the lab: each VMM's tap and virtio-net carry it.
PLAN = """
runs = 1
warmup = 0
time = 1
collect = ["exits"]
baseline = "native"

[targets.native]
kind = "native"

[targets.qemu]
kind = "vm"
accel = "kvm"
kernel = "minimal"
memory = "256M"

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
params = { file-total-size = "64M", threads = 2 }

[[workloads]]
name = "iperf3"
"""
SESSION = """run plan.toml --name microvms
boot --target firecracker,cloud-hypervisor --count 2 --warmup 0 --kernel minimal
density --targets firecracker,cloud-hypervisor --max 2 --singles 2 --ksm off
"""
LAB_TIMEOUT = 1800


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    work = tmp_path_factory.mktemp("microvms")
    (work / "plan.toml").write_text(PLAN)
    (work / "session.txt").write_text(SESSION)
    started = time.monotonic()
    done = vmtax("lab", "--results", str(work / "results"), "--session", "session.txt",
                 cwd=work, timeout=LAB_TIMEOUT, env={"COLUMNS": "200"})
    print(f"lab session: {time.monotonic() - started:.0f} s\n{done.stdout}\n{done.stderr}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return work, done


def _db(work: Path) -> sqlite3.Connection:
    db = sqlite3.connect(work / "results" / "vmtax.sqlite")
    db.row_factory = sqlite3.Row
    return db


def _run(work: Path, name: str = "microvms") -> tuple[dict, dict]:
    db = _db(work)
    host, run_id = db.execute("SELECT host, id FROM runs WHERE name = ?", (name,)).fetchone()
    targets = {row["name"]: json.loads(row["fingerprint"]) for row in db.execute(
        "SELECT name, fingerprint FROM targets WHERE run_id = ?", (run_id,))}
    return json.loads(host), targets


def _cells(work: Path) -> dict[tuple[str, str], list[sqlite3.Row]]:
    cells: dict[tuple[str, str], list[sqlite3.Row]] = {}
    for rep in _db(work).execute("SELECT * FROM reps WHERE phase = 'measure'"):
        cells.setdefault((rep["target"], rep["workload"]), []).append(rep)
    return cells


def test_each_vmm_runs_every_workload_beside_native_and_qemu(session):
    work, done = session
    host, targets = _run(work)
    assert host["lab"] == LAB_LABEL
    cells = _cells(work)
    for target in ("qemu", *MICROVMS):
        for workload in ("cpu", "fileio", "iperf3"):
            reps = cells[(target, workload)]
            assert reps and all(r["status"] == "ok" for r in reps), (target, workload,
                                                                    [dict(r) for r in reps])
    # One table, every VM column said to be nested.
    words = " ".join(done.stdout.split())
    assert LAB_LABEL in words
    for target in MICROVMS:
        assert targets[target]["lab"] == LAB_LABEL


def test_the_fingerprint_names_the_vmm_its_build_and_the_config_sent(session):
    _, targets = _run(session[0])
    fc, ch = targets["firecracker"], targets["cloud-hypervisor"]
    assert fc["vmm_version"] == "Firecracker v1.16.1" and len(fc["vmm_sha256"]) == 64
    assert ch["vmm_version"].startswith("cloud-hypervisor v53.0")
    assert fc["config"]["machine-config"]["vcpu_count"] == 2
    assert "vmtax.vsock=1024" in fc["append"] and "vmtax.bus=pci" in ch["append"]
    assert any(arg.startswith("boot=2") for arg in ch["config"])
    assert fc["network"] == ch["network"] == "bridge"   # iperf3's server in the guest


def test_exits_are_recorded_on_each_vmms_process(session):
    results = str(session[0] / "results")
    for target in ("qemu", *MICROVMS):
        shown = vmtax("exits", f"microvms:{target}", "--workload", "cpu", "--results",
                      results, "--json")
        assert shown.returncode == 0, shown.stderr
        reasons = json.loads(shown.stdout)
        print(target, shown.stdout[:1500])
        assert reasons, target


def test_cold_boots_of_each_vmm(session):
    done = vmtax("runs", "--results", str(session[0] / "results"), "--json")
    runs = json.loads(done.stdout)
    boot = next(r for r in runs if r.get("command") == "boot" or "boot" in str(r.get("name")))
    print(boot)
    db = _db(session[0])
    ready = {row["target"]: row["value"] for row in db.execute(
        "SELECT r.target, m.value FROM metrics m JOIN reps r ON m.rep_id = r.id "
        "WHERE r.run_id = ? AND m.name LIKE 'ready%'", (boot["id"],))}
    assert set(ready) >= set(MICROVMS), ready


def test_density_of_microvms(session):
    shown = vmtax("density", "show", "last", "--results", str(session[0] / "results"),
                  "--json")
    assert shown.returncode == 0, shown.stderr
    print(shown.stdout[:3000])
    data = json.loads(shown.stdout)
    text = json.dumps(data)
    for target in MICROVMS:
        assert target in text


PROBE = Path(__file__).parent / "lab_programs" / "kill9_microvm.py"


def test_kill_9_leaves_no_vmm_socket_tap_or_file_within_5_s(tmp_path):
    """Inside one lab, for each VMM: vmtax killed while its guest serves iperf3; its
    guardian undoes what the journal holds (tests/lab_programs/kill9_microvm.py)."""
    import sys

    from vmtax.host import guardian, journal
    from vmtax.studies import lab as lab_study

    said = []
    own = journal.Journal()
    with guardian.guard(own.path):
        outcome = lab_study.run([[kind] for kind in MICROVMS], lab_study.LabConfig(),
                                results=tmp_path / "results", journal=own,
                                echo=(said.append, said.append), say=print,
                                program=(sys.executable, str(PROBE)))
    text = b"".join(said).decode(errors="replace")
    print(text)
    assert outcome.exit_code == 0, text
    for kind in MICROVMS:
        assert f"{kind}: nothing left after" in text
