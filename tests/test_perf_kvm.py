"""The `perf kvm stat report` parser: both layouts and both vendors into the same metrics,
and a clear ParseError, naming the line, for anything cut short or garbled.

The fixtures follow perf's own printf formats (tools/perf/builtin-kvm.c: print_result for
the classic layout, the kvm_dimension headers and widths for the hists one)."""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vmtax.core.errors import ParseError
from vmtax.helpers import perf_kvm

FIXTURES = Path(__file__).parent / "fixtures" / "perf_kvm"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def by_key(report):
    return {m.key: m for m in report.metrics()}


@pytest.mark.parametrize("name, layout, vendor", [
    ("classic-vmx.txt", "classic", "vmx"), ("classic-svm.txt", "classic", "svm"),
    ("hists-vmx.txt", "hists", "vmx"), ("hists-svm.txt", "hists", "svm")])
def test_every_layout_and_vendor_gives_the_same_names_and_units(name, layout, vendor):
    report = perf_kvm.parse(fixture(name))
    assert (report.layout, report.vendor, report.event) == (layout, vendor, "vmexit")
    metrics = report.metrics()
    names = {m.name for m in metrics}
    spec = {s.name: s.unit for s in perf_kvm.METRICS}
    assert all(m.unit == spec[m.name] for m in metrics)
    expected = {"exits", "exit share", "exit time share", "exit time", "exit time min",
                "exit time max", "exit time avg", "exits total", "exit time total"}
    assert names - {"exit time spread", "exits lost"} == expected
    assert ("exit time spread" in names) == (layout == "classic")
    assert all(m.dimensions["event"] == "vmexit" for m in metrics)


def test_classic_and_hists_of_the_same_recording_agree_in_microseconds():
    """classic-vmx and hists-vmx print the same statistics: µs with two decimals vs ns."""
    classic = by_key(perf_kvm.parse(fixture("classic-vmx.txt")))
    hists = by_key(perf_kvm.parse(fixture("hists-vmx.txt")))
    hlt = "[event=vmexit,reason=HLT]"
    for name in ("exits", "exit share", "exit time share", "exit time min", "exit time max",
                 "exit time avg"):
        assert hists[name + hlt].value == pytest.approx(classic[name + hlt].value, abs=0.01)
    # classic derives a reason's time from its rounded mean; the total line is exact.
    assert hists["exit time" + hlt].value == pytest.approx(classic["exit time" + hlt].value,
                                                          rel=1e-4)
    total = "exit time total[event=vmexit]"
    assert hists[total].value == pytest.approx(classic[total].value, abs=0.01)
    assert hists["exits total[event=vmexit]"].value == 10000


def test_classic_vmx_values_are_read_as_printed():
    report = perf_kvm.parse(fixture("classic-vmx.txt"))
    row = next(r for r in report.rows if r.reason == "EXTERNAL_INTERRUPT")
    assert (row.samples, row.sample_share, row.time_share) == (411, 4.11, 0.05)
    assert (row.min, row.max, row.avg, row.spread) == (0.40, 3.27, 1.61, 1.87)
    assert report.total_samples == 10000
    assert report.total_time == 1215174.54
    # TDCALL is newer than the exit-reason table this parser knows: kept as printed.
    assert "TDCALL" not in perf_kvm.VMX_REASONS
    assert any(r.reason == "TDCALL" for r in report.rows)


def test_svm_reasons_and_lost_events():
    report = perf_kvm.parse(fixture("classic-svm.txt"))
    reasons = {r.reason for r in report.rows}
    assert {"npf", "msr", "hlt", "interrupt", "io", "vintr", "idle_hlt"} <= reasons
    assert report.lost == 3
    assert by_key(report)["exits lost[event=vmexit]"].value == 3


def test_old_perf_without_min_max_columns():
    report = perf_kvm.parse(fixture("classic-old-vmx.txt"))
    assert report.layout == "classic" and report.total_samples == 9721
    assert all(r.min is None and r.max is None for r in report.rows)
    assert not any(m.name in ("exit time min", "exit time max") for m in report.metrics())


def test_pvm_unknown_exit_codes_between_rows_are_kept_and_named_by_code():
    """A PVM host's report saved with 2>&1: perf's `unknown kvm exit code:N on VMX` lines
    stand before the UNKNOWN rows they name. Every row is kept, the totals match."""
    report = perf_kvm.parse(fixture("classic-pvm.txt"), "pvm.txt")
    assert [r.reason for r in report.rows] == [
        "INVLPG", "UNKNOWN(131072)", "UNKNOWN(327680)", "INVD", "UNKNOWN(65536)"]
    assert report.total_samples == sum(r.samples for r in report.rows) == 20000
    assert by_key(report)["exits[event=vmexit,reason=UNKNOWN(65536)]"].value == 500
    assert report.vendor == "vmx"


def test_pvm_report_whose_code_lines_came_first_is_named_alike():
    """stdout piped is buffered and stderr is not: the code lines can all come first."""
    lines = fixture("classic-pvm.txt").splitlines()
    codes = [line for line in lines if line.startswith("unknown kvm exit code")]
    text = "\n".join(codes + [line for line in lines if line not in codes])
    assert [r.reason for r in perf_kvm.parse(text).rows] == [
        "INVLPG", "UNKNOWN(131072)", "UNKNOWN(327680)", "INVD", "UNKNOWN(65536)"]


def test_unknown_rows_without_their_codes_are_numbered_not_merged():
    text = "\n".join(line for line in fixture("classic-pvm.txt").splitlines()
                     if not line.startswith("unknown kvm exit code"))
    report = perf_kvm.parse(text)
    assert [r.reason for r in report.rows] == [
        "INVLPG", "UNKNOWN", "UNKNOWN#2", "INVD", "UNKNOWN#3"]
    assert len(report.metrics()) == len({m.key for m in report.metrics()})


def test_pvm_codes_in_the_hists_layout():
    rows = fixture("hists-vmx.txt").splitlines()
    at = next(k for k, line in enumerate(rows) if line.lstrip().startswith("CPUID"))
    rows[at] = rows[at].replace("CPUID", "UNKNOWN", 1)
    rows.insert(at, "unknown kvm exit code:131072 on VMX")
    report = perf_kvm.parse("\n".join(rows))
    assert "UNKNOWN(131072)" in {r.reason for r in report.rows}
    assert report.total_samples == 10000


def test_a_line_that_is_not_part_of_the_table_still_names_the_line():
    rows = fixture("classic-pvm.txt").splitlines()
    at = rows.index("unknown kvm exit code:327680 on VMX")
    rows[at] = "unknown kvm exit code on VMX"
    with pytest.raises(ParseError, match=r"pvm\.txt: line 10 'unknown kvm exit code on VMX'"
                                         r": not a row"):
        perf_kvm.parse("\n".join(rows), "pvm.txt")


def test_ioport_event():
    report = perf_kvm.parse(fixture("classic-ioport.txt"))
    assert report.event == "ioport" and report.vendor is None
    assert {r.reason for r in report.rows} == {"0x70:POUT", "0x71:PIN", "0x3f8:POUT"}


def test_an_empty_recording_is_a_report_with_zero_totals():
    text = ("Analyze events for all VMs, all VCPUs:\n\n"
            "             VM-EXIT    Samples  Samples%     Time%    Min Time    Max Time"
            "         Avg time \n\n\nTotal Samples:0, Total events handled time:0.00us.\n")
    report = perf_kvm.parse(text)
    assert report.rows == () and report.total_samples == 0


def test_truncated_classic_report_names_the_line():
    text = fixture("classic-vmx.txt")
    cut = text[:text.index("Total Samples")]
    with pytest.raises(ParseError, match=r"perf\.txt: line \d+ \(after the end\).*Total Samples"):
        perf_kvm.parse(cut, "perf.txt")
    # Cut in the middle of a row.
    half = text[:text.index("EPT_MISCONFIG") + 30]
    with pytest.raises(ParseError, match=r"line 11 .*EPT_MISCONFIG.*not a row"):
        perf_kvm.parse(half)


def test_missing_rows_do_not_pass_as_a_report():
    lines = fixture("classic-vmx.txt").splitlines()
    without_hlt = "\n".join(line for line in lines if " HLT " not in line)
    with pytest.raises(ParseError, match="add up to 7700 samples, not 10000"):
        perf_kvm.parse(without_hlt)
    hists = "\n".join(line for line in fixture("hists-svm.txt").splitlines()
                      if " hlt " not in line)
    with pytest.raises(ParseError, match="Samples% column adds up to"):
        perf_kvm.parse(hists)


def test_garbled_number_names_the_line():
    text = fixture("hists-vmx.txt").replace("2510", "25x0", 1)
    with pytest.raises(ParseError, match=r"line 4 'MSR_WRITE +25x0"):
        perf_kvm.parse(text)


def test_text_that_is_no_report():
    with pytest.raises(ParseError, match="no `perf kvm stat report` table"):
        perf_kvm.parse("perf: command not found\n", "x.txt")


# -- fuzz: whatever the text, a Report or a ParseError, nothing else ---------------------

ALL = [fixture(p.name) for p in sorted(FIXTURES.glob("*.txt"))]


@st.composite
def garbled(draw):
    text = draw(st.sampled_from(ALL))
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["cut", "delete", "insert", "replace", "dup_line"]))
        at = draw(st.integers(0, len(text)))
        if how == "cut":
            text = text[:at]
        elif how == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 40)):]
        elif how == "insert":
            text = text[:at] + draw(st.text(max_size=20)) + text[at:]
        elif how == "replace" and at < len(text):
            text = text[:at] + draw(st.sampled_from("0123456789.%:-+() x\n\t#")) + text[at + 1:]
        elif how == "dup_line":
            lines = text.splitlines(keepends=True)
            if lines:
                i = draw(st.integers(0, len(lines) - 1))
                text = "".join(lines[:i + 1] + lines[i:])
    return text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(garbled())
def test_garbled_reports_raise_only_parse_error(text):
    try:
        report = perf_kvm.parse(text)
    except ParseError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    metrics = report.metrics()
    assert metrics and all(m.unit for m in metrics)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_arbitrary_text_raises_only_parse_error(text):
    try:
        perf_kvm.parse(text)
    except ParseError:
        pass
