"""`vmtax boot` for real: cold starts of runc containers and TCG guests side by side, each
timed to ready and to its first HTTP answer, stored, and nothing left running."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vmtax.results.store import Store

pytestmark = pytest.mark.live


def test_cold_starts_of_containers_and_guests(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "vmtax", "boot", "--target", "container:runc,vm:tcg",
         "--count", "2", "--warmup", "0", "--json", "--results", str(tmp_path)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    for name in ("container:runc", "vm:tcg"):
        ready, http = result["targets"][name]["ready"], result["targets"][name]["first http"]
        assert ready["n"] == http["n"] == 2
        assert 0 < ready["p50"] <= ready["p90"] <= ready["p99"] <= ready["max"] < 120
        # Serving comes after ready: the guest's disk, network and nginx start in between.
        assert http["p50"] > ready["p50"] * 0.5 and http["max"] < 180
    containers, guests = (result["targets"][n]["ready"]["p50"]
                          for n in ("container:runc", "vm:tcg"))
    assert containers < guests      # a container starts faster than a TCG guest boots
    run = Store(tmp_path, readonly=True).load_run(result["run"])
    assert sorted({(r.target, r.workload) for r in run.reps}) == [
        ("container:runc", "boot"), ("vm:tcg", "boot")]
    # A guest also gives its own uptime at READY: the kernel's and /init's share of ready.
    assert all({m.name for m in r.metrics} == {"ready", "first http"}
               | ({"guest ready"} if r.target == "vm:tcg" else set()) for r in run.reps)
    guest = result["targets"]["vm:tcg"]["guest ready"]
    assert guest["n"] == 2 and 0 < guest["max"] <= result["targets"]["vm:tcg"]["ready"]["max"]
    assert "guest ready" not in result["targets"]["container:runc"]
    # The VMM's own part of ready: before the guest's clock started.
    vmm = result["targets"]["vm:tcg"]["vmm before the guest"]
    assert vmm["n"] == 2 and 0 < vmm["p50"] < result["targets"]["vm:tcg"]["ready"]["p50"]
    for pid in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert b"/tmp/vmtax-nginx" not in cmdline and str(tmp_path).encode() not in cmdline
    print(f"ready p50: container {containers:.3f} s, tcg guest {guests:.3f} s")
