"""Naming runs (issue #36, item 5): NAME~N and last~N for the runs before, in the resolver's
one place; one run given twice is refused by compare and report; a CI gate whose verdicts
are all "too few runs" says so, and --fail-on inconclusive fails on it."""

import time

import pytest
from conftest import vmtax

from vmtax.core.errors import VmtaxError
from vmtax.core.types import Metric
from vmtax.results.store import Store


def stored(store: Store, name: str, value: float, reps: int = 1) -> str:
    run = store.new_run({"name": name, "baseline": "native",
                         "targets": [{"name": "native", "kind": "native", "options": {}}],
                         "workloads": [{"name": "cpu"}]}, {}, "test")
    store.set_target(run, "native", "native", {"bare_host": True})
    for idx in range(reps):
        store.add_rep(run, target="native", workload="cpu", params={}, phase="measure",
                      idx=idx, status="ok", argv=["sysbench"], started=1.0, metrics=[
                          Metric("events/s", value + idx, "events/s", True)])
    store.finish_run(run, "done")
    time.sleep(0.01)   # created times that order the runs
    return run


@pytest.fixture
def runs(tmp_path):
    store = Store(tmp_path / "results")
    ids = [stored(store, "nightly", 100.0), stored(store, "other", 50.0),
           stored(store, "nightly", 101.0), stored(store, "nightly", 99.0)]
    return store, ids, str(tmp_path / "results")


def test_name_and_last_go_back_n_runs(runs):
    store, (n1, o1, n2, n3), _ = runs
    assert store.resolve("nightly") == n3
    assert [store.resolve(f"nightly~{k}") for k in range(3)] == [n3, n2, n1]
    assert store.resolve("last~1") == n2 and store.resolve("last~3") == n1
    with pytest.raises(VmtaxError, match=r"nightly~3: 'nightly' names 3 runs .*at most 2"):
        store.resolve("nightly~3")
    with pytest.raises(VmtaxError, match="~N follows a run's name or 'last'"):
        store.resolve(f"{n1}~1")


def test_compare_and_report_refuse_one_run_twice(runs):
    _, (n1, o1, n2, n3), results = runs
    for command in (["compare", "nightly", "last"], ["compare", "last", "last"],
                    ["report", "nightly", "last", "--html", "/dev/null"]):
        res = vmtax(*command, "--results", results)
        assert res.returncode == 2, res.stderr
        assert res.stderr.strip() == (
            f"vmtax: error: nightly and last are both run {n3}: give two runs (NAME~1 is "
            "the run of a name before its latest, last~1 the run before the latest)"
            if command[1] == "nightly" else
            f"vmtax: error: last and last are both run {n3}: give two runs (NAME~1 is the run "
            "of a name before its latest, last~1 the run before the latest)")
    assert vmtax("compare", "nightly~1", "nightly", "--results", results).returncode == 0


def test_a_gate_of_verdicts_without_runs_says_so_and_inconclusive_fails(runs):
    _, _, results = runs
    worse = vmtax("compare", "nightly~1", "nightly", "--fail-on", "worse", "--results", results)
    assert worse.returncode == 0
    assert ("1 of 1 metrics have too few runs for a verdict, which --fail-on worse lets "
            "pass; --fail-on inconclusive fails on them") in worse.stderr
    gate = vmtax("compare", "nightly~1", "nightly", "--fail-on", "inconclusive",
                 "--results", results)
    assert gate.returncode == 1
    assert "1 metric worse or without a verdict (--fail-on inconclusive): cpu events/s" \
        in gate.stderr
