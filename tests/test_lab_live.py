"""vmtax lab, live: a real KVM nested in a TCG guest with emulated AMD-V runs vmtax's KVM
paths (vm:kvm with cpu = host, VM exits per reason and their diff, a libvirt domain's
exits, host huge pages behind guest RAM, pinned vCPUs, another QEMU binary, vhost-net
carrying iperf3's traffic, libvirt with domain type kvm, `boot --target vm:kvm`); a lab
that stops is noticed and its run resumed in a new one, and a kill -9 of vmtax loses no
finished repetition and leaves nothing.

The lab is slow (TCG under TCG): the tests of the shared lab read what `lab_session`
(tests/lab_session.py, where adding a target or a command to it is said) printed and
stored; the stopped and killed lab is a lab of its own."""

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from conftest import processes, start_vmtax, vmtax, wait_for
from lab_session import LAB_TIMEOUT, cells, run_of, stored
from vmtax.host import kvm
from vmtax.host.machine import LAB_LABEL

pytestmark = [pytest.mark.live,
              pytest.mark.skipif(os.geteuid() != 0, reason="the lab's KVM paths need root"),
              pytest.mark.skipif(kvm.probe().usable,
                                 reason="this host's KVM runs guests itself: no lab needed")]


def test_the_labs_run_is_in_the_hosts_store_labelled_nested(lab_session):
    done = lab_session.command("run")
    host, targets = stored(lab_session.results)
    assert host["lab"] == LAB_LABEL
    assert "vm:kvm" not in targets and targets["kvm"]["accel"] == "kvm"
    assert targets["kvm"]["cpu"] == "host" and targets["kvm"]["lab"] == LAB_LABEL
    assert targets["native"]["bare_host"] is False and targets["native"]["lab_host"] is True
    words = " ".join(done.stdout.decode().split())    # the title wraps in 80 columns
    assert LAB_LABEL in words and "(nested KVM)" in words
    shown = vmtax("show", "last", "--results", str(lab_session.results),
                  env={"COLUMNS": "200"})
    assert LAB_LABEL in " ".join(shown.stdout.split()) and "(nested KVM)" in shown.stdout


def test_another_qemu_binary_under_kvm(lab_session):
    _, targets = stored(lab_session.results)
    other = targets["kvm-tuned"]
    assert other["qemu"] == "/usr/bin/qemu-system-x86_64-microvm" and other["accel"] == "kvm"
    assert other["qemu"] != targets["kvm"]["qemu"]


def test_huge_pages_and_pinning_under_kvm(lab_session):
    _, targets = stored(lab_session.results)
    tuned = targets["kvm-tuned"]
    assert tuned["host_hugepages"]["granted"] == 128   # 256 MiB of 2 MiB pages
    assert tuned["vcpu_affinity"] == [[0], [1]]
    assert targets["kvm"]["vcpu_affinity"] is None


def test_real_exits_per_reason_their_diff_and_times_the_workload_allows(lab_session):
    results, run = str(lab_session.results), run_of(lab_session.results)
    shown = vmtax("exits", f"{run}:kvm", "--results", results, "--json")
    assert shown.returncode == 0, shown.stderr
    cells = json.loads(shown.stdout)["cells"]
    print(shown.stdout[:3000])
    assert cells and all(cell["reasons"] for cell in cells)
    for cell in cells:   # no exit time beyond what the workload's time allows, or why not
        longest = max((r["max"] or 0) for r in cell["reasons"])
        assert cell["times_impossible"] or (
            longest <= cell["seconds"] * 1e6
            and cell["total_time"] <= cell["seconds"] * 1e6 * cell["vcpus"]), cell
    diff = vmtax("exits", "diff", f"{run}:kvm", f"{run}:kvm-tuned", "--workload", "cpu",
                 "--results", results)
    assert diff.returncode == 0, diff.stderr
    print(diff.stdout)
    assert "pp" in diff.stdout


def test_a_libvirt_domains_exits_are_recorded_as_a_vm_targets(lab_session):
    shown = vmtax("exits", f"{run_of(lab_session.results)}:libvirt-kvm", "--results",
                  str(lab_session.results), "--json")
    assert shown.returncode == 0, shown.stderr
    cells = json.loads(shown.stdout)["cells"]
    assert {c["workload"] for c in cells} == {"cpu", "iperf3"}
    assert all(c["total_samples"] > 0 and c["reasons"] for c in cells), cells


def test_vhost_net_carries_a_kvm_guests_traffic(lab_session):
    _, targets = stored(lab_session.results)
    assert targets["kvm-tuned"]["vhost"] is True and targets["kvm-tuned"]["network"] == "bridge"
    assert targets["kvm"]["vhost"] is False
    reps = cells(lab_session.results)[("kvm-tuned", "iperf3")]
    print(reps)
    assert reps and all(r["status"] == "ok" for r in reps)
    assert all(max(r["metrics"].values()) > 0 for r in reps)


def test_libvirt_runs_a_kvm_domain(lab_session):
    _, targets = stored(lab_session.results)
    domain = targets["libvirt-kvm"]
    assert domain["domain_type"] == "kvm" and domain["cpu"] == "host-passthrough"
    assert "<domain type='kvm'" in domain["domain_xml"] or 'type="kvm"' in domain["domain_xml"]
    for workload in ("cpu", "iperf3"):
        reps = cells(lab_session.results)[("libvirt-kvm", workload)]
        assert reps and all(r["status"] == "ok" for r in reps), reps


def test_boot_a_kvm_guest_in_the_lab(lab_session):
    out = lab_session.command("boot").stdout.decode()
    started = json.loads(out[out.index("{"):])["targets"]["vm:kvm@minimal"]
    assert started["ready"]["n"] == 1 and 0 < started["guest ready"]["p50"] < started[
        "ready"]["p50"] <= started["first http"]["p50"]
    db = sqlite3.connect(lab_session.results / "vmtax.sqlite")
    assert {json.loads(host)["lab"] for host, in db.execute("SELECT host FROM runs")} == {
        LAB_LABEL}


def test_a_failing_command_ends_the_session_with_its_own_one_line_error(lab_session):
    done = lab_session.command("fails", exit_code=2)
    [said] = done.stderr.decode().splitlines()
    assert said.startswith("vmtax: error: unknown run id 'nosuchrun'")
    # Its hint works on the host, where the lab's runs came into the host's store.
    assert f"`vmtax runs --results {lab_session.results}`" in said
    assert lab_session.outcome.exit_code == 2
    # The lab is stopped (its QEMU first), and nothing of it is left.
    assert not any(lab_session.tmp.glob("vmtax-lab-*"))


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


def _line(process: subprocess.Popen, pattern: str, within: float, seen: list[str]) -> str:
    """The first line of the process's stderr that holds pattern (lines kept in seen)."""
    deadline = time.monotonic() + within
    assert process.stderr is not None
    os.set_blocking(process.stderr.fileno(), False)
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if line:
            seen.append(line)
            if pattern in line:
                return line
        elif process.poll() is not None:
            break
        else:
            time.sleep(0.2)
    raise AssertionError(f"no {pattern!r} within {within:g} s: {''.join(seen)[-3000:]}")


HANG_TIMEOUT = 20
# Three cells: the lab is stopped after the first, vmtax is killed after the second, and
# the third is left for --resume.
THREE_CELLS = """
runs = 1
warmup = 0
time = 1

[targets.native]
kind = "native"

[[workloads]]
name = "cpu"
params = { threads = [1, 2] }

[[workloads]]
name = "memory"
"""


def test_a_stopped_lab_is_noticed_and_a_killed_one_loses_nothing(tmp_path):
    """The lab's QEMU stopped with SIGSTOP (as a hung kernel stops it): within the hang
    timeout vmtax notices, keeps its console and resumes the run in a new lab. Then vmtax
    lab is killed (kill -9): the finished repetitions are in the host's store, nothing of
    the labs is left, and `vmtax lab run --resume` finishes the run."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    results = tmp_path / "results"
    (tmp_path / "plan.toml").write_text(THREE_CELLS)
    lab = start_vmtax("lab", "--hang-timeout", str(HANG_TIMEOUT), "run", "plan.toml",
                      "--results", str(results), cwd=tmp_path,
                      env={**os.environ, "TMPDIR": str(tmp), "COLUMNS": "200"})
    seen: list[str] = []
    try:
        _line(lab, "native · cpu threads=1 done", LAB_TIMEOUT, seen)
        [qemu] = _lab_qemus(tmp)
        os.kill(qemu, signal.SIGSTOP)
        stopped = time.monotonic()
        noticed = _line(lab, "hung: no heartbeat and no output", HANG_TIMEOUT + 60, seen)
        assert time.monotonic() - stopped < HANG_TIMEOUT + 15, noticed
        assert "booting a new lab for vmtax run --resume" in noticed
        kept = Path(noticed.split("all of it: ")[1].split(")")[0])
        assert kept.parent == results and "lab: " in kept.read_text()
        _line(lab, "native · cpu threads=2 done", LAB_TIMEOUT, seen)   # in the new lab
        lab.kill()
        lab.wait()
        assert wait_for(lambda: not _lab_qemus(tmp), within=10)
        assert wait_for(lambda: not any(tmp.iterdir()), within=30)   # share, upper disk
    finally:
        if lab.poll() is None:
            lab.kill()
    db = sqlite3.connect(results / "vmtax.sqlite")
    [(run_id, status)] = db.execute("SELECT id, status FROM runs").fetchall()
    stored = db.execute("SELECT params FROM reps WHERE phase = 'measure' AND "
                        "status = 'ok'").fetchall()
    assert status == "interrupted" and len(stored) >= 2, "".join(seen)
    resumed = vmtax("lab", "--results", str(results), "run", "--resume", run_id,
                    timeout=LAB_TIMEOUT, env={"TMPDIR": str(tmp), "COLUMNS": "200"})
    print(resumed.stdout[-3000:], resumed.stderr[-3000:])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert db.execute("SELECT status FROM runs").fetchone()[0] == "done"
    reps = db.execute("SELECT workload, status FROM reps WHERE phase = 'measure'").fetchall()
    assert sorted(reps) == [("cpu", "ok"), ("cpu", "ok"), ("memory", "ok")]
