"""The Debian packages a plan's plugins need, installed on their first use.

`make run` installs only what the default plan needs (its first table wants no Docker, LXD,
libvirt, MariaDB or Chromium); a plan that uses another plugin gets that plugin's packages
(those it runs, and those it needs only to build something, as a VMM's libclang-dev) when
it first runs, with a line saying so, as builds into the cache are done. Installing starts
no service: a policy-rc.d that refuses every start is in place meanwhile (journaled, so a
crash removes it), and vmtax starts the daemons a plan uses itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from vmtax.core.errors import VmtaxError
from vmtax.host.journal import Journal, undone_by

# Debian's hook that invoke-rc.d asks before starting a service: exit 101 refuses.
POLICY = Path("/usr/sbin/policy-rc.d")
POLICY_TEXT = "#!/bin/sh\n# vmtax: no service starts while it installs packages\nexit 101\n"
APT_TIMEOUT = 1800.0


def missing(packages: Iterable[str]) -> list[str]:
    """Those of packages dpkg does not have installed, in their order."""
    wanted = list(dict.fromkeys(packages))
    if not wanted or shutil.which("dpkg-query") is None:   # not Debian: the plugins say
        return []
    done = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Status}\n", *wanted],
                          capture_output=True, text=True)
    installed = {line.split()[0] for line in done.stdout.splitlines()
                 if line.endswith("install ok installed")}
    return [p for p in wanted if p not in installed]


def install(packages: list[str], journal: Journal, say: Callable[[str], None],
            why: str) -> None:
    """Install packages (apt-get, no service started); why: what needs them, for the line
    that says so. As another user than root, a VmtaxError says what to run instead."""
    if not packages:
        return
    shown = " ".join(packages)
    if os.geteuid() != 0:
        raise VmtaxError(f"{why} needs Debian packages that are not installed: {shown}; "
                         f"install them: sudo apt-get install {shown}")
    say(f"installing the Debian packages {why} needs, on its first use: {shown} (apt-get)")
    token = None
    if not POLICY.exists():
        token = journal.add(type="policy-rc.d", undo=undone_by(remove_policy),
                            path=str(POLICY))
        POLICY.write_text(POLICY_TEXT)
        POLICY.chmod(0o755)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        for argv in (["apt-get", "update", "-qq"],
                     ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]):
            done = subprocess.run(argv, capture_output=True, text=True, env=env,
                                  timeout=APT_TIMEOUT)
            if done.returncode != 0:
                last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:]
                raise VmtaxError(f"installing {shown} failed ({' '.join(argv[:2])}: "
                                 f"{last[0] if last else f'status {done.returncode}'})")
    finally:
        if token is not None:
            journal.undo(token)


def remove_policy(journal: Journal, entry: dict[str, Any]) -> None:
    """Undo install's policy-rc.d: removed only while it is vmtax's own."""
    path = Path(entry["path"])
    try:
        if path.read_text() == POLICY_TEXT:
            path.unlink()
    except FileNotFoundError:
        pass
