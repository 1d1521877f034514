"""vmtax lab, live: a real KVM nested in a TCG guest with emulated AMD-V runs vmtax's KVM
paths (vm:kvm with cpu = host, VM exits per reason and their diff, host huge pages behind
guest RAM, pinned vCPUs, another QEMU binary, vhost-net carrying iperf3's traffic, libvirt
with domain type kvm, `boot --target vm:kvm`), and a kill -9 of vmtax leaves nothing.

The lab is slow (TCG under TCG): one lab for the whole plan, whose targets each carry as
many KVM paths as they can at once, with the shortest repetitions; one for `boot`; one
killed while it boots."""

import json
import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from conftest import processes, start_vmtax, vmtax, wait_for
from vmtax.host import kvm
from vmtax.host.machine import LAB_LABEL

pytestmark = [pytest.mark.live,
              pytest.mark.skipif(os.geteuid() != 0, reason="the lab's KVM paths need root"),
              pytest.mark.skipif(kvm.probe().usable,
                                 reason="this host's KVM runs guests itself: no lab needed")]

# kvm: the baseline guest; kvm-tuned: its RAM on the lab's 2 MiB pages, its two vCPUs pinned
# to the lab's two CPUs, another QEMU binary (E1's A/B of QEMU builds: Debian's KVM-only
# microvm build, which no guest on a host without a working KVM could ever use) and
# vhost-net behind its NIC; libvirt-kvm: a domain of type kvm from a libvirtd in the lab.
# Minimal kernel: an L2 boots in seconds, not a minute. iperf3 (client on the lab's side)
# puts traffic through each guest's NIC: vhost-net's data path really runs.
PLAN = """
runs = 1
warmup = 0
time = 1
collect = ["exits"]
baseline = "native"

[targets.native]
kind = "native"

[targets.kvm]
kind = "vm"
accel = "kvm"
kernel = "minimal"
memory = "256M"

[targets.kvm-tuned]
kind = "vm"
accel = "kvm"
kernel = "minimal"
memory = "256M"
hugepages = "2M"
pin = [0, 1]
qemu = "qemu-system-x86_64-microvm"
vhost = true

[targets.libvirt-kvm]
kind = "libvirt"
accel = "kvm"
kernel = "minimal"
memory = "256M"
vcpus = 1

[[workloads]]
name = "cpu"

[[workloads]]
name = "iperf3"
"""
# A lab run takes 4-6 min here (15 min at host load ~30).
LAB_TIMEOUT = 900
# What the lab's nested KVM, not vmtax, does now and then (clean-clone CI runs of
# 2026-11-28, four of nine): the lab's own kernel panics inside KVM_RUN ("corrupted stack
# end detected inside scheduler"), an L2 guest is lost twice while it boots or twice gets
# no answer while it is set up, or the lab hangs (one vCPU spinning, its console silent
# from 45 s of uptime on, for 16 min); or, the run gone through, kvm-tuned's 1 s of iperf3
# timed out at 70 s (a run of the same code just after: 1.6 s). Such a lab run is made
# once more, in a new directory; any other failure fails at once.
NESTED_FAULTS = ("Kernel panic - not syncing", "booting it once more (in a lab)")


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory):
    for attempt in (1, 2):
        work = tmp_path_factory.mktemp("lab")
        (work / "plan.toml").write_text(PLAN)
        started = time.monotonic()
        try:
            done = vmtax("lab", "--results", str(work / "results"), "run", "plan.toml",
                         cwd=work, timeout=LAB_TIMEOUT, env={"COLUMNS": "200"})
        except subprocess.TimeoutExpired:   # killed: its guardian undoes the lab
            print(f"lab run {attempt}: hung, stopped after {LAB_TIMEOUT} s")
            if attempt == 2:
                raise
            wait_for(lambda: not processes("qemu-system-x86_64"), 30)
            continue
        print(f"lab run {attempt}: {time.monotonic() - started:.0f} s\n{done.stdout}\n"
              f"{done.stderr}")
        stuck = _timed_out(work) if done.returncode == 0 else []
        if stuck:   # a nested fault too: the same repetitions take ~2 s in other lab runs
            print(f"lab run {attempt}: {', '.join(stuck)} timed out")
        elif done.returncode == 0 or not any(fault in done.stdout + done.stderr
                                             for fault in NESTED_FAULTS):
            break
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return work, done


def _timed_out(work: Path) -> list[str]:
    """The cells of the lab's run with a measured repetition that timed out."""
    return [f"{target} · {workload}" for (target, workload), reps in _cells(work).items()
            if any(rep["status"] == "timeout" for rep in reps)]


def _stored(work: Path) -> tuple[dict, dict]:
    db = sqlite3.connect(work / "results" / "vmtax.sqlite")
    host, run_id = db.execute("SELECT host, id FROM runs").fetchone()
    targets = {name: json.loads(fp) for name, fp in db.execute(
        "SELECT name, fingerprint FROM targets WHERE run_id = ?", (run_id,))}
    return json.loads(host), targets


def test_the_labs_run_is_in_the_hosts_store_labelled_nested(lab_run):
    work, done = lab_run
    host, targets = _stored(work)
    assert host["lab"] == LAB_LABEL
    assert "vm:kvm" not in targets and targets["kvm"]["accel"] == "kvm"
    assert targets["kvm"]["cpu"] == "host"
    words = " ".join(done.stdout.split())    # the title wraps in 80 columns
    assert LAB_LABEL in words and "(nested KVM)" in words
    shown = vmtax("show", "last", "--results", str(work / "results"), env={"COLUMNS": "200"})
    assert LAB_LABEL in " ".join(shown.stdout.split()) and "(nested KVM)" in shown.stdout


def test_another_qemu_binary_under_kvm(lab_run):
    _, targets = _stored(lab_run[0])
    other = targets["kvm-tuned"]
    assert other["qemu"] == "/usr/bin/qemu-system-x86_64-microvm" and other["accel"] == "kvm"
    assert other["qemu"] != targets["kvm"]["qemu"]


def test_huge_pages_and_pinning_under_kvm(lab_run):
    _, targets = _stored(lab_run[0])
    tuned = targets["kvm-tuned"]
    assert tuned["host_hugepages"]["granted"] == 128   # 256 MiB of 2 MiB pages
    assert tuned["vcpu_affinity"] == [[0], [1]]
    assert targets["kvm"]["vcpu_affinity"] is None


def test_real_exits_per_reason_and_their_diff(lab_run):
    results = str(lab_run[0] / "results")
    shown = vmtax("exits", "last:kvm", "--results", results, "--json")
    assert shown.returncode == 0, shown.stderr
    reasons = json.loads(shown.stdout)
    print(shown.stdout[:2000])
    assert reasons
    diff = vmtax("exits", "diff", "last:kvm", "last:kvm-tuned", "--workload", "cpu",
                 "--results", results)
    assert diff.returncode == 0, diff.stderr
    print(diff.stdout)
    assert "pp" in diff.stdout


def _cells(work: Path) -> dict[tuple[str, str], list[dict]]:
    """Each (target, workload)'s measured repetitions: their status and metrics."""
    db = sqlite3.connect(work / "results" / "vmtax.sqlite")
    db.row_factory = sqlite3.Row
    cells: dict[tuple[str, str], list[dict]] = {}
    for rep in db.execute("SELECT * FROM reps WHERE phase = 'measure'"):
        metrics = {m["name"]: m["value"] for m in db.execute(
            "SELECT name, value FROM metrics WHERE rep_id = ?", (rep["id"],))}
        cells.setdefault((rep["target"], rep["workload"]), []).append(
            {"status": rep["status"], "metrics": metrics})
    return cells


def test_vhost_net_carries_a_kvm_guests_traffic(lab_run):
    work, _ = lab_run
    _, targets = _stored(work)
    assert targets["kvm-tuned"]["vhost"] is True and targets["kvm-tuned"]["network"] == "bridge"
    assert targets["kvm"]["vhost"] is False
    reps = _cells(work)[("kvm-tuned", "iperf3")]
    print(reps)
    assert reps and all(r["status"] == "ok" for r in reps)
    assert all(max(r["metrics"].values()) > 0 for r in reps)


def test_libvirt_runs_a_kvm_domain(lab_run):
    work, _ = lab_run
    _, targets = _stored(work)
    domain = targets["libvirt-kvm"]
    assert domain["domain_type"] == "kvm" and domain["cpu"] == "host-passthrough"
    assert "<domain type='kvm'" in domain["domain_xml"] or 'type="kvm"' in domain["domain_xml"]
    for workload in ("cpu", "iperf3"):
        reps = _cells(work)[("libvirt-kvm", workload)]
        assert reps and all(r["status"] == "ok" for r in reps), reps


def test_boot_a_kvm_guest_in_the_lab(tmp_path):
    done = vmtax("lab", "--results", str(tmp_path / "results"), "boot", "--target", "vm:kvm",
                 "--count", "1", "--warmup", "0", "--kernel", "minimal", "--json",
                 cwd=tmp_path, timeout=LAB_TIMEOUT)
    print(done.stdout[-3000:], done.stderr[-2000:])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    started = json.loads(done.stdout[done.stdout.index("{"):])["targets"]["vm:kvm@minimal"]
    assert started["ready"]["n"] == 1 and 0 < started["guest ready"]["p50"] < started[
        "ready"]["p50"] <= started["first http"]["p50"]
    db = sqlite3.connect(tmp_path / "results" / "vmtax.sqlite")
    assert [json.loads(host)["lab"] for host, in db.execute("SELECT host FROM runs")] == [
        LAB_LABEL]


def _lab_qemus(share_parent: Path) -> set[int]:
    """The QEMUs of labs whose share is in share_parent."""
    found = set()
    for pid in processes("qemu-system-x86_64"):
        try:
            if str(share_parent).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.add(pid)
        except OSError:
            pass
    return found


def test_kill_9_during_a_lab_run_leaves_no_qemu_and_no_lab_file(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    lab = start_vmtax("lab", "--results", str(tmp_path / "results"), "run", "--targets",
                      "native", "--workloads", "cpu", "--time", "60", "--runs", "1",
                      "--warmup", "0", env={**os.environ, "TMPDIR": str(tmp)})
    try:
        assert wait_for(lambda: _lab_qemus(tmp), within=120)
        assert any(tmp.iterdir())   # the lab's share
        time.sleep(5)               # the lab boots
        lab.kill()
        lab.wait()
        assert wait_for(lambda: not _lab_qemus(tmp), within=5)
        assert wait_for(lambda: not any(tmp.iterdir()), within=5)
    finally:
        if lab.poll() is None:
            lab.kill()
