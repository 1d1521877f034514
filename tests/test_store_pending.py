"""Results the database could not take (issue #29, defect 2): one side file per run at a
time, the true count of each in the message, and an import that neither loses nor
doubles a repetition wherever the results directory was copied."""

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from vmtax.core.types import Metric
from vmtax.results.store import ELSEWHERE, PENDING_NAME, Store, StoreError


def add(store, run_id, idx):
    return store.add_rep(run_id, target="native", workload="fileio", params={},
                         phase="measure", idx=idx, status="ok", argv=["sysbench"],
                         started=1.0, stdout="x" * 2000,
                         metrics=[Metric("MiB/s", 1.0 + idx, "MiB/s", True)])


class FullDisk:
    """Store._append on a results directory whose disk is full: writes beside the database
    fail once `full`; the runtime directory takes everything."""

    def __init__(self, monkeypatch, results: Path):
        self.full = False
        real = Store._append

        def append(path, text):
            if self.full and path.parent == results:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real(path, text)
        monkeypatch.setattr(Store, "_append", staticmethod(append))


def reps_in(path: Path) -> int:
    return sum(json.loads(line)["kind"] == "rep" for line in path.read_text().splitlines())


def diverted_run(tmp_path, monkeypatch, full_at_once):
    """A run of 6 repetitions: 0 stored; 1 beside the database once it broke (unless its
    disk was full at once); 2-3 in the runtime directory once that disk was full, 4-5
    when it had room again; then `done`."""
    results = tmp_path / "results"
    disk = FullDisk(monkeypatch, results)
    store = Store(results)
    run_id = store.new_run({"targets": []}, {}, "0")
    store.set_target(run_id, "native", "native", {"bare_host": True})
    add(store, run_id, 0)
    store.db.close()     # every later write of the database fails
    disk.full = full_at_once
    add(store, run_id, 1)
    disk.full = True
    add(store, run_id, 2)
    add(store, run_id, 3)
    disk.full = False    # room again: the run's records must not split
    add(store, run_id, 4)
    add(store, run_id, 5)
    store.finish_run(run_id, "done")
    return results, store, run_id


@pytest.mark.parametrize("full_at_once", [False, True], ids=["fills up", "full at once"])
def test_a_copy_made_mid_failure_loses_and_doubles_nothing(tmp_path, monkeypatch,
                                                           full_at_once):
    results, store, run_id = diverted_run(tmp_path, monkeypatch, full_at_once)
    pending = results / PENDING_NAME
    in_pending = [json.loads(line) for line in pending.read_text().splitlines()] \
        if pending.exists() else []
    assert sum(r["kind"] == "rep" for r in in_pending) == (0 if full_at_once else 1)
    assert [r for r in in_pending if r["kind"] == ELSEWHERE] == (
        [] if full_at_once else [{"kind": ELSEWHERE, "path": str(store.fallback)}])
    assert [json.loads(line)["kind"] for line in store.fallback.read_text().splitlines()] \
        == ["run", "target", *["rep"] * (5 if full_at_once else 4), "finish"]
    with pytest.raises(StoreError) as caught:
        store.set_flags(run_id, [])    # what the runner does next
    assert (f"5 repetitions of run {run_id} are kept in {store.fallback} (which nothing in "
            f"{results} names" if full_at_once else
            f"5 repetitions of run {run_id} are kept aside: 1 in {pending}, 4 in "
            f"{store.fallback} (named in {pending}") in str(caught.value)
    store.close()

    copy = tmp_path / "copy"
    shutil.copytree(results, copy)
    copied = Store(copy).load_run(run_id)
    if full_at_once:   # not done (running: its writer, this test, lives): the database's
        assert sorted(r.idx for r in copied.reps) == [0]
        assert copied.status != "done"
    else:              # the copy found the runtime file through the results directory's
        assert sorted(r.idx for r in copied.reps) == list(range(6))
        assert copied.status == "done" and not store.fallback.exists()
    original = Store(results).load_run(run_id)
    assert sorted(r.idx for r in original.reps) == (list(range(6)) if full_at_once
                                                    else [0, 1])
    assert (original.status == "done") == full_at_once
    # Imported once: opening either again changes nothing.
    for where in (copy, results):
        again = Store(where).load_run(run_id)
        assert len(again.reps) == len({r.idx for r in again.reps})


def test_a_write_cut_short_is_taken_back(tmp_path, monkeypatch):
    path = tmp_path / PENDING_NAME
    path.write_text('{"kind": "finish"}\n')
    real = os.write

    def half(fd, data):     # half of it fits, then the disk is full
        monkeypatch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(
            OSError(errno.ENOSPC, "No space left on device")))
        return real(fd, data[:len(data) // 2])
    monkeypatch.setattr(os, "write", half)
    with pytest.raises(OSError):
        Store._append(path, '{"kind": "rep", "x": "' + "y" * 100 + '"}\n')
    monkeypatch.setattr(os, "write", real)
    assert path.read_text() == '{"kind": "finish"}\n'


def test_a_side_file_naming_a_file_not_of_vmtax_is_refused(tmp_path):
    results = tmp_path / "results"
    Store(results).close()
    victim = tmp_path / "victim"
    victim.write_text("")
    (results / PENDING_NAME).write_text(json.dumps({"kind": ELSEWHERE,
                                                    "path": str(victim)}) + "\n")
    with pytest.raises(StoreError, match="which is not a side file of vmtax"):
        Store(results)
    assert victim.exists()
