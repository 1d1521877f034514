"""Ctrl-C, SIGTERM and SIGKILL in the middle of a plan: nothing survives vmtax, nothing
committed is lost, and what a killed vmtax left is undone by the next start."""

import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from conftest import start_vmtax, vmtax

pytestmark = pytest.mark.live


def processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline and "pytest" not in cmdline:
            found.append(f"{pid}: {cmdline[:120]}")
    return found


def start_plan(results: Path) -> subprocess.Popen:
    return start_vmtax("run", "--targets", "native,container:runc,vm", "--workloads",
                       "cpu,memory", "--runs", "20", "--warmup", "0", "--time", "1",
                       "--results", str(results))


def wait_for_committed_reps(results: Path, proc: subprocess.Popen, n: int = 4) -> None:
    """Until the guest is up and a few repetitions (some of the VM's) are committed."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            db = sqlite3.connect(results / "vmtax.sqlite")
            count, vm = db.execute("SELECT count(*), sum(target='vm') FROM reps").fetchone()
            db.close()
            if count >= n and vm:
                return
        except sqlite3.OperationalError:
            pass
        time.sleep(0.3)
    pytest.fail("the plan did not get going")


def committed(results: Path) -> tuple[str, int]:
    db = sqlite3.connect(results / "vmtax.sqlite")
    status, = db.execute("SELECT status FROM runs").fetchone()
    reps, = db.execute("SELECT count(*) FROM reps").fetchone()
    return status, reps


def assert_nothing_left(results: Path) -> None:
    deadline = time.monotonic() + 10
    while processes_mentioning(str(results)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(str(results)) == []     # qemu and containers run from there
    assert list(results.glob(".work-*")) == []
    assert list(Path(os.environ["VMTAX_RUNTIME"]).glob("journal-*")) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_mid_plan_cleans_up_and_keeps_results(tmp_path, sig):
    results = tmp_path / "results"
    proc = start_plan(results)
    wait_for_committed_reps(results, proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err     # 130 for SIGINT, 143 for SIGTERM
    assert "interrupted; what finished is stored in run" in err and "--resume" in err
    assert "Traceback" not in err
    status, reps = committed(results)
    assert status == "interrupted" and reps >= 4
    assert_nothing_left(results)


def guardians(proc: subprocess.Popen) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().decode()
        except OSError:
            continue
        if "vmtax.host.guardian" in cmdline and f"journal-{proc.pid}-" in cmdline:
            found.append(int(entry.name))
    return found


def test_sigkill_leaves_nothing_within_seconds(tmp_path):
    results = tmp_path / "results"
    proc = start_plan(results)
    wait_for_committed_reps(results, proc)
    proc.kill()
    proc.wait(timeout=30)
    # The guardian undoes the journal (QEMU got SIGKILL from the kernel already), with
    # no vmtax started again, and exits.
    deadline = time.monotonic() + 5
    while (processes_mentioning(str(results)) or list(results.glob(".work-*"))
           or list(Path(os.environ["VMTAX_RUNTIME"]).glob("journal-*")) or guardians(proc)):
        assert time.monotonic() < deadline, (processes_mentioning(str(results)), guardians(proc))
        time.sleep(0.1)
    assert committed(results)[1] >= 4


def test_sigkill_of_vmtax_and_its_guardian_leaves_nothing_after_the_next_start(tmp_path):
    results = tmp_path / "results"
    proc = start_plan(results)
    wait_for_committed_reps(results, proc)
    guardian, = guardians(proc)
    os.kill(guardian, signal.SIGKILL)
    proc.kill()
    proc.wait(timeout=30)
    # The kernel kills QEMU with vmtax (PR_SET_PDEATHSIG); the journal still lists the
    # work dir and whatever else was in flight, for the next start to undo.
    assert list(Path(os.environ["VMTAX_RUNTIME"]).glob("journal-*.json"))
    res = vmtax("run", "--targets", "native", "--workloads", "cpu", "--runs", "1",
                "--warmup", "0", "--time", "1", "--results", str(results))
    assert res.returncode == 0, res.stderr
    assert "undid" in res.stderr and f"left by vmtax process {proc.pid}" in res.stderr
    assert_nothing_left(results)
    status, reps = committed(results)
    assert status == "interrupted"   # the killed run no longer claims to be running
    assert reps >= 4                 # and what it committed is still there
