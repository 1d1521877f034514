"""Input from users (issue #29): names without control characters, shown escaped when
stored before; CSV cells no spreadsheet runs; bounded reads of user files; a fleet
address checked before Ray; imported runs in report and export."""

import csv
import io
import json
import os
import socket
import time

import pytest
from click.testing import CliRunner

from vmtax.cli.main import cli
from vmtax.core.errors import VmtaxError
from vmtax.core.text import check_printable, printable, read_user_file
from vmtax.core.types import Metric
from vmtax.report import export
from vmtax.results.store import Store
from vmtax.studies import fleet, fleet_ray, plan, planfile

ESC_TITLE = "\x1b]0;pwned\x07"
FORMULA = '=HYPERLINK("http://evil.example/","click")'


def test_printable_escapes_controls_and_keeps_ordinary_text():
    assert printable("container:runc@stock 1.5 ü") == "container:runc@stock 1.5 ü"
    assert printable(f"a{ESC_TITLE}b\u202e\x9b") == "a\\x1b]0;pwned\\x07b\\u202e\\x9b"
    assert printable("a\nb") == "a\\nb" and printable("a\nb", newlines=True) == "a\nb"
    with pytest.raises(VmtaxError, match=r"^--x: 'a\\x1b' holds control characters"):
        check_printable("a\x1b", "--x")


def test_a_user_file_is_read_within_its_cap_and_only_when_regular(tmp_path):
    exact = tmp_path / "exact"
    exact.write_bytes(b"x" * 100)
    assert read_user_file(exact, "the file", 100) == "x" * 100
    (tmp_path / "over").write_bytes(b"x" * 101)
    with pytest.raises(VmtaxError, match=r"over: cannot read the file \(larger than 0 KiB"):
        read_user_file(tmp_path / "over", "the file", 100)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    for path in (fifo, "/dev/zero", tmp_path):
        with pytest.raises(VmtaxError, match=r"cannot read the file \(not a regular file\)"):
            read_user_file(path, "the file", 100)
    assert time.monotonic() - started < 5      # a FIFO without a writer does not block
    (tmp_path / "latin").write_bytes(b"\xff\n")
    with pytest.raises(VmtaxError, match="not UTF-8 text"):
        read_user_file(tmp_path / "latin", "the file", 100)
    assert read_user_file(tmp_path / "latin", "the file", 100, errors="replace") == "\ufffd\n"


def test_plans_and_flags_refuse_control_characters_in_target_names():
    text = '[targets.native]\n[targets."a\\u001b]0;x"]\nkind = "native"\n' \
           '[[workloads]]\nname = "cpu"\n'
    with pytest.raises(planfile.PlanError) as caught:
        planfile.loads(text, "p.toml")
    assert str(caught.value) == ('p.toml:2: targets."a\\u001b]0;x": expected a target name '
                                 'without control characters, got "a\\u001b]0;x"')
    with pytest.raises(VmtaxError, match=r"--qemu label: 'a\\x1b' holds control"):
        plan.from_names(["vm"], ["cpu"], {"qemu": ["a\x1b=/bin/q", "b=/bin/q"]})


def test_perf_report_imports_are_bounded(tmp_path):
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as f:
        f.truncate(17 << 20)
    for path, why in (("/dev/zero", "not a regular file"), (huge, "larger than 16 MiB")):
        done = CliRunner().invoke(cli, ["exits", "import", str(path), "--label", "x",
                                        "--results", str(tmp_path / "r")])
        assert isinstance(done.exception, VmtaxError) and why in str(done.exception)


def hostile_run(results, names=("native", FORMULA, f"vm{ESC_TITLE}")):
    store = Store(results)
    run_id = store.new_run({"targets": [{"name": n, "kind": "native", "options": {}}
                                        for n in names], "baseline": "native"}, {}, "0")
    for name in names:
        store.set_target(run_id, name, "native", {"bare_host": name == "native"})
        for idx in range(3):
            store.add_rep(run_id, target=name, workload="cpu", params={"p": "@SUM(1)"},
                          phase="measure", idx=idx, status="ok", argv=["x"], started=1.0,
                          metrics=[Metric("events/s", -1.5 + idx, "events/s", True)])
    store.finish_run(run_id, "done")
    store.close()
    return Store(results, readonly=True).load_run(run_id)


def test_csv_cells_a_spreadsheet_would_run_get_a_quote_and_numbers_stay(tmp_path):
    run = hostile_run(tmp_path)
    rows = list(csv.DictReader(io.StringIO(export.to_csv(run).decode())))
    assert {r["target"] for r in rows} >= {"'" + FORMULA}
    assert {r["param.p"] for r in rows} == {"'@SUM(1)"}
    assert [r["value"] for r in rows[:3]] == ["-1.5", "-0.5", "0.5"]
    assert export.csv_cell("-2+3") == "'-2+3" and export.csv_cell("\t=1") == "'\\t=1"
    assert export.csv_cell("-1.5") == "-1.5" and export.csv_cell(-1.5) == -1.5
    # JSON is data, not a spreadsheet: names stay as they are.
    assert FORMULA in {r["target"] for r in json.loads(export.to_json(run))}


@pytest.mark.parametrize("command", [["runs"], ["show", "last"], ["show", "last", "--all"],
                                     ["compare", "last:native", f"last:vm{ESC_TITLE}"]])
def test_stored_names_reach_the_terminal_escaped(tmp_path, command):
    hostile_run(tmp_path)
    done = CliRunner().invoke(cli, [*command, "--results", str(tmp_path)],
                              env={"COLUMNS": "300"})
    assert done.exit_code == 0, done.output
    assert "\x1b" not in done.output and "\x07" not in done.output
    assert "\\x1b]0;pwned\\x07" in done.output.replace("\n", "")


def test_the_progress_line_shows_names_escaped():
    from vmtax.cli.progress import ProgressReporter

    reporter = ProgressReporter()
    reporter.start(1)
    reporter.step(f"vm{ESC_TITLE} · cpu · run 1")
    description = reporter.progress.tasks[0].description
    assert description == "vm\\x1b]0;pwned\\x07 · cpu · run 1"


@pytest.mark.parametrize("address, why", [
    ("999.1.1.1:1", "'999.1.1.1' is neither an IP address nor a host name"),
    ("127.0.0.1", "expected HOST:PORT"),
    ("127.0.0.1:0", "the port is 1 to 65535"),
    ("host:65536", "the port is 1 to 65535"),
    ("a b:1", "is neither an IP address nor a host name"),
    ("-x.example:1", "is neither an IP address nor a host name"),
])
def test_a_fleet_address_is_checked_as_written(address, why):
    with pytest.raises(fleet.FleetError, match=why):
        fleet_ray.check_head(address)


def test_fleet_join_fails_at_once_where_no_head_listens(tmp_path):
    with socket.socket() as bound:   # bound, not listening: loopback refuses it
        bound.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{bound.getsockname()[1]}"
        started = time.monotonic()
        done = CliRunner().invoke(cli, ["fleet", "join", address, "--name", "h1",
                                        "--results", str(tmp_path / "r")])
    assert time.monotonic() - started < 15
    assert str(done.exception).startswith(f"no fleet head at {address}: Connection refused")
    assert not (tmp_path / "r").exists()    # nothing made before the address was checked
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        fleet_ray.check_head(f"127.0.0.1:{listening.getsockname()[1]}")


def test_report_and_export_of_an_imported_run(tmp_path):
    from pathlib import Path

    report = Path(__file__).parent / "fixtures" / "perf_kvm" / "classic-vmx.txt"
    results = str(tmp_path / "r")
    assert CliRunner().invoke(cli, ["exits", "import", str(report), "--label", "cap",
                                    "--results", results]).exit_code == 0
    done = CliRunner().invoke(cli, ["report", "cap", "--html", str(tmp_path / "x.html"),
                                    "--results", results])
    message = str(done.exception)
    assert message.startswith("run ") and "is an imported perf kvm stat report (cap)" in message
    assert "`vmtax exits " in message and "no successful repetitions" not in message
    done = CliRunner().invoke(cli, ["export", "cap", "--csv", "-", "--results", results])
    assert done.exit_code == 0, done.output
    rows = list(csv.DictReader(io.StringIO(done.output)))
    assert {r["metric"] for r in rows} >= {"exits"} and rows[0]["target"] == "cap"
    done = CliRunner().invoke(cli, ["export", "cap", "--format", "benchstat",
                                    "--results", results])
    assert "is an imported perf kvm stat report" in str(done.exception)


def test_an_imported_reports_reasons_reach_the_terminal_escaped(tmp_path):
    from pathlib import Path

    text = (Path(__file__).parent / "fixtures" / "perf_kvm" / "classic-vmx.txt").read_text()
    hostile = tmp_path / "hostile.txt"
    hostile.write_text(text.replace("HLT", "HLT\x1b]0;pwned\x07", 1))
    results = str(tmp_path / "r")
    done = CliRunner().invoke(cli, ["exits", "import", str(hostile), "--label", "cap",
                                    "--results", results])
    assert done.exit_code == 0, done.output
    shown = CliRunner().invoke(cli, ["exits", "cap", "--results", results],
                               env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "\x1b" not in shown.output and "\x07" not in shown.output
    assert "HLT\\x1b]0;pwned\\x07" in shown.output
