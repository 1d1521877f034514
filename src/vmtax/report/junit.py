"""`vmtax compare --junit FILE`: the comparison's verdicts as JUnit XML, which CI systems
(GitHub, GitLab, Jenkins) show as test results.

A test suite per pair of sides compared (B against A), a test case per metric the gate
judges (the primary ones): a failure where `--fail-on` fails it (`worse` when no --fail-on
is given), skipped where there were too few runs for a verdict and the gate lets that pass,
passed otherwise. Each case says its change with its interval (a CI in brackets, the runs'
range in parentheses, as every view writes them), the medians, p and the runs behind
it, as the terminal table does.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from vmtax.core.text import printable
from vmtax.report.parts import change_interval, fmt, percent

SAID = {"better": "significantly better", "worse": "significantly worse",
        "~": "no significant change", "too few runs": "too few runs for a verdict",
        "below resolution": "below the metric's resolution"}


def _text(value: str) -> str:
    """Text XML 1.0 can hold: control characters escaped (as stored names may have them)."""
    return printable(value)


def _detail(row: Any) -> str:
    c = row.comparison
    change = ("" if c.verdict == "below resolution" else
              f"{percent(c.change)}{change_interval(c.interval, *c.change_ci)}"
              + (" (the runs' range: too few runs for a CI)" if c.interval == "range" else "")
              + ", ")
    note = f"; {c.note}" if c.note else ""
    failed = (f"; {row.failed_a}+{row.failed_b} failed runs excluded"
              if row.failed_a + row.failed_b else "")
    return (f"{SAID[c.verdict]}: {change}median {fmt(c.median_a)} → {fmt(c.median_b)} "
            f"{row.unit} (n={c.n_a} → n={c.n_b}), p={c.p_adjusted:.2g} adjusted{note}{failed}")


def render(rows: list[Any], failing: set[str], gate: str) -> bytes:
    """rows: analysis.summary.CompareRow, those the gate judges; failing: the verdicts that
    fail it; gate: how it was asked for (`--fail-on worse`), said in each failure."""
    root = ET.Element("testsuites", name="vmtax compare")
    sides = list(dict.fromkeys((r.a, r.b) for r in rows))
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    for a, b in sides:
        suite = ET.SubElement(root, "testsuite", name=_text(f"{b} against {a}"))
        counts = {"tests": 0, "failures": 0, "skipped": 0}
        for r in (r for r in rows if (r.a, r.b) == (a, b)):
            params = " ".join(f"{k}={v}" for k, v in r.params.items())
            dims = "".join(f"[{k}={v}]" for k, v in r.dimensions.items())
            case = ET.SubElement(suite, "testcase", time="0",
                                 classname=_text(f"{r.workload} {params}".strip()),
                                 name=_text(f"{r.metric}{dims}"))
            detail = _text(_detail(r))
            counts["tests"] += 1
            if r.comparison.verdict in failing:
                counts["failures"] += 1
                ET.SubElement(case, "failure", type=r.comparison.verdict,
                              message=_text(f"{SAID[r.comparison.verdict]} ({gate})")
                              ).text = detail
            elif r.comparison.verdict == "too few runs":
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=detail)
            else:
                ET.SubElement(case, "system-out").text = detail
        suite.attrib.update({k: str(v) for k, v in counts.items()}, errors="0")
        totals = {k: totals[k] + counts[k] for k in totals}
    root.attrib.update({k: str(v) for k, v in totals.items()}, errors="0")
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
