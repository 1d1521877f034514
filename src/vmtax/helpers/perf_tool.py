"""The host's perf as the collectors that run it (exits, profile) need it: where it is and
whether it runs at all, in one line when it does not."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from vmtax.core.collector import CollectorError
from vmtax.core.text import first_line
from vmtax.host import proc

PERF = "perf"
INSTALL = "apt-get install linux-perf"


def perf_problem() -> str | None:
    """Why perf cannot run here, in one line; None when it runs. Debian's perf is one binary
    per kernel series behind a wrapper that says which is missing; a perf that cannot tell
    its version cannot record either."""
    path = shutil.which(PERF)
    if path is None:
        return f"perf is not installed: {INSTALL}"
    out = proc.run([path, "version"], timeout=10.0)
    if out.exit_code != 0:
        why = first_line(out.stderr) or first_line(out.stdout) or f"exit code {out.exit_code}"
        return f"{path} does not run: {why} ({INSTALL})"
    return None


def spawn_record(argv: list[str], scratch: Path, owner: str) -> subprocess.Popen[bytes]:
    """Start a recording perf (argv) in scratch, its output in scratch/record.log; a perf
    that cannot be started is a CollectorError of owner's. The caller journals the pid."""
    log = (scratch / "record.log").open("wb")
    try:
        return proc.spawn(argv, cwd=scratch, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    except OSError as exc:
        raise CollectorError(f"{owner}: cannot run {PERF}: {exc.strerror}") from None
    finally:
        log.close()


def record_message(scratch: Path) -> str:
    """The last line a perf started by spawn_record printed, for an error message."""
    try:
        text = (scratch / "record.log").read_text(errors="replace")
    except OSError:
        text = ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no message"
