"""The fleet's pieces that need no Ray cluster (tests/test_fleet_live.py runs a real one)."""

import json
import queue
import socket
import types

import pytest

from conftest import vmtax
from vmtax import fleet
from vmtax.plan import from_names
from vmtax.runner import QuietReporter, schedule
from vmtax.store import Store
from vmtax.types import Metric

FP = {"cpu_model": "EPYC", "logical_cpus": 2, "kernel": "6.1", "hostname": "h1",
      "memory_bytes": 2**34}


def test_the_head_runs_nothing_and_a_host_advertises_its_resource_only():
    head = fleet.head_argv(6379, None)
    assert head[head.index("--num-cpus") + 1] == "0" and "--resources" not in head
    join = fleet.join_argv("10.0.0.1:6379", "h1", "/tmp/r")
    assert join[join.index("--num-cpus") + 1] == "0"
    assert json.loads(join[join.index("--resources") + 1]) == {"vmtax-host:h1": 1}
    assert join[join.index("--temp-dir") + 1] == "/tmp/r" and "--block" in join


@pytest.mark.parametrize("name", ["", "a b", "-x", "a/b", "x" * 64])
def test_bad_host_names_are_refused(name):
    with pytest.raises(fleet.FleetError, match="--name: expected"):
        fleet.check_name(name)


def test_identity_ignores_what_differs_between_identical_hosts():
    assert fleet.identity(FP) == fleet.identity({**FP, "hostname": "h2",
                                                  "memory_bytes": 2**34 - 4096})
    assert fleet.identity(FP) != fleet.identity({**FP, "kernel": "6.2"})


def _hosts(monkeypatch, *found):
    monkeypatch.setattr(fleet, "hosts", lambda ray: list(found))


def test_choosing_hosts(monkeypatch):
    a = fleet.Host("a", True, FP, None, None)
    b = fleet.Host("b", True, {**FP, "hostname": "h2"}, None, None)
    gone = fleet.Host("c", False, FP, None, None)
    _hosts(monkeypatch, a, b, gone)
    assert list(fleet._choose(None, None, "hosts")) == ["a", "b"]
    assert list(fleet._choose(None, ["all"], "cells")) == ["a", "b"]
    assert list(fleet._choose(None, ["b"], "hosts")) == ["b"]
    with pytest.raises(fleet.FleetError, match=r"no live host named c, x in the fleet; "
                                               r"it has: a, b"):
        fleet._choose(None, ["a", "c", "x"], "hosts")
    _hosts(monkeypatch, a, fleet.Host("k", True, {**FP, "kernel": "6.2"}, None, None))
    with pytest.raises(fleet.FleetError, match="identical hosts, but k and a differ in kernel"):
        fleet._choose(None, None, "cells")
    assert list(fleet._choose(None, None, "hosts")) == ["a", "k"]
    _hosts(monkeypatch, gone)
    with pytest.raises(fleet.FleetError, match="no host has joined the fleet"):
        fleet._choose(None, None, "hosts")


def test_addresses_are_checked_before_ray_is_asked():
    with pytest.raises(fleet.FleetError, match="expected HOST:PORT"):
        fleet._host_port("head")
    assert fleet._host_port("10.0.0.1:6379") == ("10.0.0.1", 6379)


def _rep(**over):
    rep = dict(target="native", workload="cpu", params={"time": 1}, phase="measure", idx=0,
               status="ok", argv=["sysbench"], started=1.0, host_elapsed=1.0,
               metrics=[Metric("events/s", 10.0, "1/s", True)])
    return {**rep, **over}


def test_the_local_store_streams_what_it_stores(tmp_path):
    events: queue.Queue = queue.Queue()
    store = fleet._StreamingStore(str(tmp_path), events)
    run_id = store.new_run({"p": 1}, FP, "0")
    store.set_target(run_id, "native", "native", {"bare_host": True})
    store.add_rep(run_id, **_rep())
    got = [events.get_nowait() for _ in range(3)]
    assert [k for k, _ in got] == ["run", "target", "rep"]
    assert got[0][1] == {"local_run": run_id, "fingerprint": FP}
    assert got[2][1]["metrics"] == [Metric("events/s", 10.0, "1/s", True)]
    # The identity the driver computes is the one the Runner skips by.
    (stored,) = store.load_run(run_id).reps
    assert fleet.rep_key(vars(stored)) == fleet.rep_key(got[2][1])


class _FakeRay:
    """Just enough of ray for the driver's bookkeeping, none of its scheduling."""
    exceptions = types.SimpleNamespace(RayTaskError=RuntimeError, RayError=Exception)

    @staticmethod
    def remote(**options):
        return lambda function: function


def test_the_head_stores_each_repetition_once_with_its_host(tmp_path):
    store = Store(tmp_path)
    log = fleet.FleetLog(tmp_path)
    driver = fleet._Driver(_FakeRay(), store, log, QuietReporter())
    head = fleet._HeadRun({"targets": []}, {"spread": "cells", "hosts": ["a", "b"]})
    job = fleet._Job({}, "cpu", head, None)
    driver._head_event(job, "a", "run", {"local_run": "L1", "fingerprint": FP})
    driver._head_event(job, "a", "target", {"name": "native", "kind": "native",
                                            "fingerprint": {"bare_host": True}})
    driver._head_event(job, "a", "rep", _rep())
    driver._head_event(job, "b", "rep", _rep())             # re-sent: not stored again
    driver._head_event(job, "b", "rep", _rep(idx=1, started=3.0))
    run = store.load_run(head.id)
    assert run.host == {**FP, "fleet": {"spread": "cells", "hosts": ["a", "b"]}}
    assert [(r.idx, r.metrics[0].value) for r in run.reps] == [(0, 10.0), (1, 10.0)]
    assert sorted(log.rep_hosts(head.id).values()) == ["a", "b"]
    driver.finish([head], "done")
    assert store.load_run(head.id).status == "done"
    head.failures.append("b · cpu: host b left the fleet mid-plan")
    driver.finish([head], "done")
    assert store.load_run(head.id).status == "failed"


def test_a_plan_is_complete_when_every_scheduled_repetition_is_stored():
    plan = from_names(["native"], ["cpu"], runs=2, warmup=1, time=1)
    workload = plan.workloads[0].make(plan.time)
    keys = {fleet.rep_key(_rep(workload="cpu", params=workload.params, phase=u.phase,
                               idx=u.idx)) for u in schedule(plan)}
    assert fleet._complete(plan, keys)
    assert not fleet._complete(plan, set(list(keys)[1:]))


def test_cells_are_the_plans_workload_configurations():
    plan = from_names(["native"], ["cpu", "memory"], runs=1, time=1)
    cells = fleet._cells(plan)
    assert [label for label, _ in cells] == ["cpu", "memory"]
    assert [p["workloads"] for _, p in cells] == [[{"name": "cpu", "params": {}}],
                                                  [{"name": "memory", "params": {}}]]
    assert all(p["targets"] == plan.to_dict()["targets"] for _, p in cells)


def test_cli_errors_are_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    cases = [
        (["run", "--targets", "native", "--workloads", "cpu", "--spread", "cells",
          "--results", str(tmp_path)],
         "vmtax: error: --hosts and --spread run on a fleet: give --fleet HEAD_ADDRESS"),
        (["fleet", "status", "--fleet", "head"],
         "vmtax: error: fleet address: expected HOST:PORT (the head's, e.g. 192.0.2.10:6379),"
         " got 'head'"),
        (["fleet", "join", "127.0.0.1:1", "--name", "a b"],
         "vmtax: error: --name: expected letters, digits, '.', '_' or '-' (at most 63, "
         "starting with a letter or digit), got 'a b'"),
    ]
    for args, line in cases:
        done = vmtax(*args, timeout=60)
        assert (done.returncode, done.stderr.strip()) == (2, line)
    done = vmtax("fleet", "status", "--fleet", f"127.0.0.1:{closed}", timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith(f"vmtax: error: no fleet head at 127.0.0.1:{closed}: ")
    assert len(done.stderr.strip().splitlines()) == 1
