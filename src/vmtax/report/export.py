"""Tidy data for pandas and R: one row per repetition × metric.

A row carries everything needed to filter and group without joins: run id, target,
workload, phase, repetition index and status, every workload parameter in its own
`param.<name>` column, the metric, each of its dimensions in a `dim.<name>` column (the
metric's values of one repetition differ in them: `dim.percentile`), and the host and
target fingerprints flattened to `host.<field>` / `target.<field>` columns. A failed
repetition has no metrics; it still gets one row (metric empty, error set) so failures
stay visible in the data. Times (`started`, a repetition's start) are ISO 8601 in UTC.

A fleet run set (`vmtax run --fleet`) is exported whole: every host's rows, with a `host`
column naming the host that ran each.

`to_benchstat` writes the same samples as Go benchmark lines, which `benchstat` reads:
    benchstat -col /target run.txt         targets side by side
    benchstat old.txt new.txt              two runs
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import re
from typing import Any

from vmtax.core.text import printable
from vmtax.core.types import Metric
from vmtax.results.store import Run

LEADING = ["run_id", "target", "workload", "phase", "idx", "status", "error"]
METRIC = ["metric", "value", "unit", "higher_is_better", "host_elapsed", "guest_elapsed",
          "started"]


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"prefix.a.b": 1} ({"a.b": 1} without prefix); lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat


def iso_time(timestamp: float | None) -> str | None:
    """Seconds since the epoch as ISO 8601 in UTC: 2026-11-23T14:30:05.123456+00:00."""
    if timestamp is None:
        return None
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).isoformat()


def tidy(run: Run) -> tuple[list[str], list[dict[str, Any]]]:
    """The columns and rows of one run."""
    host = flatten(run.host, "host")
    fingerprints = {name: flatten(t["fingerprint"], "target") for name, t in run.targets.items()}
    rows = []
    for rep in run.reps:
        base = {"run_id": run.id, "target": rep.target, "workload": rep.workload,
                "phase": rep.phase, "idx": rep.idx, "status": rep.status, "error": rep.error,
                **flatten(rep.params, "param")}
        tail = {"host_elapsed": rep.host_elapsed, "guest_elapsed": rep.guest_elapsed,
                "started": iso_time(rep.started), **host, **fingerprints.get(rep.target, {})}
        metrics: list[Metric | None] = [*rep.metrics] or [None]   # no metrics: one row
        for m in metrics:
            metric = ({"metric": m.name, "value": m.value, "unit": m.unit,
                       "higher_is_better": m.higher_is_better,
                       **{f"dim.{k}": v for k, v in m.dimensions.items()}} if m else
                      dict.fromkeys(("metric", "value", "unit", "higher_is_better")))
            rows.append({**base, **metric, **tail})
    present = {k for row in rows for k in row}
    params = sorted(k for k in present if k.startswith("param."))
    dimensions = sorted(k for k in present if k.startswith("dim."))
    fields = sorted(k for k in present if k.startswith(("host.", "target.")))
    return LEADING + params + METRIC + dimensions + fields, rows


def tidy_hosts(per_host: dict[str, Run]) -> tuple[list[str], list[dict[str, Any]]]:
    """The columns and rows of a fleet run set: each host's run, with a `host` column."""
    columns, rows = ["host"], []
    for name, run in per_host.items():
        found, part = tidy(run)
        columns += [c for c in found if c not in columns]
        rows += [{"host": name, **row} for row in part]
    return columns, rows


def _rows(run: Run, per_host: dict[str, Run] | None) -> tuple[list[str], list[dict[str, Any]]]:
    return tidy_hosts(per_host) if per_host else tidy(run)


# A cell a spreadsheet would run as a formula starts with one of these (OWASP's list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def csv_cell(value: Any) -> Any:
    """A cell's text: its control characters escaped as JSON and the terminal escape them
    (`printable`: "\x1b]0;x", so `export --csv -` cannot drive a terminal either; a
    newline stays, quoted as CSV does); a text that a spreadsheet would take for a formula
    gets a leading single quote, as spreadsheets expect (numbers, -1.5 too, stay numbers)."""
    if isinstance(value, (list, dict)):
        value = json.dumps(value)
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not _is_number(value):
        value = "'" + value
    return printable(value, newlines=True) if isinstance(value, str) else value


def to_csv(run: Run, per_host: dict[str, Run] | None = None) -> bytes:
    columns, rows = _rows(run, per_host)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([csv_cell(c) for c in columns])   # parameter names come from plans
    writer.writerows([csv_cell(row.get(c, "")) for c in columns] for row in rows)
    return buf.getvalue().encode()


def to_json(run: Run, per_host: dict[str, Run] | None = None) -> bytes:
    columns, rows = _rows(run, per_host)
    # Every record has every column (null where absent), as pandas.read_json expects.
    return json.dumps([{c: row.get(c) for c in columns} for row in rows], indent=1).encode()


def to_jsonl(run: Run, per_host: dict[str, Run] | None = None) -> bytes:
    """JSON Lines: one record per line, for streaming tools (jq -c, pandas lines=True)."""
    columns, rows = _rows(run, per_host)
    return "".join(json.dumps({c: row.get(c) for c in columns}) + "\n" for row in rows).encode()


def _token(text: str) -> str:
    """A name part or unit benchfmt reads as one token: no spaces, no slashes in values."""
    return re.sub(r"\s+", "-", str(text).strip()) or "-"


def benchstat_unit(metric: Metric) -> str:
    """The unit a metric's values get: its name, and its unit where the name does not say
    it ("latency-avg-ms", "events/s"), and its dimensions ("latency-ms[percentile=99]")."""
    named = metric.unit in (metric.name, *metric.name.split())   # "total events" says it
    unit = metric.name if named else f"{metric.name} {metric.unit}"
    dims = ",".join(f"{k}={v}" for k, v in sorted(metric.dimensions.items()))
    return _token(unit) + (f"[{_token(dims)}]" if dims else "")


def to_benchstat(run: Run, per_host: dict[str, Run] | None = None) -> bytes:
    """Go benchmark format: a header of configuration lines, a `Unit` line per unit saying
    which direction is better, then one line per successful measured repetition:
    BenchmarkCpu/target=native/cpu-max-prime=2000-2  1  9854 events/s  0.2 latency-avg-ms
    (the trailing -N is the host's CPU count, as Go appends GOMAXPROCS). A fleet run set:
    one such block per host, its `vmtax-host:` line a column benchstat can split by."""
    if per_host:
        return b"\n".join(to_benchstat(r).replace(b"pkg: vmtax\n",
                                                  f"pkg: vmtax\nvmtax-host: "
                                                  f"{printable(_token(h))}\n"
                                                  .encode(), 1)
                          for h, r in per_host.items())
    procs = run.host.get("logical_cpus") or 1
    # The run's id and name as comments, not configuration lines: benchstat sets files
    # whose configuration differs apart, in tables of their own, and compares nothing.
    lines = ["goos: linux", f"goarch: {_token(run.host.get('arch') or 'unknown')}",
             f"cpu: {run.host.get('cpu_model') or 'unknown'}", "pkg: vmtax",
             f"# vmtax-run: {run.id}"]
    if run.plan.get("name"):
        lines.append(f"# vmtax-name: {_token(run.plan['name'])}")
    units: dict[str, bool] = {}
    body = []
    # benchstat's columns come in the order first seen: the baseline first, then the plan's
    order = [t["name"] for t in run.plan.get("targets", [])] or list(run.targets)
    baseline = run.plan.get("baseline") or order[0]
    rank = {t: i for i, t in enumerate([baseline, *[t for t in order if t != baseline]])}
    for rep in sorted(run.reps, key=lambda r: rank.get(r.target, len(rank))):
        if rep.phase != "measure" or rep.status != "ok" or not rep.metrics:
            continue
        name = "Benchmark" + _token(rep.workload).replace("-", "_").capitalize()
        parts = [f"target={_token(rep.target).replace('/', '_')}"]
        parts += [f"{_token(k)}={_token(json.dumps(v) if isinstance(v, (list, dict)) else v)}"
                  .replace("/", "_") for k, v in sorted(rep.params.items())]
        values = []
        for m in rep.metrics:
            unit = benchstat_unit(m)
            units.setdefault(unit, m.higher_is_better)
            values.append(f"{m.value!r} {unit}")
        body.append(f"{name}/{'/'.join(parts)}-{procs} 1 " + " ".join(values))
    lines += [f"Unit {u} better={'higher' if hib else 'lower'}" for u, hib in units.items()]
    # Names, parameters and the CPU's model come from outside: escaped, as on the terminal.
    return "".join(printable(line) + "\n" for line in lines + [""] + body).encode()
