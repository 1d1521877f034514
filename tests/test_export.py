"""`vmtax export`: tidy rows, one per repetition × metric, as CSV and JSON."""

import csv
import json
import re

import pytest

from conftest import vmtax
from test_report import BLOCKS, make_run
from vmtax import export


@pytest.fixture
def stored(tmp_path):
    store, run_id = make_run(tmp_path / "results")
    return store.load_run(run_id), str(tmp_path / "results")


def test_csv_has_one_row_per_rep_and_metric_with_params_and_fingerprints(tmp_path, stored):
    run, results = stored
    out = vmtax("export", run.id[:15], "--csv", str(tmp_path / "t.csv"), "--results", results)
    assert out.returncode == 0, out.stderr
    with open(tmp_path / "t.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == sum(max(1, len(r.metrics)) for r in run.reps)
    assert len([r for r in rows if r["status"] == "ok"]) == sum(len(r.metrics) for r in run.reps)
    columns = list(rows[0])
    assert columns[:7] == ["run_id", "target", "workload", "phase", "idx", "status", "error"]
    assert {"param.cpu-max-prime", "param.file-test-mode",
            "param.memory-block-size"} <= set(columns)
    assert columns.index("metric") > columns.index("param.memory-block-size")
    assert {"host.cpu_model", "target.kind", "target.runtime", "target.qemu.version",
            "target.namespaces"} <= set(columns)

    vm_events = [r for r in rows if (r["target"], r["metric"]) == ("vm", "events/s")]
    assert len(vm_events) == 3 and vm_events[0]["target.accel"] == "kvm"
    assert vm_events[0]["unit"] == "events/s" and vm_events[0]["higher_is_better"] == "True"
    assert vm_events[0]["param.cpu-max-prime"] == "2000" and vm_events[0]["host_elapsed"] == "1.0"
    container = next(r for r in rows if r["target"] == "container")
    assert json.loads(container["target.namespaces"]) == ["pid", "net"]
    assert container["target.accel"] == ""       # a field other targets lack stays empty
    failed = [r for r in rows if r["status"] == "failed"]
    assert [(r["target"], r["metric"], r["error"]) for r in failed] == [("vm", "", "exit status 1")]
    memory = {r["param.memory-block-size"] for r in rows if r["workload"] == "memory"}
    assert memory == set(BLOCKS)


def test_json_is_the_same_table_as_records(tmp_path, stored):
    run, results = stored
    out = vmtax("export", run.id, "--json", str(tmp_path / "t.json"),
                "--csv", str(tmp_path / "t.csv"), "--results", results)
    assert out.returncode == 0, out.stderr
    records = json.loads((tmp_path / "t.json").read_text())
    columns, rows = export.tidy(run)
    assert len(records) == len(rows) and all(list(r) == columns for r in records)
    first = records[0]
    assert isinstance(first["value"], float) and first["higher_is_better"] is True
    assert first["target.namespaces"] is None or isinstance(first["target.namespaces"], list)


@pytest.mark.parametrize("args, message", [
    (["nope", "--csv", "{tmp}/t.csv"], "unknown run id 'nope'"),
    (["{run}", "--csv", "{tmp}/missing/t.csv"],
     "cannot write .*/missing/t.csv: No such file or directory"),
    (["{run}", "--json", "{tmp}"], "cannot write .*: Is a directory"),
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
    assert out.returncode == 2 and "give --csv FILE or --json FILE" in out.stderr


def test_write_file_replaces_atomically(tmp_path):
    path = tmp_path / "out" / "t.csv"
    path.parent.mkdir()
    path.write_text("old")
    export.write_file(path, b"new")
    assert path.read_text() == "new" and [p.name for p in path.parent.iterdir()] == ["t.csv"]
