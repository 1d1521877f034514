"""The names the store keeps and checks, where they come in and where they are read back
(a side file's records, vmtax.results.side_records): run ids, and runs' names."""

from __future__ import annotations

import re

from vmtax.core.errors import VmtaxError

# A run's id: the time it started, and four hex digits (Store.new_run).
RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{4}")
# A run's name (`vmtax run --name`) and an imported report's label start with a letter, so
# they never read as a run id (ids start with the date) or a prefix of one, and hold no ':'
# (RUN:TARGET), '@' (RUN@HOST) or space.
RUN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9._-]{0,63}")


def check_run_name(name: str, option: str = "--name") -> str:
    if not RUN_NAME.fullmatch(name) or name == "last":
        raise VmtaxError(f"{option}: expected a letter then letters, digits, '.', '_' or '-' "
                         f"(at most 64, not 'last'), got {name!r}")
    return name
