"""The lab every live test of the nested KVM shares: one `vmtax lab` runs every command of
SESSION in turn, on the targets of PLAN, and the tests read what each command printed and
stored (the lab is slow: TCG under TCG; a lab each would make `make test` twice as long).

To add a test to it: a target in PLAN (which SESSION's `run` measures) or a command in
SESSION, and a test (in any module) that takes the `lab_session` fixture and reads
`lab_session.command(NAME)` (its exit status, stdout and stderr, 0 asserted), or the runs
`lab_session.results` holds (`stored`, `cells`). tests/conftest.py loads this module as a
plugin, so the lab boots once for the whole test session, whoever asks first."""

import json
import os
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from vmtax.host import guardian
from vmtax.host.journal import Journal
from vmtax.studies import lab as lab_study
from vmtax.studies.lab import CommandOutcome

# kvm: the baseline guest; kvm-tuned: its RAM on the lab's 2 MiB pages, its two vCPUs pinned
# to the lab's two CPUs, another QEMU binary (E1's A/B of QEMU builds: Debian's KVM-only
# microvm build, which no guest on a host without a working KVM could ever use) and
# vhost-net behind its NIC; libvirt-kvm: a domain of type kvm from a libvirtd in the lab.
# Minimal kernel: an L2 boots in seconds, not a minute. iperf3 (client on the lab's side)
# puts traffic through each guest's NIC: vhost-net's data path really runs. exits records
# every guest whose first process is a VMM holding a KVM VM: the vm targets' QEMU and
# libvirt's.
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
# Each command of the shared lab, by name: a vmtax command, without "vmtax".
SESSION = {
    "run": ["run", "plan.toml"],
    "boot": ["boot", "--target", "vm:kvm", "--count", "1", "--warmup", "0", "--kernel",
             "minimal", "--json"],
    # Last, as it ends the session: a command that fails ends it with its own error.
    "fails": ["exits", "nosuchrun"],
}
# The whole session takes 6-9 min here (plan, boot); a lab that stops is given up on by
# vmtax itself (its hang timeout).
LAB_TIMEOUT = 1800


@dataclass
class LabSession:
    work: Path
    outcome: lab_study.LabOutcome
    tmp: Path                     # the lab's temporary directory (its share's parent)

    @property
    def results(self) -> Path:
        return self.work / "results"

    def command(self, name: str, exit_code: int = 0) -> CommandOutcome:
        """What SESSION's command name printed, and its exit status (exit_code asserted)."""
        done = self.outcome.commands[list(SESSION).index(name)]
        assert done.exit_code == exit_code, (done.stdout[-3000:], done.stderr[-3000:])
        return done


@pytest.fixture(scope="session")
def lab_session(tmp_path_factory):
    """One lab for every command of SESSION, in turn, as `vmtax lab --session` runs them."""
    work = tmp_path_factory.mktemp("lab")
    (work / "plan.toml").write_text(PLAN)
    # The lab's share in a directory of its own: what it leaves is told apart from the
    # shares of other labs that run beside it (another test session's, a user's).
    tmp = work / "tmp"
    tmp.mkdir()
    journal = Journal()
    said: list[str] = []
    started = time.monotonic()
    cwd = os.getcwd()
    os.chdir(work)
    try:
        with guardian.guard(journal.path), pytest.MonkeyPatch.context() as patch:
            patch.setattr(tempfile, "tempdir", str(tmp))
            outcome = lab_study.run(list(SESSION.values()), lab_study.LabConfig(),
                                    results=work / "results", journal=journal,
                                    echo=(lambda data: None, lambda data: None),
                                    say=said.append, env={"COLUMNS": "200"})
    finally:
        os.chdir(cwd)
    print(f"lab session: {time.monotonic() - started:.0f} s, {outcome.seconds}; "
          f"{said}; faults {outcome.faults}")
    for name, done in zip(SESSION, outcome.commands):
        print(f"--- {name}: exit {done.exit_code}\n{done.stdout.decode()[-3000:]}\n"
              f"{done.stderr.decode()[-3000:]}")
    return LabSession(work, outcome, tmp)


def run_of(results: Path, name: str = "run") -> str:
    """The id of the run SESSION's command name stored (each command stores one, in turn)."""
    db = sqlite3.connect(results / "vmtax.sqlite")
    ids = [run_id for run_id, in db.execute("SELECT id FROM runs ORDER BY created")]
    return ids[list(SESSION).index(name)]


def stored(results: Path) -> tuple[dict, dict]:
    """The host facts and the targets' fingerprints of SESSION's `run`."""
    db = sqlite3.connect(results / "vmtax.sqlite")
    run_id = run_of(results)
    [host] = db.execute("SELECT host FROM runs WHERE id = ?", (run_id,)).fetchone()
    targets = {name: json.loads(fp) for name, fp in db.execute(
        "SELECT name, fingerprint FROM targets WHERE run_id = ?", (run_id,))}
    return json.loads(host), targets


def cells(results: Path) -> dict[tuple[str, str], list[dict]]:
    """Each (target, workload)'s measured repetitions: their status and metrics."""
    db = sqlite3.connect(results / "vmtax.sqlite")
    db.row_factory = sqlite3.Row
    cells: dict[tuple[str, str], list[dict]] = {}
    for rep in db.execute("SELECT * FROM reps WHERE phase = 'measure'"):
        metrics = {m["name"]: m["value"] for m in db.execute(
            "SELECT name, value FROM metrics WHERE rep_id = ?", (rep["id"],))}
        cells.setdefault((rep["target"], rep["workload"]), []).append(
            {"status": rep["status"], "metrics": metrics})
    return cells
