"""Exports for pull requests and CI (issue 36, item 13): `export --format markdown`, the
summary as a Markdown table, and `compare --junit FILE`, the verdicts as JUnit XML."""

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import vmtax
from test_ux import TARGETS, store_classic

from vmtax.report.markdown import _md

GOLDEN = Path(__file__).parent / "fixtures" / "golden" / "golden.sqlite"
# A cell's end: a pipe that no backslash escapes.
CELL_END = re.compile(r"(?<!\\)\|")


@pytest.fixture
def golden(tmp_path) -> Path:
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(GOLDEN, results / "vmtax.sqlite")
    return results


def cells(line: str) -> list[str]:
    return [c.strip() for c in CELL_END.split(line.strip())[1:-1]]


def test_the_markdown_table_has_the_numbers_show_prints(golden):
    md = vmtax("export", "golden-a", "--format", "markdown", "--results", str(golden),
               check=True).stdout
    shown = vmtax("show", "golden-a", "--results", str(golden), env={"COLUMNS": "250"},
                  check=True).stdout
    table = [cells(line) for line in md.splitlines() if line.startswith("|")]
    assert table[0] == ["workload", "metric", "native", "container (runc)", "vm:tcg"]
    assert table[1] == [":--", ":--", "--:", "--:", "--:"]
    assert all(len(row) == 5 for row in table)
    body = table[2:]
    assert [row[0] for row in body if row[0] != "**index**"] == [
        "cpu", "threads", "memory", "fileio", "mutex", "dd mode=buffered", "dd mode=direct"]
    for row in body:   # each row as the terminal's row shows it, in order
        words = [re.escape(v.strip("*")).replace("/", r"\s*/\s*") for v in row]
        assert re.search(r"\s+".join(words), shown), (row, shown)
    assert "⚠ primary metrics: 2 cells faster than baseline (suspicious)" in md


def test_markdown_shows_a_stored_name_as_it_is():
    assert _md("a|b") == r"a\|b"                       # no cell ends inside a name
    assert _md("[x](https://e.example)") == r"[x\](https://e.example)"   # no link
    assert _md("*y* <b>") == r"\*y\* \<b\>"
    assert _md("\x1b]0;t\x07") == r"\\x1b]0;t\\x07"    # control characters escaped, shown


def test_markdown_to_a_file_and_not_of_an_imported_report(golden, tmp_path):
    out = tmp_path / "summary.md"
    vmtax("export", "golden-b", "--markdown", str(out), "--results", str(golden), check=True)
    assert out.read_text().startswith("### run ") and "golden-b" in out.read_text()


def junit(golden, *args):
    out = golden.parent / "verdicts.xml"
    res = vmtax("compare", *args, "--junit", str(out), "--results", str(golden))
    return res, ET.parse(out).getroot()


def test_junit_fails_the_cases_the_gate_fails(golden):
    res, root = junit(golden, "golden-a", "golden-b", "--fail-on", "worse")
    assert res.returncode == 1
    worse = int(re.search(r"vmtax: (\d+) metrics significantly worse", res.stderr).group(1))
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    paired = [re.fullmatch(r"[^:\s]+:(\S+) against [^:\s]+:\1", s.get("name")) for s in suites]
    assert sorted(m.group(1) for m in paired) == ["container", "native", "vm:tcg"]
    cases = root.findall("testsuite/testcase")
    failures = root.findall("testsuite/testcase/failure")
    assert int(root.get("tests")) == len(cases) and int(root.get("failures")) == len(failures)
    assert len(failures) == worse > 0
    for suite in suites:
        assert int(suite.get("tests")) == len(suite.findall("testcase"))
        assert int(suite.get("failures")) == len(suite.findall("testcase/failure"))
    for failure in failures:
        assert failure.get("type") == "worse"
        assert failure.get("message") == "significantly worse (--fail-on worse)"
        assert re.match(r"significantly worse: [+-]\d+\.\d% \[", failure.text)
    passed = [c for c in cases if c.find("failure") is None]
    assert passed and all(c.find("system-out") is not None for c in passed)
    # The gate's metrics only: the primary ones, as --fail-on judges them.
    shown = vmtax("compare", "golden-a", "golden-b", "--json", "--results", str(golden),
                  check=True).stdout
    assert len(cases) < shown.count('"verdict"')


@pytest.mark.parametrize("gate, failing", [("worse", False), ("inconclusive", True)])
def test_junit_skips_or_fails_a_verdict_too_few_runs_allow(tmp_path, gate, failing):
    targets = {"native": TARGETS["native"], "vm": TARGETS["vm"]}
    a = store_classic(tmp_path, runs=2, targets=targets, workload_names=["cpu"])
    b = store_classic(tmp_path, runs=2, targets=targets, workload_names=["cpu"])
    res, root = junit(tmp_path, a, b, "--fail-on", gate)
    assert res.returncode == (1 if failing else 0), res.stderr
    cases = root.findall("testsuite/testcase")
    assert cases and int(root.get("tests")) == len(cases)
    if failing:
        assert all(c.find("failure").get("type") == "too few runs" for c in cases)
        assert int(root.get("failures")) == len(cases) and root.get("skipped") == "0"
    else:
        assert all(c.find("skipped") is not None for c in cases)
        assert int(root.get("skipped")) == len(cases) and root.get("failures") == "0"
        assert "too few runs for a verdict" in cases[0].find("skipped").get("message")


def test_junit_without_a_gate_fails_on_worse(golden):
    res, root = junit(golden, "golden-a", "golden-b")
    assert res.returncode == 0
    failures = root.findall("testsuite/testcase/failure")
    assert failures and {f.get("message") for f in failures} == {
        "significantly worse (no --fail-on: failing on worse)"}


def test_every_view_writes_one_interval_notation(tmp_path):
    """Issue 48.9: with 2 runs a side an interval is the runs' range, yet `export
    --markdown` printed it under a "[95% CI]" legend and `compare --junit` wrote it in CI
    brackets; one interval was rounded three ways (terminal, HTML, Markdown)."""
    targets = {"native": TARGETS["native"], "vm": TARGETS["vm"]}
    a = store_classic(tmp_path, runs=2, targets=targets, workload_names=["cpu"])
    b = store_classic(tmp_path, runs=2, targets=targets, workload_names=["cpu"],
                      keeps={"native": 1.0, "vm": 0.5})
    md = vmtax("export", b, "--format", "markdown", "--results", str(tmp_path),
               check=True).stdout
    assert "[95% CI]" not in md and "(a range: the runs' extremes" in md
    shown = vmtax("show", b, "--results", str(tmp_path), env={"COLUMNS": "200"},
                  check=True).stdout
    [row] = [cells(line) for line in md.splitlines() if line.startswith("| cpu")]
    ratio = row[-1]
    assert re.fullmatch(r"0\.\d+ \(0\.\d+–0\.\d+\)", ratio), ratio
    assert ratio in shown                                  # as the terminal rounds it
    html = tmp_path / "r.html"
    vmtax("report", b, "--html", str(html), "--results", str(tmp_path), check=True)
    low_high = ratio.split(" ", 1)[1].strip("()")
    assert f"({low_high})" in html.read_text()            # as the HTML report rounds it
    _, root = junit(tmp_path, a, b)
    for case in root.iter("testcase"):
        detail = "".join(case.itertext()) + "".join(e.get("message", "") for e in case)
        assert re.search(r"% \([-+]\d", detail) and "the runs' range" in detail, detail
        assert not re.search(r"% \[", detail), detail
