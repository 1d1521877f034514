"""`vmtax export`: tidy rows, one per repetition × metric, as CSV and JSON."""

import csv
import io
import json
import re

import pytest
from conftest import vmtax

from vmtax.core.types import Metric
from vmtax.host import outputs
from vmtax.report import export
from vmtax.results.store import Store

FINGERPRINTS = {"native": {"kind": "native", "kernel": "6.1.0", "bare_host": True},
                "container": {"kind": "container", "runtime": "crun",
                              "namespaces": ["pid", "net"], "bare_host": False},
                "vm": {"kind": "vm", "accel": "kvm", "qemu": {"version": "7.2.0"},
                       "bare_host": False}}
BLOCKS = ["16K", "1M"]


def fio_metrics(keep: float) -> list[Metric]:
    return [Metric("iops", 5000 * keep, "IO/s", True, {"job": "randread"}),
            Metric("latency", 90 / keep, "us", False, {"job": "randread", "percentile": "50"}),
            Metric("latency", 400 / keep, "us", False, {"job": "randread", "percentile": "99.9"})]


def make_run(results):
    """native/container/vm × cpu, a fio job with latency percentiles and a memory
    block-size sweep, 2 runs each, plus one failed vm cpu repetition."""
    store = Store(results)
    run_id = store.new_run({"targets": [{"name": t} for t in FINGERPRINTS]},
                           {"cpu_model": "Synthetic CPU", "cores": 2}, "0.1.0")
    for name, fingerprint in FINGERPRINTS.items():
        store.set_target(run_id, name, fingerprint["kind"], fingerprint)
    configs = [("cpu", {"cpu-max-prime": 2000}, lambda k: [Metric("events/s", 48000 * k,
                                                                  "events/s", True)]),
               ("fio", {"rw": "randread"}, fio_metrics)]
    configs += [("memory", {"memory-block-size": b},
                 lambda k: [Metric("MiB/s", 9000 * k, "MiB/s", True)]) for b in BLOCKS]
    for workload, params, metrics in configs:
        for target in FINGERPRINTS:
            for idx in range(2):
                store.add_rep(run_id, target=target, workload=workload, params=params,
                              phase="measure", idx=idx, status="ok", argv=[workload],
                              started=float(idx), host_elapsed=1.0, guest_elapsed=1.0,
                              metrics=metrics({"native": 1, "container": 0.97}.get(target, 0.6)))
    store.add_rep(run_id, target="vm", workload="cpu", params={"cpu-max-prime": 2000},
                  phase="measure", idx=2, status="failed", error="exit status 1",
                  argv=["cpu"], started=4.0)
    store.finish_run(run_id, "done")
    return store.load_run(run_id)


@pytest.fixture
def stored(tmp_path):
    return make_run(tmp_path / "results"), str(tmp_path / "results")


def test_tidy_has_one_row_per_rep_and_metric_with_params_dimensions_and_fingerprints(stored):
    run, _ = stored
    columns, rows = export.tidy(run)
    assert len(rows) == sum(max(1, len(r.metrics)) for r in run.reps)
    assert columns[:7] == ["run_id", "target", "workload", "phase", "idx", "status", "error"]
    assert columns[7:10] == ["param.cpu-max-prime", "param.memory-block-size", "param.rw"]
    assert columns[10:17] == export.METRIC
    assert columns[17:19] == ["dim.job", "dim.percentile"]
    assert columns[19:] == sorted(columns[19:]) and {
        "host.cpu_model", "target.kind", "target.bare_host", "target.runtime",
        "target.qemu.version", "target.namespaces"} <= set(columns[19:])

    vm_p999 = [r for r in rows if (r["target"], r["metric"], r.get("dim.percentile"))
               == ("vm", "latency", "99.9")]
    assert len(vm_p999) == 2 and vm_p999[0]["dim.job"] == "randread"
    assert vm_p999[0]["value"] == pytest.approx(400 / 0.6) and vm_p999[0]["unit"] == "us"
    assert vm_p999[0]["target.accel"] == "kvm" and vm_p999[0]["param.rw"] == "randread"
    iops = next(r for r in rows if r["metric"] == "iops")
    assert iops["dim.job"] == "randread" and "dim.percentile" not in iops
    cpu = next(r for r in rows if r["metric"] == "events/s")
    assert not any(k.startswith("dim.") for k in cpu)
    failed = [r for r in rows if r["status"] == "failed"]
    assert [(r["target"], r["metric"], r["error"]) for r in failed] == [
        ("vm", None, "exit status 1")]
    assert {r["param.memory-block-size"] for r in rows if r["workload"] == "memory"} == set(BLOCKS)


def test_csv_leaves_absent_columns_empty_and_writes_lists_as_json(stored):
    run, _ = stored
    rows = list(csv.DictReader(io.StringIO(export.to_csv(run).decode())))
    assert list(rows[0]) == export.tidy(run)[0]
    container = next(r for r in rows if r["target"] == "container" and r["workload"] == "fio"
                     and r["dim.percentile"] == "50")
    assert json.loads(container["target.namespaces"]) == ["pid", "net"]
    assert container["target.accel"] == ""       # a field other targets lack stays empty
    assert container["higher_is_better"] == "False" and container["target.bare_host"] == "False"
    cpu = next(r for r in rows if r["workload"] == "cpu")
    assert cpu["dim.job"] == cpu["dim.percentile"] == ""


def test_json_records_have_every_column(stored):
    run, _ = stored
    records = json.loads(export.to_json(run))
    columns, rows = export.tidy(run)
    assert len(records) == len(rows) and all(list(r) == columns for r in records)
    first = records[0]
    assert isinstance(first["value"], float) and first["higher_is_better"] is True
    assert first["dim.percentile"] is None
    assert any(r["dim.percentile"] == "99.9" for r in records)


def test_export_command_writes_both_files(tmp_path, stored):
    run, results = stored
    out = vmtax("export", run.id[:15], "--json", str(tmp_path / "t.json"),
                "--csv", str(tmp_path / "t.csv"), "--results", results)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "t.csv").read_bytes() == export.to_csv(run)
    assert (tmp_path / "t.json").read_bytes() == export.to_json(run)


@pytest.mark.parametrize("args, message", [
    (["nope", "--csv", "{tmp}/t.csv"], "unknown run id 'nope'"),
    (["{run}", "--csv", "{tmp}/missing/t.csv"],
     "cannot write .*/missing/t.csv: No such file or directory"),
    (["{run}", "--json", "{tmp}"], "cannot write .*: it is a directory; expected a file"),
])
def test_bad_input_is_one_line_and_leaves_no_file(tmp_path, stored, args, message):
    run, results = stored
    argv = [a.format(tmp=tmp_path, run=run.id) for a in args]
    out = vmtax("export", *argv, "--results", results)
    assert out.returncode == 2
    assert re.fullmatch(rf"vmtax: error: {message}.*\n", out.stderr), out.stderr
    assert not list(tmp_path.glob("t.*")) and not list(tmp_path.rglob(".*.tmp"))


def test_export_needs_an_output(stored):
    run, results = stored
    out = vmtax("export", run.id, "--results", results)
    assert out.returncode == 2
    assert "give --csv, --json, --jsonl, --benchstat or --markdown FILE" in out.stderr


def test_write_file_replaces_atomically(tmp_path):
    path = tmp_path / "out" / "t.csv"
    path.parent.mkdir()
    path.write_text("old")
    outputs.write_file(path, b"new")
    assert path.read_text() == "new" and [p.name for p in path.parent.iterdir()] == ["t.csv"]
