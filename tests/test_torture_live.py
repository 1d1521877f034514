"""`make torture`'s reduced form, live: kill -9 and SIGINT mid-run, concurrent resumes,
fuzzed plans and parser outputs, corrupt and vanishing databases (issue #16)."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(os.geteuid() != 0, reason="containers and cgroups need root here"),
]


def test_the_reduced_torture_finds_nothing(tmp_path):
    env = {**os.environ, "VMTAX_RUNTIME": str(tmp_path / "runtime")}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "torture.py"), "--quick"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    print(done.stdout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "no traceback, leak, lost repetition or side effect" in done.stdout
    for attack in ("SIGKILL container:runc", "SIGINT native", "concurrent runs and resumes",
                   "fuzzed plan files", "fuzzed parser outputs", "corrupt databases",
                   "database deleted mid-run", "planted runtime directory",
                   "serving client killed", "full runtime directory",
                   "guardian stopped or killed"):
        assert attack in done.stdout
    assert "Traceback" not in done.stderr
