"""E2 on this host, for real: a TCG guest runs cyclictest with `--collect exits`; the cell
keeps its cyclictest results and stores, in one line, why no exits were recorded."""

import json

import pytest
from conftest import vmtax

from vmtax.results.store import Store

pytestmark = pytest.mark.live


def test_tcg_guest_with_collect_exits_runs_and_says_why_not(tmp_path):
    results = str(tmp_path / "results")
    run = vmtax("run", "--targets", "vm:tcg", "--workloads", "cyclictest", "--collect", "exits",
                "--runs", "1", "--warmup", "0", "--time", "1", "--results", results, "--json",
                timeout=600)
    assert run.returncode == 0, run.stderr
    run_id = json.loads(run.stdout)["run"]["id"]
    stored = Store(results, readonly=True).load_run(run_id)
    measured = [r for r in stored.reps if r.phase == "measure"]
    assert [r.status for r in measured] == ["ok"]
    assert any(m.name == "latency max" for m in measured[0].metrics)
    collected = [r for r in stored.reps if r.phase == "collect"]
    assert [(r.target, r.status, r.argv, r.metrics) for r in collected] == [
        ("vm:tcg", "unavailable", ["exits"], [])]
    why = collected[0].error
    assert why.startswith("exits: unavailable — vm:tcg runs under TCG, which has no VM exits")
    assert "\n" not in why
    shown = vmtax("exits", run_id, "--results", results)
    assert shown.returncode == 2
    assert shown.stderr.strip() == (f"vmtax: error: {run_id}: no VM exits stored "
                                    f"(vm:tcg · cyclictest: {why})")

