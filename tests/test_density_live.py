"""`vmtax density` for real, scaled down for a 2-core host: runc containers and TCG guests
serving nginx, added step by step with KSM off and on; every instance answers HTTP at
every step, memory per instance comes out, and nothing is left behind: no nginx, no QEMU,
no namespace or device of the study's network, KSM as it was."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vmtax.host import ksm

pytestmark = pytest.mark.live

SETTLE = """
settle_window = 1
settle_timeout = 2
ksm_timeout = 4
http_timeout = 30
pages_to_scan = 2000
sleep_millisecs = 10
"""


def leftovers(base: Path, net: str) -> dict[str, list[str]]:
    def lines(argv):
        return subprocess.run(argv, capture_output=True, text=True).stdout.splitlines()
    procs = []
    for pid in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "/tmp/vmtax-nginx" in cmdline or ("qemu-system" in cmdline and str(base) in cmdline):
            procs.append(cmdline)
    return {"netns": [n for n in lines(["ip", "netns", "list"]) if n.startswith(net)],
            "links": [line for line in lines(["ip", "-o", "link"])
                      if f"vt{net.split('-')[1]}" in line],
            "processes": procs}


def density(tmp_path, plan: str, *args: str) -> tuple[dict, str]:
    (tmp_path / "density.toml").write_text(plan)
    done = subprocess.run(
        [sys.executable, "-m", "vmtax", "density", str(tmp_path / "density.toml"), "--json",
         "--results", str(tmp_path / "results"), *args],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    net = re.search(r"on network (\S+)", done.stderr)
    assert net, done.stderr
    return json.loads(done.stdout), net[1]


def check(result: dict, target: str, count: int, ksm_settings: list[bool]) -> None:
    outcomes = [o for o in result["outcomes"] if o["target"] == target]
    assert [o["ksm"] for o in outcomes] == ksm_settings
    for outcome in outcomes:
        steps = outcome["steps"]
        assert outcome["stopped"] == "max", outcome["stopped"]
        assert steps[-1]["instances"] == count
        # Every instance answers HTTP at every step, each asked until it answered.
        assert [s["answering"] for s in steps] == [s["instances"] for s in steps]
        assert all(0 <= s["http_slowest"] <= s["http_wait"] for s in steps)
        assert all(s["pss"] > 0 and s["rss"] >= s["pss"] for s in steps)
        if outcome["ksm"]:
            assert "pages_sharing" in steps[-1]["ksm"]
    for summary in result["summaries"]:
        assert summary["instances"] == count and summary["all_answered"]
        assert summary["pss"] > 0


def test_a_dozen_containers_with_ksm_off_and_on(tmp_path):
    before = ksm.settings()
    plan = ("max = 12\nsingles = 2\nbatch = 5\nparallel = 4\nksm = [false, true]\n" + SETTLE
            + '[targets.c]\nkind = "container"\nruntime = "runc"\n')
    result, net = density(tmp_path, plan)
    check(result, "c", 12, [False, True])
    pss = [s["pss"] for s in result["summaries"]]
    # One nginx (master and worker) costs a few MiB of PSS, not tens.
    assert all(0.3 < p < 20 for p in pss), pss
    assert leftovers(tmp_path, net) == {"netns": [], "links": [], "processes": []}
    assert ksm.settings() == before
    # KSM on cannot merge what nginx never marked mergeable: the output says why.
    [note] = result["notes"]
    assert "MADV_MERGEABLE" in note and "PR_SET_MEMORY_MERGE" in note
    print(f"containers: PSS per instance {pss} MiB (KSM off, on)")


def test_tcg_guests_with_ksm_on(tmp_path):
    before = ksm.settings()
    plan = ("max = 4\nsingles = 1\nbatch = 3\nparallel = 3\nksm = [true]\n" + SETTLE
            + '[targets.tcg]\nkind = "vm"\naccel = "tcg"\nvcpus = 1\nmemory = "56M"\n'
              'disk_size = "64M"\nkernel = "minimal"\ntb_size = 16\n')   # vm's small_options
    result, net = density(tmp_path, plan)
    check(result, "tcg", 4, [True])
    [summary] = result["summaries"]
    # A guest's QEMU holds far more than a container's nginx: its RAM the guest touched.
    assert 20 < summary["pss"] < 400, summary
    assert leftovers(tmp_path, net) == {"netns": [], "links": [], "processes": []}
    assert ksm.settings() == before
    assert result["notes"] == []   # QEMU marks guest RAM mergeable: nothing to explain
    # Each step kept KSM's merge curve, on the study's clock, and the idle guests' CPU.
    for s in result["outcomes"][0]["steps"]:
        times = [t for t, _ in s["ksm_curve"]]
        assert times and times == sorted(times), s["ksm_curve"]
        assert s["instances_cpu"] is not None and 0 <= s["host_busy"] <= 100
    # The stored run reads back as the run printed it (`density show`, also across runs).
    shown = subprocess.run(
        [sys.executable, "-m", "vmtax", "density", "show", result["run"], "--json",
         "--results", str(tmp_path / "results")], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr[-2000:]
    [again] = json.loads(shown.stdout)["summaries"]
    assert (again["run"], again["adjusted"], again["pss"]) == (
        result["run"], summary["adjusted"], summary["pss"])
    sharing = result["outcomes"][0]["steps"][-1]["ksm"]["pages_sharing"]
    print(f"tcg: PSS per instance {summary['pss']} MiB with KSM on, sharing {sharing} pages")
