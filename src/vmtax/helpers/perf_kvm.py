"""`perf kvm stat report` text, turned into metrics per exit reason (E2).

perf prints one of two layouts, both read here into the same metric names and units:

- classic (`--stdio`, and every perf before the hists rework): a table headed by the event
  kind ("VM-EXIT", "IO Port Access", "MMIO Access"), times in µs with a "us" suffix, the
  mean's relative standard deviation as `( +-  x.xx% )`, and a closing line `Total
  Samples:N, Total events handled time:T us.`. perf before 3.x has no Min/Max columns.

      Analyze events for all VMs, all VCPUs:

       VM-EXIT    Samples  Samples%     Time%    Min Time    Max Time     Avg time

           HLT       2300    23.00%    98.73%    130.00us   1227.31us    519.95us ( +-   0.82% )
      ...

      Total Samples:3715, Total events handled time:74125.71us.

- hists (the report's browser view of newer perf, whose kvm stat keeps its events in hists,
  saved as text): columns "Event name", "Samples", "Sample%", "Time (ns)", "Time%",
  "Max Time (ns)", "Min Time (ns)", "Mean Time (ns)", integer nanoseconds, no spread and
  no totals line; the totals are the sums of the rows.

Reason names are what perf's tables (arch/x86/include/uapi/asm/vmx.h and svm.h) call them:
Intel VMX upper case (EXTERNAL_INTERRUPT), AMD SVM lower case (npf, msr, hlt, ...); a name
outside both tables (a newer kernel's reason) is kept as printed.

A reason perf has no name for is printed as a row named UNKNOWN, and perf says which code
it was on stderr, `unknown kvm exit code:N on VMX`, just before the row: a report saved
with `2>&1` on a PVM host has such lines between its rows. Each UNKNOWN row is named by its
code (`UNKNOWN(131072)`) when the report carries one code line per UNKNOWN row; without
them, several UNKNOWN rows are told apart by number (`UNKNOWN#2`), so none is dropped.
Anything else that is not such a report, or is cut short, is a ParseError naming the line.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from vmtax.core.errors import ParseError
from vmtax.core.types import Metric, MetricSpec

# perf's event kinds: its --event name, and the first header of the classic table.
EVENTS = {"VM-EXIT": "vmexit", "IO Port Access": "ioport", "MMIO Access": "mmio"}

VMX_REASONS = frozenset((
    "EXCEPTION_NMI EXTERNAL_INTERRUPT TRIPLE_FAULT INIT_SIGNAL SIPI_SIGNAL INTERRUPT_WINDOW "
    "NMI_WINDOW TASK_SWITCH CPUID HLT INVD INVLPG RDPMC RDTSC VMCALL VMCLEAR VMLAUNCH VMPTRLD "
    "VMPTRST VMREAD VMRESUME VMWRITE VMOFF VMON CR_ACCESS DR_ACCESS IO_INSTRUCTION MSR_READ "
    "MSR_WRITE INVALID_STATE MSR_LOAD_FAIL MWAIT_INSTRUCTION MONITOR_TRAP_FLAG "
    "MONITOR_INSTRUCTION PAUSE_INSTRUCTION MCE_DURING_VMENTRY TPR_BELOW_THRESHOLD APIC_ACCESS "
    "EOI_INDUCED GDTR_IDTR LDTR_TR EPT_VIOLATION EPT_MISCONFIG INVEPT RDTSCP PREEMPTION_TIMER "
    "INVVPID WBINVD XSETBV APIC_WRITE RDRAND INVPCID VMFUNC ENCLS RDSEED PML_FULL XSAVES "
    "XRSTORS UMWAIT TPAUSE BUS_LOCK NOTIFY").split())

SVM_REASONS = frozenset((
    "read_cr0 read_cr2 read_cr3 read_cr4 read_cr8 write_cr0 write_cr2 write_cr3 write_cr4 "
    "write_cr8 read_dr0 read_dr1 read_dr2 read_dr3 read_dr4 read_dr5 read_dr6 read_dr7 "
    "write_dr0 write_dr1 write_dr2 write_dr3 write_dr4 write_dr5 write_dr6 write_dr7 "
    "interrupt intr nmi smi init vintr cr0_sel_write read_idtr read_gdtr read_ldtr read_rt "
    "write_idtr write_gdtr write_ldtr write_rt rdtsc rdpmc pushf popf cpuid rsm iret swint "
    "invd pause hlt invlpg invlpga io msr task_switch ferr_freeze shutdown vmrun hypercall "
    "vmload vmsave stgi clgi skinit rdtscp icebp wbinvd monitor mwait xsetbv "
    "write_efer_trap write_cr0_trap write_cr4_trap write_cr8_trap invpcid npf "
    "avic_incomplete_ipi avic_unaccelerated_access vmgexit vmgexit_mmio_read "
    "vmgexit_mmio_write vmgexit_nmi_complete vmgexit_ap_hlt_loop vmgexit_ap_jump_table "
    "vmgexit_page_state_change vmgexit_guest_request vmgexit_ext_guest_request "
    "vmgexit_ap_creation vmgexit_hypervisor_feature invalid_guest_state").split())

_DIMS = ("event", "reason")
# The metrics of one report, per reason and event; the same for both layouts.
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("exits", "count", False, "exits (or port/MMIO accesses) of this reason",
               dimensions=_DIMS),
    MetricSpec("exit share", "%", False, "share of all exits of the event kind: Samples%",
               dimensions=_DIMS),
    MetricSpec("exit time share", "%", False,
               "share of the time the host spent handling exits: Time%", dimensions=_DIMS),
    MetricSpec("exit time", "µs", False, "time the host spent handling exits of this reason",
               dimensions=_DIMS),
    MetricSpec("exit time min", "µs", False, "shortest exit of this reason", dimensions=_DIMS),
    MetricSpec("exit time max", "µs", False, "longest exit of this reason", dimensions=_DIMS),
    MetricSpec("exit time avg", "µs", False, "mean time to handle one exit of this reason",
               dimensions=_DIMS),
    MetricSpec("exit time spread", "%", False, "relative standard deviation of the mean "
               "(the classic layout's ± column)", spread=True, dimensions=_DIMS),
    MetricSpec("exits total", "count", False, "exits of all reasons (Total Samples)",
               dimensions=("event",)),
    MetricSpec("exit time total", "µs", False,
               "time spent handling exits of all reasons (Total events handled time)",
               dimensions=("event",)),
    MetricSpec("exits lost", "count", False, "events perf lost while recording",
               dimensions=("event",)),
)


@dataclass(frozen=True)
class Row:
    """One reason's line; times in µs, shares in %. None: the layout does not print it."""
    reason: str
    samples: int
    sample_share: float
    time_share: float
    time: float
    avg: float
    min: float | None
    max: float | None
    spread: float | None


@dataclass(frozen=True)
class Report:
    event: str                # vmexit | ioport | mmio
    layout: str               # classic | hists
    rows: tuple[Row, ...]
    total_samples: int
    total_time: float         # µs
    lost: int = 0

    @property
    def vendor(self) -> str | None:
        """"vmx" or "svm" when every known reason is of that vendor's table."""
        names = {r.reason for r in self.rows} if self.event == "vmexit" else set()
        vmx, svm = names & VMX_REASONS, names & SVM_REASONS
        return "vmx" if vmx and not svm else "svm" if svm and not vmx else None

    def metrics(self) -> list[Metric]:
        spec = {s.name: s for s in METRICS}

        def metric(name: str, value: float, **dims: str) -> Metric:
            return Metric(name, float(value), spec[name].unit, spec[name].higher_is_better,
                          {"event": self.event, **dims})

        out = []
        for r in self.rows:
            values = {"exits": r.samples, "exit share": r.sample_share,
                      "exit time share": r.time_share, "exit time": r.time,
                      "exit time min": r.min, "exit time max": r.max, "exit time avg": r.avg,
                      "exit time spread": r.spread}
            out += [metric(name, v, reason=r.reason) for name, v in values.items()
                    if v is not None]
        out.append(metric("exits total", self.total_samples))
        out.append(metric("exit time total", self.total_time))
        if self.lost:
            out.append(metric("exits lost", self.lost))
        return out


_NUM = r"\d+(?:\.\d+)?"
_CLASSIC_HEAD = re.compile(r"^\s*(VM-EXIT|IO Port Access|MMIO Access)\s+Samples\s+Samples%"
                           r"\s+Time%\s+(Min Time\s+Max Time\s+)?Avg time\s*$")
_CLASSIC_ROW = re.compile(
    rf"^\s*(?P<name>\S(?:.*\S)?)\s+(?P<n>\d+)\s+(?P<sp>{_NUM})%\s+(?P<tp>{_NUM})%\s+"
    rf"(?:(?P<min>{_NUM})us\s+(?P<max>{_NUM})us\s+)?(?P<avg>{_NUM})us\s+"
    rf"\(\s*\+-\s*(?P<spread>{_NUM})%\s*\)\s*$")
_CLASSIC_TOTAL = re.compile(rf"^\s*Total Samples:\s*(\d+),\s*Total events handled time:\s*"
                            rf"({_NUM})\s*us\.\s*$")
_HISTS_COLUMNS = ("Samples", "Sample%", "Time (ns)", "Time%", "Max Time (ns)",
                  "Min Time (ns)", "Mean Time (ns)")
_HISTS_HEAD = re.compile(r"^[#\s]*Event name\s+(.*?)\s*$")
_HISTS_ROW = re.compile(rf"^\s*(?P<name>\S(?:.*\S)?)((?:\s+{_NUM}%?){{7}})\s*$")
_LOST = re.compile(r"^\s*Lost events:\s*(\d+)\s*$")
_UNKNOWN_CODE = re.compile(r"^\s*unknown kvm exit code:\s*(\d+) on \w+\s*$")
_PORT = re.compile(r"^0x[0-9a-f]+:(POUT|PIN)$")
_MMIO = re.compile(r"^0x[0-9a-f]+:(W|R)$")


def parse(text: str, source: str = "report") -> Report:
    """The report in `text`, either layout; `source` names it in errors ("perf.txt")."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        head = _CLASSIC_HEAD.match(line)
        if head:
            return _classic(lines, i, EVENTS[head.group(1)], bool(head.group(2)), source)
        head = _HISTS_HEAD.match(line)
        if head and head.group(1).split("  ")[0].strip() == "Samples":
            return _hists(lines, i, head.group(1), source)
    raise ParseError(f"{source}: no `perf kvm stat report` table in it (no header line "
                     "with VM-EXIT, Samples, Samples%, Time% ... or Event name, Samples, "
                     "Sample%, Time (ns) ...)")


def _where(source: str, index: int, lines: list[str]) -> str:
    if index >= len(lines):
        return f"{source}: line {index + 1} (after the end)"
    return f"{source}: line {index + 1} {lines[index].strip()[:80]!r}"


def _classic(lines: list[str], head: int, event: str, min_max: bool, source: str) -> Report:
    rows: list[Row] = []
    i = head + 1
    while i < len(lines) and (not lines[i].strip() or _UNKNOWN_CODE.match(lines[i])):
        i += 1
    while i < len(lines) and lines[i].strip():
        if _UNKNOWN_CODE.match(lines[i]):
            i += 1
            continue
        m = _CLASSIC_ROW.match(lines[i])
        if m is None or bool(m.group("min")) != min_max:
            if _CLASSIC_TOTAL.match(lines[i]):
                break
            raise ParseError(f"{_where(source, i, lines)}: not a row of the table (name, "
                             "samples, samples%, time%, " + ("min, max, " if min_max else "")
                             + "avg time ( +- x% ))")
        n, avg = int(m.group("n")), float(m.group("avg"))
        rows.append(Row(m.group("name"), n, float(m.group("sp")), float(m.group("tp")),
                        n * avg, avg, float(m["min"]) if min_max else None,
                        float(m["max"]) if min_max else None, float(m.group("spread"))))
        i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    total = _CLASSIC_TOTAL.match(lines[i]) if i < len(lines) else None
    if total is None:
        raise ParseError(f"{_where(source, i, lines)}: expected the closing `Total Samples:N, "
                         "Total events handled time:T us.` line (is the report cut short?)")
    samples, time = int(total.group(1)), float(total.group(2))
    if sum(r.samples for r in rows) != samples:
        raise ParseError(f"{_where(source, i, lines)}: the rows add up to "
                         f"{sum(r.samples for r in rows)} samples, not {samples} (rows missing?)")
    lost = next((int(m.group(1)) for line in lines[i + 1:] if (m := _LOST.match(line))), 0)
    return _checked(Report(event, "classic", _named_unknowns(rows, lines), samples, time,
                           lost), lines, i, source)


def _hists(lines: list[str], head: int, columns: str, source: str) -> Report:
    found = tuple(c.strip() for c in re.split(r"\s{2,}", columns))
    if found != _HISTS_COLUMNS:
        raise ParseError(f"{_where(source, head, lines)}: expected the columns Event name, "
                         + ", ".join(_HISTS_COLUMNS))
    rows: list[Row] = []
    i = head + 1
    while i < len(lines) and (not lines[i].strip("#.- \t")       # a rule or blank lines
                              or _UNKNOWN_CODE.match(lines[i])):
        i += 1
    while i < len(lines) and lines[i].strip():
        if _UNKNOWN_CODE.match(lines[i]):
            i += 1
            continue
        m = _HISTS_ROW.match(lines[i])
        values = m.group(2).split() if m else []
        # Sample% and Time% carry a % sign, the others none.
        if m is None or [v.endswith("%") for v in values] != [False, True, False, True,
                                                              False, False, False]:
            raise ParseError(f"{_where(source, i, lines)}: not a row of the table (name, "
                             "then " + ", ".join(_HISTS_COLUMNS) + ")")
        n, sp, ns, tp, most, least, mean = (float(v.rstrip("%")) for v in values)
        if n != int(n) or n == 0:
            raise ParseError(f"{_where(source, i, lines)}: Samples is not a positive count")
        rows.append(Row(m.group("name"), int(n), sp, tp, ns / 1000, mean / 1000,
                        least / 1000, most / 1000, None))
        i += 1
    if not rows:
        raise ParseError(f"{_where(source, i, lines)}: the table has no rows (is the report "
                         "cut short?)")
    names = [r.reason for r in rows]
    event = ("ioport" if all(_PORT.match(n) for n in names) else
             "mmio" if all(_MMIO.match(n) for n in names) else "vmexit")
    lost = next((int(m.group(1)) for line in lines[i:] if (m := _LOST.match(line))), 0)
    report = Report(event, "hists", _named_unknowns(rows, lines),
                    sum(r.samples for r in rows), sum(r.time for r in rows), lost)
    return _checked(report, lines, i - 1, source)


def _named_unknowns(rows: list[Row], lines: list[str]) -> tuple[Row, ...]:
    """The rows, each UNKNOWN one named by its code, or by its number among them when the
    codes perf printed on stderr are not all in the text (see the module's docstring)."""
    unknown = [k for k, r in enumerate(rows) if r.reason == "UNKNOWN"]
    codes = [m.group(1) for line in lines if (m := _UNKNOWN_CODE.match(line))]
    if len(codes) == len(unknown) and len(set(codes)) == len(codes):
        names = [f"UNKNOWN({code})" for code in codes]
    elif len(unknown) > 1:
        names = ["UNKNOWN"] + [f"UNKNOWN#{n}" for n in range(2, len(unknown) + 1)]
    else:
        return tuple(rows)
    named = list(rows)
    for k, name in zip(unknown, names):
        named[k] = dataclasses.replace(rows[k], reason=name)
    return tuple(named)


def _checked(report: Report, lines: list[str], at: int, source: str) -> Report:
    """The report, if its shares add up to 100% as perf's always do (each rounded to
    0.01%): otherwise rows are missing or numbers are garbled."""
    if not report.rows:
        return report
    slack = 0.005 * len(report.rows) + 0.01
    for what, total in (("Samples%", sum(r.sample_share for r in report.rows)),
                        ("Time%", sum(r.time_share for r in report.rows))):
        if abs(total - 100) > slack:
            raise ParseError(f"{_where(source, at, lines)}: the {what} column adds up to "
                             f"{total:.2f}%, not 100% (rows missing or garbled?)")
    return report
