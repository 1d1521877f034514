"""Damaged or unwritable databases: one line each, and no finished repetition lost."""

import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from vmtax.core.types import Metric
from vmtax.results.store import DB_NAME, PENDING_NAME, Store, StoreError


def add(store, run_id, idx, **kw):
    return store.add_rep(run_id, target="native", workload="cpu", params={"time": 1},
                         phase="measure", idx=idx, status="ok", argv=["sysbench"], started=1.0,
                         stdout="x" * 400, metrics=[Metric("events/s", 10.0 + idx, "events/s",
                                                           True)], **kw)


def filled(results, reps=100):
    store = Store(results)
    run_id = store.new_run({"targets": []}, {}, "0")
    store.set_target(run_id, "native", "native", {"bare_host": True})
    for i in range(reps):
        add(store, run_id, i)
    store.finish_run(run_id, "done")
    store.close()
    return run_id


def damage(path, how):
    data = bytearray(path.read_bytes())
    if how == "garbage header":
        data[:100] = b"\xff" * 100
    elif how == "truncated":
        data = data[:len(data) // 2]
    elif how == "garbage mid-file":
        data[8192:12288] = random.Random(16).randbytes(4096)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["garbage header", "truncated", "garbage mid-file"])
@pytest.mark.parametrize("readonly", [False, True])
def test_a_damaged_database_is_one_line_before_anything_runs(tmp_path, how, readonly):
    filled(tmp_path)
    damage(tmp_path / DB_NAME, how)
    with pytest.raises(StoreError) as caught:
        Store(tmp_path, readonly=readonly)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / DB_NAME} is damaged (")
    assert ".recover" in message


def test_a_file_deleted_mid_run_keeps_its_repetitions_aside(tmp_path):
    store = Store(tmp_path)
    run_id = store.new_run({"targets": []}, {"cpu": "x"}, "0")
    store.set_target(run_id, "native", "native", {"bare_host": True})
    assert add(store, run_id, 0) is not None
    (tmp_path / DB_NAME).unlink()
    assert add(store, run_id, 1) is None          # went to the side file
    store.finish_run(run_id, "done")
    with pytest.raises(StoreError, match=f"1 repetitions of run {run_id} are kept in "):
        store.load_run(run_id)
    store.close()
    lines = [json.loads(line) for line in (tmp_path / PENDING_NAME).read_text().splitlines()]
    # First where the records go should this directory's disk fill up, then the run's.
    assert [r["kind"] for r in lines] == ["elsewhere", "run", "target", "rep", "finish"]

    again = Store(tmp_path)                       # the next start imports it, once
    assert not (tmp_path / PENDING_NAME).exists()
    run = again.load_run(run_id)
    assert run.status == "done" and run.host == {"cpu": "x"}
    assert [(r.idx, r.metrics[0].value) for r in run.reps] == [(1, 11.0)]
    assert run.targets["native"]["kind"] == "native"


def test_an_import_interrupted_before_the_side_file_went_is_not_doubled(tmp_path):
    run_id = filled(tmp_path, reps=2)
    store = Store(tmp_path)
    record = {"kind": "rep", "run_id": run_id, "target": "native", "workload": "cpu",
              "params": json.dumps({"time": 1}), "phase": "measure", "idx": 1, "status": "ok",
              "error": None, "exit_code": 0, "host_elapsed": 1.0, "guest_elapsed": None,
              "started": 1.0, "argv": "[]", "stdout": "", "stderr": "", "metrics": []}
    new = dict(record, idx=2)
    (tmp_path / PENDING_NAME).write_text(json.dumps(record) + "\n" + json.dumps(new) + "\n{\"ki")
    store.close()
    run = Store(tmp_path).load_run(run_id)
    assert sorted(r.idx for r in run.reps) == [0, 1, 2]


def test_a_side_file_that_is_not_vmtax_is_one_line(tmp_path):
    filled(tmp_path, reps=1)
    (tmp_path / PENDING_NAME).write_text("nonsense\n{}\n")
    with pytest.raises(StoreError, match=f"{PENDING_NAME}:1: not a record of vmtax"):
        Store(tmp_path)


def test_a_database_that_breaks_mid_run_keeps_its_repetitions_aside(tmp_path):
    store = Store(tmp_path)
    run_id = store.new_run({"targets": []}, {}, "0")
    store.set_target(run_id, "native", "native", {"bare_host": True})
    add(store, run_id, 0)
    store.db.close()    # what SQLite does to a file it finds broken: every call fails
    assert add(store, run_id, 1) is None
    store.finish_run(run_id, "interrupted")
    assert "Cannot operate on a closed database" in (store.diverted or "")
    run = Store(tmp_path).load_run(run_id)
    assert [r.idx for r in run.reps] == [0, 1] and run.status == "interrupted"


@pytest.mark.skipif(shutil.which("chattr") is None or os.geteuid() != 0,
                    reason="needs chattr and root")
def test_an_immutable_database(tmp_path):
    done = filled(tmp_path, reps=1)
    db = tmp_path / DB_NAME
    store = Store(tmp_path)
    run_id = store.new_run({"targets": []}, {}, "0")
    made = subprocess.run(["chattr", "+i", str(db)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"chattr +i does not work here: {made.stderr.strip()}")
    try:
        with pytest.raises(StoreError, match=r"cannot be used \(.*immutable"):
            Store(tmp_path)
        assert Store(tmp_path, readonly=True).load_run(done).reps    # reading still works
        assert add(store, run_id, 5) is None
    finally:
        subprocess.run(["chattr", "-i", str(db)], check=True)
    store.close()
    assert [r.idx for r in Store(tmp_path).load_run(run_id).reps] == [5]


@pytest.mark.live
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_a_full_filesystem_mid_run_keeps_repetitions_in_the_runtime_dir(tmp_path):
    """Neither the database nor a file beside it can take a repetition (a filesystem that
    filled up; one gone read-only is alike, but cannot be remounted under open files):
    it goes to the runtime directory and comes back at the next start."""
    results = tmp_path / "small"
    results.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "vmtax-test", str(results)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        store = Store(results)
        run_id = store.new_run({"targets": []}, {}, "0")
        add(store, run_id, 0)
        filler = results / "filler"
        with open(filler, "wb") as f, pytest.raises(OSError):
            while True:
                f.write(b"x" * 65536)
                f.flush()
        assert add(store, run_id, 1) is None
        store.finish_run(run_id, "done")
        assert store.aside == store.fallback
        assert store.fallback.parent == Path(os.environ["VMTAX_RUNTIME"])
        with pytest.raises(StoreError) as caught:
            store.load_run(run_id)
        assert f"1 repetitions of run {run_id} are kept in {store.fallback}" in str(caught.value)
        store.close()
        filler.unlink()
        run = Store(results).load_run(run_id)
        assert [r.idx for r in run.reps] == [0, 1] and run.status == "done"
        assert not store.fallback.exists()
    finally:
        subprocess.run(["umount", "-l", str(results)], capture_output=True)


def test_the_check_reads_a_file_again_only_once_something_wrote_it(tmp_path, monkeypatch):
    """quick_check reads the whole file (~90 ms at 400 runs): it is skipped while nothing
    wrote the file since it last passed, and a damage that keeps the file's size is still
    found, since any write changes its stamp."""
    from vmtax.results import connection

    filled(tmp_path)
    checks = []
    monkeypatch.setattr(connection, "_remember",
                        lambda path, stamp, keep=connection._remember: (
                            checks.append(path), keep(path, stamp)))
    Store(tmp_path, readonly=True).close()
    Store(tmp_path, readonly=True).close()
    assert len(checks) <= 1   # the first open after filled's writes may check once more
    checks.clear()
    Store(tmp_path, readonly=True).close()
    assert checks == []
    damage(tmp_path / DB_NAME, "garbage mid-file")
    with pytest.raises(StoreError, match="is damaged"):
        Store(tmp_path, readonly=True)
