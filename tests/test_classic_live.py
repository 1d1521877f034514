"""The whole classic plan (E1) end to end, as `make run` runs it, only shorter."""

import json
import re
import sqlite3
from pathlib import Path

import pytest
from conftest import vmtax

pytestmark = pytest.mark.live


def test_tiny_classic_plan_into_sqlite(tmp_path):
    results = tmp_path / "results"
    # The classic plan's [quick] form: one 1 s run each, a 16 MiB fileio set.
    plan = Path(__file__).parents[1] / "plans" / "classic.toml"
    res = vmtax("run", str(plan), "--quick", "--results", str(results), "--json", timeout=900)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    run_id = data["run"]["id"]
    assert data["run"]["status"] == "done"
    assert data["run"]["targets"]["vm"]["fingerprint"]["accel"] == "tcg"   # KVM is kvm_pvm here

    db = sqlite3.connect(results / "vmtax.sqlite")
    done = set(db.execute("SELECT target, workload FROM reps WHERE run_id=? AND phase='measure'"
                          " AND status='ok'", (run_id,)))
    assert done == {(t, w) for t in ("native", "container", "vm")
                    for w in ("cpu", "threads", "memory", "fileio", "mutex")}
    prepares = db.execute("SELECT count(*) FROM reps WHERE run_id=? AND phase='prepare'"
                          " AND status='ok'", (run_id,)).fetchone()[0]
    assert prepares == 3   # fileio prepare on each target, its write speed kept
    guest_timed = db.execute("SELECT count(*) FROM reps WHERE run_id=? AND target='vm'"
                             " AND guest_elapsed > 0", (run_id,)).fetchone()[0]
    assert guest_timed >= 5
    host = json.loads(db.execute("SELECT host FROM runs WHERE id=?", (run_id,)).fetchone()[0])
    assert host["cpu_model"] and host["kernel"]

    # Every (workload, metric) row has a ratio for the non-baseline targets that ran it.
    rows = {(r["workload"], r["metric"]): r for r in data["summary"]["rows"]}
    eps = rows[("cpu", "events/s")]["cells"]
    assert eps["vm"]["ratio"]["value"] < 1 < eps["native"]["summary"]["median"]
    assert list(results.glob(".work-*")) == []

    table = vmtax("show", run_id, "--results", str(results)).stdout
    # The accelerator that ran, under the target's name.
    assert re.search(r"vm\s*\n.*\(tcg\)", table)
    assert "native: median of its runs; others: ratio to it" in table
