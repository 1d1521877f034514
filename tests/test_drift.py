"""A host's drift between runs (analysis/drift.py): `compare` gives no verdict on a change
that the earlier runs of the same name show the host making by itself, keeps one that they
do not, and says so when it has no such runs to weigh."""

import json
import math

import pytest
from conftest import vmtax
from test_history import add_run

from vmtax.analysis import drift
from vmtax.results.store import Store

# A host whose speed moves by ~6% from one run to the next (5 repetitions a run, 0.5% apart
# within one): the last two runs differ by 6.1%, which a test over repetitions calls a change.
DRIFTING = [1000, 1060, 990, 1050, 985, 1045]


def compared(results, *runs):
    done = vmtax("compare", *runs, "--results", str(results), "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    return {r["b"].partition(":")[2]: r["comparison"] for r in answer["rows"]
            if r["metric"] == "events/s"}, answer


def test_a_change_within_the_hosts_drift_between_runs_of_a_name_gets_no_verdict(tmp_path):
    store = Store(tmp_path)
    for i, level in enumerate(DRIFTING):
        add_run(store, "nightly", {"native": level}, seed=i, reps=5, noise=0.005)
    rows, answer = compared(tmp_path, "nightly~1", "nightly")
    native = rows["native"]
    assert native["change"] == pytest.approx(1045 / 985 - 1, rel=0.1)
    assert native["p_adjusted"] < 0.01   # the repetitions alone call it a change
    assert native["verdict"] == "~"
    assert native["note"].startswith("within the drift between consecutive runs of "
                                     "'nightly' on rack1 before B (")
    assert "caveat" not in answer
    # The same two runs, shown as a table: the note once under it, no caveat.
    shown = vmtax("compare", "nightly~1", "nightly", "--results", str(tmp_path),
                  env={"COLUMNS": "200"})
    assert "~ within the drift between consecutive runs of 'nightly'" in shown.stdout
    assert "A and B are two runs" not in shown.stdout


def test_a_change_beyond_the_drift_keeps_its_verdict(tmp_path):
    store = Store(tmp_path)
    for i, level in enumerate([1000, 1010, 995, 1005, 1000, 700]):
        add_run(store, "nightly", {"native": level}, seed=i, reps=5, noise=0.005)
    rows, _ = compared(tmp_path, "nightly~1", "nightly")
    assert rows["native"]["verdict"] == "worse" and rows["native"]["note"] == ""


@pytest.mark.parametrize("name, said", [
    ("", "4 earlier runs of one name (vmtax run --name) show it"),
    ("nightly", "only 1 earlier run of 'nightly' on this host (4 show it)")])
def test_two_runs_without_enough_earlier_ones_say_their_p_values_miss_the_drift(
        tmp_path, name, said):
    store = Store(tmp_path)
    a = add_run(store, name, {"native": 1000}, seed=1, reps=5, noise=0.005)
    b = add_run(store, name, {"native": 1100}, seed=2, reps=5, noise=0.005)
    rows, answer = compared(tmp_path, a, b)
    assert rows["native"]["verdict"] == "better"
    assert answer["caveat"] == ("A and B are two runs: how far this host's results move "
                                f"from one run to the next is not in these p-values; {said}")
    shown = vmtax("compare", a, b, "--results", str(tmp_path), env={"COLUMNS": "200"})
    assert f"not in these p-values; {said}" in shown.stdout


def test_targets_of_one_run_need_no_caveat(tmp_path):
    store = Store(tmp_path)
    run = add_run(store, "", {"native": 1000, "container": 1100}, reps=5, noise=0.005)
    done = vmtax("compare", f"{run}:native", f"{run}:container", "--results", str(tmp_path),
                 "--json")
    answer = json.loads(done.stdout)
    [events] = [r for r in answer["rows"] if r["metric"] == "events/s"]
    assert events["comparison"]["verdict"] == "better" and "caveat" not in answer


def test_the_spread_of_consecutive_runs():
    assert drift.consecutive_spread([100, 106, 99], alpha=0.05) is None   # two pairs
    assert drift.consecutive_spread([100, 0, 99, 101, 98], alpha=0.05) is None   # no ratio
    low, high = drift.consecutive_spread([100, 110, 100, 110], alpha=0.05)
    # Three log ratios of ±log(1.1): their root mean square is log(1.1); t(0.975, 3) = 3.182.
    half = 3.182446305284263 * math.log(1.1)
    assert (low, high) == (pytest.approx(math.exp(-half) - 1), pytest.approx(math.exp(half) - 1))
