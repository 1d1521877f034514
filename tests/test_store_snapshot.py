"""A run is read as one moment of the database had it, while a writer goes on (issue #35,
item 5: `show last` crashed with KeyError in load_run, which read a run's repetitions and
their metrics in two separate reads with a writer's commit between them)."""

import threading

from vmtax.core.types import Metric
from vmtax.results.store import Store


def _rep(store: Store, run_id: str, idx: int) -> None:
    store.add_rep(run_id, target="native", workload="cpu", params={}, phase="measure",
                  idx=idx, status="ok", argv=["sysbench"], started=float(idx),
                  metrics=[Metric("events/s", 1.0 + idx, "events/s", True)])


def test_a_repetition_committed_while_a_run_is_read_is_not_half_seen(tmp_path):
    first = Store(tmp_path)
    run_id = first.new_run({"targets": []}, {}, "0")
    _rep(first, run_id, 0)
    first.close()
    reader = Store(tmp_path, readonly=True)
    go, committed = threading.Event(), threading.Event()

    def write_another() -> None:     # another process's writer, in effect
        writer = Store(tmp_path)
        go.wait(30)
        _rep(writer, run_id, 1)     # waits (busy timeout) while a read transaction holds
        committed.set()
        writer.close()

    thread = threading.Thread(target=write_another)
    thread.start()

    def between_reads(statement: str) -> None:
        # The writer commits, if SQLite lets it, between the reads of reps and of metrics.
        if "FROM metrics" in statement and not go.is_set():
            go.set()
            committed.wait(1.0)

    reader.db.set_trace_callback(between_reads)
    run = reader.load_run("last")
    reader.db.set_trace_callback(None)
    go.set()
    thread.join(30)
    assert committed.is_set()
    assert [(r.idx, [m.value for m in r.metrics]) for r in run.reps] == [(0, [1.0])]
    again = reader.load_run("last")
    assert [(r.idx, [m.value for m in r.metrics]) for r in again.reps] == [(0, [1.0]),
                                                                           (1, [2.0])]
