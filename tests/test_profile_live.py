"""The profile collector for real: a short native cpu cell with `--collect profile` stores
folded stacks with symbols and perf's own cost; `vmtax profile` reads them; a vmtax killed
with SIGKILL mid-profile leaves no perf process and no perf.data."""

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest
from conftest import start_vmtax, vmtax

from vmtax.results.store import Store

pytestmark = pytest.mark.live

CELL = ("--targets", "native", "--workloads", "cpu", "--collect", "profile", "--warmup", "0",
        "--time", "1")


def perf_records_in(directory: Path) -> list[str]:
    """perf record processes writing under directory."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"perf", b"record"] and str(directory).encode() in b" ".join(argv):
            found.append(pid)
    return found


def test_a_native_cell_is_profiled_with_symbols_and_its_cost(tmp_path):
    results = str(tmp_path / "results")
    run = vmtax("run", *CELL, "--runs", "2", "--results", results, "--json", timeout=300)
    assert run.returncode == 0, run.stderr
    run_id = json.loads(run.stdout)["run"]["id"]
    stored = Store(results, readonly=True).load_run(run_id)
    collected = [r for r in stored.reps if r.phase == "collect"]
    assert [(r.status, r.argv) for r in collected] == [("ok", ["profile"])], collected
    metrics = collected[0].metrics
    stacks = [m for m in metrics if m.name == "stack samples"]
    assert stacks and all(m.dimensions["stack"].startswith("sysbench;") for m in stacks
                          if m.dimensions["class"] != "[other]")
    functions = {m.dimensions["function"] for m in metrics if m.name == "function samples"}
    assert any(not f.startswith("[") for f in functions)    # something resolved
    by_name = {m.name: m.value for m in metrics if not m.dimensions}
    # a loaded host gives sysbench a fraction of its 2 s: some of it is sampled
    assert by_name["sampled cpu"] > 0.05 and by_name["profile cpu"] > 0
    shown = vmtax("profile", f"{run_id}:native", "--results", results, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["cells"][0]["target"] == "native"


def test_sigkill_mid_profile_leaves_no_perf_and_no_perf_data(tmp_path):
    results = tmp_path / "results"
    proc = start_vmtax("run", *CELL, "--runs", "30", "--results", str(results))
    deadline = time.monotonic() + 120
    # perf's process shows before its perf.data does: wait for both (CI caught the gap).
    while not (perf_records_in(results)
               and list(results.glob(".work-*/collect-profile-*/perf.data"))):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "perf record did not start writing perf.data"
        time.sleep(0.1)
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while perf_records_in(results) or list(results.glob(".work-*")):
        assert time.monotonic() < deadline, (perf_records_in(results),
                                             list(results.glob(".work-*/**")))
        time.sleep(0.1)
    db = sqlite3.connect(results / "vmtax.sqlite")
    assert db.execute("SELECT count(*) FROM reps WHERE phase='collect'").fetchone() == (0,)
