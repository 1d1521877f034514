"""Tidy data for pandas and R: one row per repetition × metric, and safe file writing.

A row carries everything needed to filter and group without joins: run id, target,
workload, phase, repetition index and status, every workload parameter in its own
`param.<name>` column, the metric, each of its dimensions in a `dim.<name>` column (the
metric's values of one repetition differ in them: `dim.percentile`), and the host and
target fingerprints flattened to `host.<field>` / `target.<field>` columns. A failed
repetition has no metrics; it still gets one row (metric empty, error set) so failures
stay visible in the data.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import secrets
from pathlib import Path
from typing import Any

from vmtax.errors import VmtaxError
from vmtax.store import Run
from vmtax.types import Metric

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
                "started": rep.started, **host, **fingerprints.get(rep.target, {})}
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


def _csv_value(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def to_csv(run: Run) -> bytes:
    columns, rows = tidy(run)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: _csv_value(v) for k, v in row.items()} for row in rows)
    return buf.getvalue().encode()


def to_json(run: Run) -> bytes:
    columns, rows = tidy(run)
    # Every record has every column (null where absent), as pandas.read_json expects.
    return json.dumps([{c: row.get(c) for c in columns} for row in rows], indent=1).encode()


def write_file(path: str | os.PathLike, data: bytes) -> None:
    """Write all of `data` or nothing: a temporary file beside `path`, renamed over it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        # os.open with 0o666 lets the umask decide the mode, as for any new file.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise VmtaxError(f"cannot write {path}: {exc.strerror or exc}") from None


def output_dir(path: str | os.PathLike) -> Path:
    """A directory for figure files, created if needed."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise VmtaxError(f"cannot create directory {path}: {exc.strerror or exc}") from None
    return path
