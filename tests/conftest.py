import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# The lab the live tests of the nested KVM share, booted once whoever asks first.
pytest_plugins = ["lab_session"]

ROOT = Path(__file__).resolve().parent.parent
VMTAX = [sys.executable, "-m", "vmtax"]
UNIT_ONLY_REASON = ("make test-unit runs unit tests only: live tests need root and the host's "
                    "tools (run make test)")


def pytest_collection_modifyitems(config, items):
    """With VMTAX_UNIT_ONLY set (make test-unit), live tests are skipped with a reason,
    never silently deselected."""
    if not os.environ.get("VMTAX_UNIT_ONLY"):
        return
    # A skipif put first: pytest shows the first skipif that holds, so this reason wins over a
    # live test's own ("containers need root") and reads the same for every live test.
    skip = pytest.mark.skipif(True, reason=UNIT_ONLY_REASON)
    for item in items:
        if item.get_closest_marker("live") is not None:
            item.add_marker(skip, append=False)


def builtin(group: str) -> dict:
    """name -> class of vmtax's own plugins of a group, from the registry: a test that checks
    the built-ins' facts reads them here, so a third-party plugin needs no test edit."""
    from vmtax.core import plugin

    return {name: cls for name, cls in plugin.plugins(group).items()
            if cls.__module__.startswith("vmtax.")}


def known(group: str) -> str:
    """The registry's names of a group as messages list them ("a, b, c")."""
    from vmtax.core import plugin

    return ", ".join(plugin.plugins(group))


def warnings_reporter():
    """A runner's reporter that keeps its warnings, in `.lines`."""
    from vmtax.studies.runner import QuietReporter

    class Warnings(QuietReporter):
        def __init__(self):
            self.lines: list[str] = []

        def warn(self, text):
            self.lines.append(text)
    return Warnings()


@pytest.fixture
def vmms_built(monkeypatch):
    """As if `make builds` had built the microVM targets' VMMs (a unit test of a plan that
    names them checks the plan, not the cache)."""
    from vmtax.helpers import vmm_build

    monkeypatch.setattr(vmm_build, "cached", lambda build: Path(f"/opt/built/{build.name}"))


@pytest.fixture(autouse=True)
def _private_runtime(tmp_path, monkeypatch):
    """Each test gets its own journal directory, so tests never undo each other's changes."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("VMTAX_RUNTIME", str(runtime))


def start_vmtax(*args, **kwargs) -> subprocess.Popen:
    """The real CLI in the background, with Ctrl-C working as at a terminal: a shell starts
    background jobs (`make test &`) with SIGINT ignored, and vmtax keeps it so."""
    return subprocess.Popen([*VMTAX, *args], text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                            **kwargs)


def vmtax(*args, check=False, timeout=600, **kwargs):
    """Run the real CLI in a subprocess, as a user would."""
    env = {**os.environ, **kwargs.pop("env", {})}
    return subprocess.run([*VMTAX, *args], capture_output=True, text=True, timeout=timeout,
                          check=check, env=env, **kwargs)


def processes(program: str) -> set[int]:
    """The pids of processes whose executable is named program."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.path.basename(os.readlink(entry / "exe")) == program:
                found.add(int(entry.name))
        except OSError:
            pass
    return found


def wait_for(condition, within: float, step: float = 0.02) -> bool:
    """Poll until condition() is true (a SIGKILL, an undo, takes effect asynchronously);
    False if it is still false after `within` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True
