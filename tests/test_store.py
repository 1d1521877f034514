import pytest

from vmtax.errors import VmtaxError
from vmtax.store import Store
from vmtax.workloads.base import Metric


def test_reps_and_metrics_round_trip(tmp_path):
    store = Store(tmp_path)
    run_id = store.new_run({"targets": []}, {"cpu": "x"}, "0.1")
    store.set_target(run_id, "native", "native", {"kernel": "6"})
    rep = store.add_rep(run_id, target="native", workload="cpu", params={"time": 1},
                        phase="measure", idx=0, status="ok", argv=["sysbench"], started=1.0,
                        exit_code=0, host_elapsed=1.1, stdout="out",
                        metrics=[Metric("events/s", 10.5, "events/s", True)])
    store.add_rep(run_id, target="native", workload="cpu", params={"time": 1}, phase="measure",
                  idx=1, status="failed", argv=["sysbench"], started=2.0, error="boom")
    store.finish_run(run_id, "done")

    again = Store(tmp_path)   # committed: visible to a new connection
    run = again.load_run(run_id[:15])
    assert run.status == "done" and run.targets["native"]["fingerprint"] == {"kernel": "6"}
    assert [r.id for r in run.reps][0] == rep
    assert run.reps[0].metrics == [Metric("events/s", 10.5, "events/s", True)]
    assert run.reps[0].stdout is None and again.load_run(run_id, with_output=True).reps[0].stdout == "out"
    assert run.reps[1].error == "boom"
    listed = again.list_runs()
    assert listed[0]["id"] == run_id and listed[0]["reps"] == 2 and listed[0]["failed"] == 1
    assert again.resolve("last") == run_id


def test_unknown_and_ambiguous_ids(tmp_path):
    store = Store(tmp_path)
    with pytest.raises(VmtaxError, match="no runs stored"):
        store.resolve("last")
    store.new_run({}, {}, "0")
    store.new_run({}, {}, "0")
    with pytest.raises(VmtaxError, match="unknown run id 'nope'"):
        store.load_run("nope")
    with pytest.raises(VmtaxError, match="ambiguous"):
        store.resolve("2")


def test_unwritable_results_dir_under_a_file(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(VmtaxError, match="results directory .* is not writable.*--results"):
        Store(tmp_path / "file" / "results")


def test_a_run_whose_vmtax_died_is_marked_interrupted(tmp_path):
    store = Store(tmp_path)
    run_id = store.new_run({}, {}, "0")
    store.db.execute("UPDATE runs SET pid = 999999999 WHERE id = ?", (run_id,))
    store.db.commit()
    assert Store(tmp_path).load_run(run_id).status == "interrupted"
    live = store.new_run({}, {}, "0")   # this process is alive: left alone
    assert Store(tmp_path).load_run(live).status == "running"
