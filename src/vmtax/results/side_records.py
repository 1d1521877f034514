"""The records of a side file (vmtax.results.pending) as the store wrote them: what each
field of each kind of record must be to be imported. A side file is read back from disk,
where another program or user may have written it, so each field passes the rules it
passed when it was first written: a run's id as Store.new_run makes it, a run's name as
`--name` takes it, a target's name as a plan takes it (printable, composed), a workload's
as a plugin is named, JSON where JSON was stored, finite numbers. `problem` says what is
wrong with a record, in a few words naming the field."""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable

from vmtax.core.text import composed, printable
from vmtax.results.names import RUN_ID, RUN_NAME

# A plugin's name (a workload, a target kind), a phase, a status: a word, never a path.
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

Check = Callable[[Any], bool]


def _text(value: Any) -> bool:
    return isinstance(value, str) and value.isprintable()


def _name(value: Any) -> bool:
    """A target's name as a plan takes it: printable, in Unicode's composed form."""
    return _text(value) and 0 < len(value) <= 256 and composed(value) == value


def _word(value: Any) -> bool:
    return isinstance(value, str) and _WORD.fullmatch(value) is not None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _maybe(check: Check) -> Check:
    return lambda value: value is None or check(value)


def _json_of(kind: type) -> Check:
    def check(value: Any) -> bool:
        try:
            return isinstance(value, str) and isinstance(json.loads(value), kind)
        except ValueError:
            return False
    return check


def _plan(value: Any) -> bool:
    if not _json_of(dict)(value):
        return False
    name = json.loads(value).get("name")
    return name is None or isinstance(name, str) and RUN_NAME.fullmatch(name) is not None


def _metrics(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(m, list) and len(m) == 5 and _text(m[0]) and _number(m[1])
        and _text(m[2]) and m[3] in (0, 1) and _json_of(dict)(m[4]) for m in value)


_RUN_ID = (lambda v: isinstance(v, str) and RUN_ID.fullmatch(v) is not None, "a run id")
FIELDS: dict[str, dict[str, tuple[Check, str]]] = {
    "run": {"id": _RUN_ID, "created": (_number, "a time"),
            "plan": (_plan, "a plan as JSON, its name a run's name"),
            "host": (_json_of(dict), "a host's facts as JSON"), "version": (_text, "a version")},
    "target": {"run_id": _RUN_ID, "name": (_name, "a target's name"),
               "target_kind": (_word, "a target kind"),
               "fingerprint": (_json_of(dict), "a fingerprint as JSON")},
    "rep": {"run_id": _RUN_ID, "target": (_name, "a target's name"),
            "workload": (_word, "a workload's name"),
            "params": (_json_of(dict), "parameters as JSON"), "phase": (_word, "a phase"),
            "idx": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                    "a repetition's index"),
            "status": (_word, "a status"), "error": (_maybe(lambda v: isinstance(v, str)),
                                                      "an error's text"),
            "exit_code": (_maybe(lambda v: isinstance(v, int) and not isinstance(v, bool)),
                          "an exit status"),
            "host_elapsed": (_maybe(_number), "seconds"),
            "guest_elapsed": (_maybe(_number), "seconds"), "started": (_number, "a time"),
            "argv": (_json_of(list), "a command line as JSON"),
            "stdout": (_maybe(lambda v: isinstance(v, str)), "output"),
            "stderr": (_maybe(lambda v: isinstance(v, str)), "output"),
            "metrics": (_metrics, "metrics: [name, finite value, unit, 0 or 1, dimensions]")},
    "finish": {"run_id": _RUN_ID, "finished": (_number, "a time"),
               "status": (_word, "a status")},
    "elsewhere": {"path": (_text, "a path")},
}


def problem(record: Any) -> str | None:
    """What keeps record from being imported ("run_id: expected a run id, got '../x'"), or
    None when every field is as the store writes it."""
    if not isinstance(record, dict) or record.get("kind") not in FIELDS:
        kind = record.get("kind") if isinstance(record, dict) else record
        return f"expected a record of vmtax (run, target, rep, finish), got {_shown(kind)}"
    for field, (check, expected) in FIELDS[record["kind"]].items():
        if field not in record or not check(record[field]):
            return (f"{record['kind']} {field}: expected {expected}, got "
                    + (_shown(record[field]) if field in record else "nothing"))
    return None


def _shown(value: Any) -> str:
    text = printable(json.dumps(value) if not isinstance(value, str) else repr(value))
    return text if len(text) <= 80 else text[:77] + "..."
