import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VMTAX = [sys.executable, "-m", "vmtax"]


@pytest.fixture(autouse=True)
def _private_runtime(tmp_path, monkeypatch):
    """Each test gets its own journal directory, so tests never undo each other's changes."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("VMTAX_RUNTIME", str(runtime))


def vmtax(*args, check=False, timeout=600, **kwargs):
    """Run the real CLI in a subprocess, as a user would."""
    env = {**os.environ, **kwargs.pop("env", {})}
    return subprocess.run([*VMTAX, *args], capture_output=True, text=True, timeout=timeout,
                          check=check, env=env, **kwargs)
