"""The fleet's pieces that need no Ray cluster (tests/test_fleet_live.py runs a real one)."""

import json
import socket
import types

import pytest
from conftest import vmtax

from vmtax.core.types import Metric
from vmtax.results.store import Store
from vmtax.analysis.spread import spread
from vmtax.studies import fleet, fleet_ray
from vmtax.studies.plan import from_names
from vmtax.studies.runner import QuietReporter, schedule

FP = {"cpu_model": "EPYC", "logical_cpus": 2, "kernel": "6.1", "hostname": "h1",
      "memory_bytes": 2**34}


def test_the_head_runs_nothing_and_a_host_advertises_its_resource_only():
    head = fleet_ray.head_argv(6379, None)
    assert head[head.index("--num-cpus") + 1] == "0" and "--resources" not in head
    join = fleet_ray.join_argv("10.0.0.1:6379", "h1", "/tmp/r")
    assert join[join.index("--num-cpus") + 1] == "0"
    assert json.loads(join[join.index("--resources") + 1]) == {"vmtax-host:h1": 1}
    assert join[join.index("--temp-dir") + 1] == "/tmp/r" and "--block" in join


@pytest.mark.parametrize("name", ["", "a b", "-x", "a/b", "x" * 64])
def test_bad_host_names_are_refused(name):
    with pytest.raises(fleet.FleetError, match="--name: expected"):
        fleet_ray.check_name(name)


def test_identity_ignores_what_differs_between_identical_hosts():
    assert fleet_ray.identity(FP) == fleet_ray.identity({**FP, "hostname": "h2",
                                                  "memory_bytes": 2**34 - 4096})
    assert fleet_ray.identity(FP) != fleet_ray.identity({**FP, "kernel": "6.2"})


def _hosts(monkeypatch, *found):
    monkeypatch.setattr(fleet, "hosts", lambda ray: list(found))


def test_choosing_hosts(monkeypatch):
    a = fleet_ray.Host("a", True, FP, None, None)
    b = fleet_ray.Host("b", True, {**FP, "hostname": "h2"}, None, None)
    gone = fleet_ray.Host("c", False, FP, None, None)
    _hosts(monkeypatch, a, b, gone)
    assert list(fleet._choose(None, None, "hosts")) == ["a", "b"]
    assert list(fleet._choose(None, ["all"], "cells")) == ["a", "b"]
    assert list(fleet._choose(None, ["b"], "hosts")) == ["b"]
    with pytest.raises(fleet.FleetError, match=r"no live host named c, x in the fleet; "
                                               r"it has: a, b"):
        fleet._choose(None, ["a", "c", "x"], "hosts")
    _hosts(monkeypatch, a, fleet_ray.Host("k", True, {**FP, "kernel": "6.2"}, None, None))
    with pytest.raises(fleet.FleetError, match="identical hosts, but k and a differ in kernel"):
        fleet._choose(None, None, "cells")
    assert list(fleet._choose(None, None, "hosts")) == ["a", "k"]
    _hosts(monkeypatch, gone)
    with pytest.raises(fleet.FleetError, match="no host has joined the fleet"):
        fleet._choose(None, None, "hosts")


def test_addresses_are_checked_before_ray_is_asked():
    with pytest.raises(fleet.FleetError, match="expected HOST:PORT"):
        fleet_ray._host_port("head")
    assert fleet_ray._host_port("10.0.0.1:6379") == ("10.0.0.1", 6379)


def _rep(**over):
    rep = dict(target="native", workload="cpu", params={"time": 1}, phase="measure", idx=0,
               status="ok", argv=["sysbench"], started=1.0, host_elapsed=1.0,
               metrics=[Metric("events/s", 10.0, "1/s", True)])
    return {**rep, **over}


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


# -- results across hosts ------------------------------------------------------------------
def _host_run(store: Store, fleet_info: dict, keeps: float) -> str:
    """A stored run of cpu on native and container, container at `keeps` of native."""
    plan = from_names(["native", "container"], ["cpu"], runs=3, warmup=0, time=1)
    run_id = store.new_run(plan.to_dict(), {**FP, "fleet": fleet_info}, "0")
    for target in ("native", "container"):
        store.set_target(run_id, target, target, {})
    for idx, value in enumerate((10.0, 10.1, 9.9)):
        for target, factor in (("native", 1.0), ("container", keeps)):
            store.add_rep(run_id, **_rep(target=target, params={}, idx=idx, host_elapsed=2.0,
                                         metrics=[Metric("events/s", value * factor,
                                                         "events/s", True)]))
    store.finish_run(run_id, "done")
    return run_id


@pytest.fixture
def fleet_store(tmp_path):
    """A head's store with one --spread hosts fleet run on a, b, c (ratios 0.5, 0.8, 0.9),
    another fleet run and a local run."""
    store = Store(tmp_path)
    ids = {name: _host_run(store, {"spread": "hosts", "host": name, "id": "f1"}, keeps)
           for name, keeps in (("a", 0.5), ("b", 0.8), ("c", 0.9))}
    _host_run(store, {"spread": "hosts", "host": "a", "id": "f2"}, 0.1)
    local = _host_run(store, {}, 0.1)
    store.db.execute("UPDATE runs SET host = json_remove(host, '$.fleet') WHERE id = ?",
                     (local,))
    store.db.commit()
    return store, ids, local


def test_a_fleet_run_set_is_its_hosts_runs_and_each_ratio_spreads_across_them(fleet_store):
    store, ids, local = fleet_store
    per_host = fleet.host_runs(store, store.load_run(ids["b"]))
    assert {h: r.id for h, r in per_host.items()} == ids
    (row,) = spread(per_host)
    assert (row.workload, row.metric, row.target) == ("cpu", "events/s", "container")
    assert {h: round(v, 3) for h, v in row.ratios.items() if v} == {"a": 0.5, "b": 0.8,
                                                                     "c": 0.9}
    assert (round(row.median, 3), round(row.low, 3), round(row.high, 3)) == (0.8, 0.5, 0.9)
    assert fleet.host_run(store, store.load_run(ids["a"]), "c").id == ids["c"]
    with pytest.raises(fleet.FleetError, match=r"host 'x' has no results in the fleet run "
                                               r".*; it has: a, b, c"):
        fleet.host_run(store, store.load_run(ids["a"]), "x")
    with pytest.raises(fleet.FleetError, match="was not run on a fleet"):
        fleet.host_runs(store, store.load_run(local))


def test_a_cells_run_is_split_by_the_host_that_ran_each_repetition(tmp_path):
    store = Store(tmp_path)
    run_id = _host_run(store, {"spread": "cells", "hosts": ["a", "b"], "id": "f3"}, 0.5)
    log = fleet.FleetLog(tmp_path)
    for rep in store.load_run(run_id).reps:
        log.rep(run_id, fleet.rep_key(vars(rep)), "a" if rep.idx < 2 else "b", None)
    per_host = fleet.host_runs(store, store.load_run(run_id))
    assert {h: sorted({r.idx for r in run.reps}) for h, run in per_host.items()} == {
        "a": [0, 1], "b": [2]}
    (row,) = spread(per_host)
    assert set(row.ratios) == {"a", "b"} and row.low is not None and row.low < 0.6


def test_show_compare_export_and_report_of_a_fleet_run(fleet_store, tmp_path):
    from click.testing import CliRunner

    from vmtax.cli.main import cli

    store, ids, _ = fleet_store
    results = str(store.dir)
    runner = CliRunner()
    shown = runner.invoke(cli, ["fleet", "show", ids["a"], "--results", results, "--json"])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.output)
    assert data["runs"] == ids and data["fleet"]["id"] == "f1"
    (row,) = data["spread"]
    assert (round(row["median"], 3), round(row["min"], 3), round(row["max"], 3)) == (
        0.8, 0.5, 0.9)
    table = runner.invoke(cli, ["fleet", "show", ids["c"], "--results", results],
                          terminal_width=200)
    lines = table.output.splitlines()
    assert "across 3 hosts (fleet f1, --spread hosts)" in lines[0]
    assert any(line.split()[2:] == ["container", "0.500", "0.800", "0.900", "0.800",
                                    "0.5–0.9"] for line in lines), table.output
    compared = runner.invoke(cli, ["compare", f"{ids['a']}@a", f"{ids['a']}@c", "--results",
                                   results, "--json"])
    assert compared.exit_code == 0, compared.output
    by_target = {r["a"]: r for r in json.loads(compared.output)["rows"]
                 if r["metric"] == "events/s"}
    assert by_target[f"{ids['a']}:container"]["b"] == f"{ids['c']}:container"
    assert by_target[f"{ids['a']}:container"]["comparison"]["change"] == pytest.approx(0.8)
    assert by_target[f"{ids['a']}:native"]["comparison"]["change"] == pytest.approx(0.0)
    exported = runner.invoke(cli, ["export", ids["b"], "--format", "csv", "--results", results])
    assert exported.exit_code == 0, exported.output
    header, *rows = exported.output.splitlines()
    assert header.startswith("host,run_id,target,")
    assert {r.split(",")[:2][0]: r.split(",")[1] for r in rows} == ids
    markdown = runner.invoke(cli, ["export", ids["b"], "--format", "markdown", "--results",
                                   results])
    assert markdown.exit_code == 0, markdown.output
    assert markdown.output.startswith(f"## fleet run {ids['b']}\n")
    assert all(f"### {h}: " in markdown.output for h in ids)
    html = tmp_path / "r.html"
    reported = runner.invoke(cli, ["report", ids["b"], "--html", str(html), "--results",
                                   results])
    assert reported.exit_code == 0, reported.output
    page = html.read_text()
    assert "Across 3 hosts" in page and all(f"Host {h} · Run {ids[h]}" in page for h in ids)
    assert 'data-median><strong>80.0%' in page
    done = vmtax("compare", f"{ids['a']}@x", f"{ids['a']}@a", "--results", results, timeout=60)
    assert (done.returncode, done.stderr.strip()) == (
        2, f"vmtax: error: host 'x' has no results in the fleet run of {ids['a']}; it has: "
           "a, b, c")
