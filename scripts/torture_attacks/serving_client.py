"""A serving client killed with -9 (issue #29, defect 3)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torture_kit.env import CLEAN_WITHIN, Env, Outcome
from torture_kit.registry import Attack


def serving_client_attack(env: Env, outcome: Outcome) -> None:
    """Issue #29, defect 3: a serving client killed with -9 leaves its scratch directory
    (no longer /tmp/vmtax-serving-<pid>) and journal for its guardian to undo at once."""
    vegeta = env.work / "vegeta"
    vegeta.write_text("#!/bin/sh\nexec sleep 60\n")
    vegeta.chmod(0o755)
    spec = {"mode": "workers", "vegeta": str(vegeta), "base": "http://127.0.0.1:9",
            "endpoints": [{"name": "x", "path": "/", "method": "GET"}], "requests": 1,
            "workers": 1, "request_timeout": 1}
    # As the runner starts it: PATH and vmtax's runtime settings.
    client = subprocess.Popen([sys.executable, "-m", "vmtax.helpers.serving_client",
                               json.dumps(spec)], text=True, stderr=subprocess.PIPE,
                              env={"PATH": env.env["PATH"], "VMTAX_RUNTIME": str(env.runtime)})
    outcome.cases += 1
    deadline = time.monotonic() + 60
    while not list(env.runtime.glob("vmtax-serving-*/targets")) and client.poll() is None:
        if time.monotonic() > deadline:
            outcome.fail("the serving client never started its attack")
            return
        time.sleep(0.05)
    scratch = list(env.runtime.glob("vmtax-serving-*"))
    if Path(tempfile.gettempdir(), f"vmtax-serving-{client.pid}").exists():
        outcome.fail("the serving client used a predictable directory")
    client.kill()
    client.communicate()
    deadline = time.monotonic() + CLEAN_WITHIN
    while (any(p.exists() for p in scratch) or list(env.runtime.glob("journal-*"))) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    if not scratch:
        outcome.fail("the serving client made no scratch directory in the runtime directory")
    elif any(p.exists() for p in scratch) or list(env.runtime.glob("journal-*")):
        outcome.fail(f"a killed serving client left {scratch[0].name} or its journal")
    else:
        outcome.note(f"clean within {CLEAN_WITHIN:g} s")


ATTACK = Attack(
    "serving client killed", "vmtax.helpers.serving_client killed with -9",
    "its scratch directory (not a predictable one in /tmp) and journal undone within 5 s",
    lambda env, o, quick: serving_client_attack(env, o))
