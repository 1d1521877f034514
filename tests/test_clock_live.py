"""The guest-clock cross-check on real guests: a guest told a wrong TSC rate is flagged."""

import json

import pytest
from conftest import vmtax

from vmtax.host import machine as host

pytestmark = pytest.mark.live


def test_skewed_guest_clock_is_flagged_and_a_normal_one_is_not(tmp_path):
    khz = host.tsc_khz()
    if not khz:
        pytest.skip("the host's TSC rate is unknown")
    plan = tmp_path / "clock.toml"
    # The guest believes its TSC runs twice as fast as it does: its clock runs at half speed,
    # so sysbench's "1 s" lasts 2 s on the host and events/s comes out doubled.
    plan.write_text(f"""
runs = 2
warmup = 0
time = 1
[targets.native]
[targets.vm]
accel = "tcg"
[targets.skewed]
kind = "vm"
accel = "tcg"
kernel_args = "tsc_early_khz={2 * khz}"
[[workloads]]
name = "cpu"
""")
    res = vmtax("run", str(plan), "--results", str(tmp_path / "results"), "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    skewed = data["run"]["targets"]["skewed"]["fingerprint"]
    assert skewed["append"].endswith(f"tsc_early_khz={2 * khz}")
    cells = next(r for r in data["summary"]["rows"] if r["metric"] == "events/s")["cells"]
    assert "clock skew" in cells["skewed"]["flags"]
    assert "clock skew" not in cells["vm"]["flags"]
    assert "clock skew" not in cells["native"]["flags"]
