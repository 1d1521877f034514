"""A plan file's text as TOML data: read within bounds, with a problem as `FILE:LINE: …`.

`read_text` reads what can be a plan file (a regular file of at most MAX_PLAN_BYTES of
UTF-8); `parse` turns its text into data, invalid TOML and nesting deeper than MAX_DEPTH
into a one-line `PlanError`. Where each value was written is `toml_lines.Locator`'s.

May import: `vmtax.core` only (every plan file's reader, `run`'s, `tune`'s and
`density`'s, starts here).
"""

from __future__ import annotations

import os
import re
import tomllib
from typing import Any

from vmtax.core.errors import VmtaxError
from vmtax.core.text import read_user_file

# A plan larger than this is not a plan (and a device file would never end).
MAX_PLAN_BYTES = 1 << 20
# Tables and arrays nested deeper than this in a plan mean nothing to vmtax (a sweep of a
# list option is five levels down); much deeper ones would recurse past Python's limit in
# the parser or in what reads the values.
MAX_DEPTH = 32


class PlanError(VmtaxError):
    """A plan file that cannot run; `lines` holds one line per problem."""

    def __init__(self, source: str, lines: list[str]):
        self.lines = lines
        head = [] if len(lines) == 1 else [f"{source}: {len(lines)} problems"]
        super().__init__("\n".join(head + lines))


def read_text(path: str | os.PathLike[str]) -> str:
    """A plan file's text; one-line errors for what cannot be a plan file."""
    return read_user_file(path, "the plan file", MAX_PLAN_BYTES)


def _syntax_error(source: str, text: str, exc: tomllib.TOMLDecodeError) -> str:
    message = str(exc)
    m = re.search(r" \(at line (\d+), column (\d+)\)$", message)
    if m:
        return f"{source}:{m[1]}: invalid TOML: {message[:m.start()]} (column {m[2]})"
    message = message.removesuffix(" (at end of document)")
    return f"{source}:{max(1, len(text.splitlines()))}: invalid TOML: {message} (at the end)"


def parse(text: str, source: str = "<plan>") -> dict[str, Any]:
    """A plan file's TOML as data; a one-line PlanError for invalid TOML and for nesting
    deeper than MAX_DEPTH (which, deep enough, the parser itself cannot follow)."""
    too_deep = PlanError(source, [f"{source}: tables or arrays nested more than {MAX_DEPTH} "
                                  "levels deep; expected a plan"])
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(source, [_syntax_error(source, text, exc)]) from None
    except RecursionError:
        raise too_deep from None
    todo: list[tuple[Any, int]] = [(data, 1)]
    while todo:   # no recursion: the check must not fail as the parser did
        value, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise too_deep
        children = value.values() if isinstance(value, dict) else (
            value if isinstance(value, list) else ())
        todo += [(child, depth + 1) for child in children]
    return data
