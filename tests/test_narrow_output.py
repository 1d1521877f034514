"""Output at 80 columns and in JSON (issue 30, items 8 and 9): `runs` cuts no value,
`density show` never breaks a number, `exits` and `exits diff` fit, `compare` ends with its
answer in one line; `density --json` and `run --fleet --json` are one document each."""

import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from conftest import vmtax
from test_density_compare import step, store_study

from vmtax.cli import density as cli_density
from vmtax.cli import fleet as cli_fleet
from vmtax.cli.main import cli
from vmtax.results.store import Store
from vmtax.analysis.spread import SpreadRow
from vmtax.studies import density, fleet

FIXTURES = Path(__file__).parent / "fixtures"
NARROW = {"COLUMNS": "80", "TERM": "dumb", "NO_COLOR": "1"}


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    results = tmp_path_factory.mktemp("golden")
    shutil.copy(FIXTURES / "golden" / "golden.sqlite", results / "vmtax.sqlite")
    return str(results)


def narrow(*args):
    done = vmtax(*args, env=NARROW)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80, done.stdout
    return done.stdout


def test_runs_cuts_no_value_at_80_columns(golden):
    out = narrow("runs", "--results", golden)
    assert "…" not in out
    for word in ("golden-a", "golden-b", "done", "container,", "vm:tcg", "threads", "90"):
        assert word in out.split(), word


def test_runs_keeps_the_start_time_where_there_is_room(golden):
    done = vmtax("runs", "--results", golden, env={**NARROW, "COLUMNS": "120"})
    assert "started" in done.stdout and "…" not in done.stdout


def test_density_show_never_breaks_a_number(tmp_path):
    store = Store(tmp_path)
    run_id = store_study(store, "container", "container", (-253.72, 4.0))
    store.close()
    out = narrow("density", "show", run_id, "--results", str(tmp_path))
    assert "-253.7" in out.split(), out


def test_exits_and_exits_diff_fit_80_columns(tmp_path):
    results = str(tmp_path)
    for label in ("e2-rt-unpinned", "e2-rt-pinned", "classic-svm"):
        vmtax("exits", "import", str(FIXTURES / "perf_kvm" / f"{label}.txt"), "--label",
              label, "--seconds", "10", "--results", results, check=True)
    shown = narrow("exits", "e2-rt-pinned", "--results", results)
    assert re.search(r"^total\s+10,000\s+100\s+100\s", shown, re.M), shown
    # Every reason whole, on a line of its own.
    assert re.search(r"^EXTERNAL_INTERRUPT\s+35\s+0.35\s", shown, re.M), shown
    out = narrow("exits", "diff", "e2-rt-unpinned", "e2-rt-pinned", "--results", results)
    assert re.search(r"^EXTERNAL_INTERRUPT\s+4.11\s+0.35\s+-3.76\s", out, re.M), out
    # A reason on one side only wraps under its name rather than widening the table.
    narrow("exits", "diff", "e2-rt-pinned", "classic-svm", "--results", results)


def test_compare_ends_with_its_answer_in_one_line(golden):
    out = narrow("compare", "golden-a", "golden-b", "--results", golden)
    # Of three targets, only the VM is slower in golden-b (by 4%); 4 of its latencies by
    # less than one 0.01 ms step of sysbench's, which is no measured change.
    assert out.splitlines()[-1] == ("B against A: 0 better, 23 worse (vm:tcg 23), 61 ~, "
                                    "12 below resolution (α=0.01)")
    one = narrow("compare", "golden-b:native", "golden-b:vm:tcg", "--alpha", "0.05",
                 "--results", golden)
    assert one.splitlines()[-1] == ("B against A: 1 better, 27 worse, 0 ~, "
                                    "4 below resolution (α=0.05)")


def test_density_json_has_what_density_show_json_has(tmp_path, monkeypatch):
    store = Store(tmp_path)
    run_id = store_study(store, "vm:tcg", "vm", (80.0, 40.0))
    store.close()
    steps = [step(1, 1, 80.0, 80.0), step(2, 1, 160.0, 160.0)]
    outcomes = [density.Outcome("vm:tcg", False, steps, "max", 100.0)]
    monkeypatch.setattr(cli_density, "run_density", lambda *args: (run_id, outcomes))
    ran = CliRunner().invoke(cli, ["density", "--targets", "vm:tcg", "--json", "--results",
                                   str(tmp_path)])
    assert ran.exit_code == 0, ran.output
    found = json.loads(ran.output)
    shown = json.loads(CliRunner().invoke(cli, ["density", "show", run_id, "--json",
                                                "--results", str(tmp_path)]).output)
    assert found["run"] == run_id and found["outcomes"][0]["steps"][-1]["instances"] == 2
    assert set(shown) <= set(found)
    assert found["summaries"] == [s for s in shown["summaries"] if not s["ksm"]]
    assert found["summaries"][0]["kind"] == "vm" and found["summaries"][0]["pss"] == 80.0


def test_run_on_a_fleet_prints_one_json_document(tmp_path, monkeypatch, capsys):
    store = Store(tmp_path)
    ids = [store_study(store, "container", "container", (4.0, 4.0)) for _ in range(2)]
    monkeypatch.setattr(fleet, "run", lambda *args: fleet.Outcome(
        [(ids[0], "host a"), (ids[1], "host b")], ["host c left the fleet mid-plan"]))
    row = SpreadRow("cpu", {}, "events/s", "vm", {"a": 0.5, "b": 0.6})
    head = SimpleNamespace(host={"fleet": {"id": ids[0], "spread": "hosts"}})
    monkeypatch.setattr(cli_fleet, "spread_of", lambda store, spec: (head, {}, [row]))
    cli_fleet.run_on_fleet(None, store, "head:6379", None, None, None, None,
                           lambda store, run_id: pytest.fail("a table in --json"),
                           lambda store, run_id: {"run": {"id": run_id}})
    found = json.loads(capsys.readouterr().out)
    assert found["runs"] == [{"on": "host a", "run": {"id": ids[0]}},
                             {"on": "host b", "run": {"id": ids[1]}}]
    assert found["spread"][0]["ratios"] == {"a": 0.5, "b": 0.6}
    assert found["fleet"] == {"id": ids[0], "spread": "hosts"}
    assert found["failures"] == ["host c left the fleet mid-plan"]


def test_run_help_says_fleet_json_is_one_document():
    out = CliRunner().invoke(cli, ["run", "--help"], env={"COLUMNS": "200"}).output
    assert "with --fleet, one JSON document" in " ".join(out.split())


def test_compare_gives_a_metric_one_line_at_80_columns(golden):
    out = narrow("compare", "golden-a", "golden-b", "--results", golden)
    # n once in the header where a side's medians share it; the interval's bounds whole,
    # in the percent the caption names; the row on one line.
    assert re.search(r"^\s+A median\s+B median\s*$\n^workload metric\s+\(n=5\)\s+\(n=5\)\s",
                     out, re.M), out
    assert re.search(r"^cpu\s+events/s ↑\s+49,903\s+49,903\s+\+0\.0% \[-1\.5, \+1\.5\]\s+1\s+~",
                     out, re.M), out
    assert re.search(r"^\s+ops/s ↑\s+1,360,148\s+1,305,742\s+-4\.0% \[-5\.4, -2\.6\]\s+"
                     r"0\.00012\s+worse", out, re.M), out
    assert "change of B relative to A, % [99% CI]" in " ".join(out.split())
    # "below resolution" on one line, in the change column (2 lines in the verdict's)
    assert re.search(r"^\s+latency min ↓\s+0\s+0\s+below resolution –\s+–\s*$\n"
                     r"^\s+latency avg ↓", out, re.M), out


def test_show_all_breaks_no_header_number_or_interval_at_80_columns(golden):
    out = narrow("show", "golden-a", "--all", "--results", golden)
    head = out.split("target fingerprints")[0]
    assert "…" not in head
    # Every target's name whole in the header; the workload heads its rows on a line of
    # its own, its column's width given to the numbers. A cell's parts share a line where
    # they fit: the median with its cv (or its interval), the ratio with its interval; an
    # interval wider than its column wraps at its " – ".
    assert re.search(r"^metric\s+native = 1\s+\(runc\)\s+vm:tcg$", head, re.M), head
    assert re.search(r"^cpu *$\n^events/s ↑\s+48,450 cv 0\.8%\s+49,903 cv 0\.8%\s+"
                     r"4,845 \(4,801 – 4,903\)$\n"
                     r"^\s+\(48,014 – 49,031\)\s+\(49,454 – 50,502\)\s+cv 0\.8%$\n"
                     r"^\s+×1\.03 \[1\.02–1\.04\]\s+×0\.100 \[0\.099–0\.1\]$\n", head, re.M), head
    assert re.search(r"^\s+×0\.990 \[0\.98–1\.003\]\s+×0\.500 \[0\.49–0\.51\]$", head,
                     re.M), head
    assert re.search(r"^\s+\(2,695,813 –\s+\(2,668,855 –\s+\(1,347,906 –$\n"
                     r"^\s+2,752,939\)\s+2,725,409\)\s+1,376,469\)$", head, re.M), head


def test_show_all_gives_a_cell_two_lines_with_two_targets_at_80_columns(tmp_path):
    """Two targets at 80 columns: median, its interval and cv on one line, the ratio and
    its interval on the next (each on a line of its own before: 5 lines a cell)."""
    from vmtax.core.workload import Metric
    store = Store(tmp_path)
    run_id = store.new_run({"targets": [{"name": "native"}, {"name": "container"}],
                            "baseline": "native", "runs": 5, "warmup": 0, "time": 1},
                           {"cpu_model": "Synthetic CPU"}, "0.1.0")
    for target, keep in (("native", 1.0), ("container", 0.9)):
        store.set_target(run_id, target, target, {"kind": target})
        for idx in range(5):
            store.add_rep(run_id, target=target, workload="cpu", params={}, phase="measure",
                          idx=idx, status="ok", argv=["sysbench"], started=float(idx),
                          host_elapsed=1.0, guest_elapsed=1.0,
                          metrics=[Metric("events/s", 48000 * keep * (1 + idx / 100),
                                          "events/s", True)])
    store.finish_run(run_id, "done")
    store.close()
    out = narrow("show", run_id, "--all", "--results", str(tmp_path))
    assert re.search(r"^cpu *$\n^events/s ↑ 48,960 \(48,000 – 49,920\) cv 1\.6% "
                     r"44,064 \(43,200 – 44,928\) cv 1\.6%$\n"
                     r"^ +×0\.900 \[0\.87–0\.93\]$\n^median", out, re.M), out


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Two runs of a memory block-size sweep that keeps three other parameters the same."""
    from vmtax.core.workload import Metric
    results = tmp_path_factory.mktemp("sweep")
    store = Store(results)
    for name, keep_vm in (("sweep-a", 0.5), ("sweep-b", 0.45)):
        run_id = store.new_run({"name": name, "targets": [{"name": "native"}, {"name": "vm"}],
                                "baseline": "native", "runs": 3, "warmup": 0, "time": 1},
                               {"cpu_model": "Synthetic CPU"}, "0.1.0")
        store.set_target(run_id, "native", "native", {"kind": "native"})
        store.set_target(run_id, "vm", "vm", {"kind": "vm", "accel": "tcg"})
        for block in ("1K", "64K", "1M"):
            params = {"memory-block-size": block, "memory-total-size": "10G",
                      "memory-oper": "write", "threads": 1}
            for target, keep in (("native", 1.0), ("vm", keep_vm)):
                for idx in range(3):
                    store.add_rep(run_id, target=target, workload="memory", params=params,
                                  phase="measure", idx=idx, status="ok", argv=["sysbench"],
                                  started=float(idx), host_elapsed=1.0, guest_elapsed=1.0,
                                  metrics=[Metric("MiB/s", 9000 * keep * (1 + idx / 100),
                                                  "MiB/s", True)])
        store.finish_run(run_id, "done")
    store.close()
    return str(results)


FIXED = "memory: memory-oper=write memory-total-size=10G threads=1 throughout"


@pytest.mark.parametrize("args", [("show", "sweep-a"), ("show", "sweep-a", "--all"),
                                  ("compare", "sweep-a", "sweep-b")])
def test_a_sweep_shows_what_varies_and_says_once_what_is_fixed(sweep, args):
    out = narrow(*args, "--results", sweep)
    words = " ".join(out.split())
    assert words.count("memory-total-size=10G") == words.count(FIXED) == (
        2 if args[0] == "compare" else 1), out   # compare: once a pair of targets
    for block in ("1K", "64K", "1M"):
        assert f"memory-block-size={block}" in out.split(), out
    if args[0] == "compare":   # a row: its sweep point, then the change's range under it
        assert re.search(r"^memory\s+MiB/s ↑\s+4,545\s+4,090\s+-10\.0%\s+0\.0004\s+worse *$\n"
                         r"^memory-block-size=64K\s+\(-11\.8, -8\.2\) *$", out, re.M), out


def _store_of(results, targets):
    """A finished run of cpu on each of targets, the first the baseline, each a tenth
    faster than the one before."""
    from vmtax.core.workload import Metric
    store = Store(results)
    run_id = store.new_run({"targets": [{"name": t} for t in targets], "baseline": targets[0],
                            "runs": 5, "warmup": 0, "time": 1},
                           {"cpu_model": "Synthetic CPU"}, "0.1.0")
    for n, target in enumerate(targets):
        store.set_target(run_id, target, "native", {"kind": "native"})
        for idx in range(5):
            store.add_rep(run_id, target=target, workload="cpu", params={}, phase="measure",
                          idx=idx, status="ok", argv=["sysbench"], started=float(idx),
                          host_elapsed=1.0, guest_elapsed=1.0,
                          metrics=[Metric("events/s", 12345.678 * (1 + n / 10) + idx,
                                          "events/s", True)])
    store.finish_run(run_id, "done")
    store.close()
    return run_id


SIX = ("native", "container:runc", "container:crun", "vm:tcg@stock", "vm:tcg@patched-build",
       "libvirt:my-guest")


@pytest.mark.parametrize("args", [(), ("--all",)])
def test_six_targets_at_80_columns_show_every_number_whole(tmp_path, args):
    """Issue 45.16: six targets at 80 columns had `show` fold their names ("contain",
    "er:runc") and break intervals inside a number ("[1.1–1.", "1]"), and `show --all` cut
    some to an ellipsis; the targets go in as many tables as show every name and number
    whole."""
    run_id = _store_of(tmp_path, SIX)
    command = ("show", run_id, *args, "--results", str(tmp_path))
    number = re.compile(r"\d[\d.,]*\d|\d")
    wide = vmtax(*command, env={**NARROW, "COLUMNS": "250"}).stdout
    out = narrow(*command)
    assert set(number.findall(wide)) <= set(number.findall(out)), out
    assert "…" not in out and all(t in out for t in SIX), out


def test_long_target_names_draw_figures_in_their_layout(tmp_path):
    """Issue 45.16: names of a hundred characters pushed the axes out of the figures, which
    matplotlib drew without their layout, warning on stderr with its source lines."""
    from vmtax.report.figure import LABEL_LINE, figure_labels
    long = ("native", "vm:tcg@" + "a-long-label-for-a-patched-qemu-build-" * 3,
            "container:runc@" + "x" * 100, "container:runc@" + "x" * 101)
    run_id = _store_of(tmp_path, long)
    done = vmtax("report", run_id, "--html", str(tmp_path / "r.html"), "--png",
                 str(tmp_path / "png"), "--results", str(tmp_path))
    assert done.returncode == 0 and "Warning" not in done.stderr, done.stderr
    assert len(list((tmp_path / "png").glob("*.png"))) == 2
    shown = figure_labels({t: t for t in long})
    assert len(set(shown.values())) == 4 and shown["native"] == "native"
    assert all(len(line) <= LABEL_LINE for label in shown.values()
               for line in label.splitlines())
