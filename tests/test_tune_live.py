"""`vmtax tune` for real, cheaply: a container knob against its baseline and the control,
stored as two ordinary runs, inside its budget; then the same search resumed."""

import json
import os
import time

import pytest

from conftest import vmtax
from vmtax.results.store import Store

pytestmark = [pytest.mark.live,
              pytest.mark.skipif(os.geteuid() != 0, reason="containers need root")]


def test_tune_a_container_knob_within_its_budget(tmp_path):
    args = ["tune", "--targets", "native,container:unshare", "--workloads", "cpu",
            "--knobs", "cpus", "--budget", "75s", "--time", "1", "--json",
            "--results", str(tmp_path)]
    started = time.monotonic()
    done = vmtax(*args, timeout=400)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout)
    assert [k["label"] for k in answer["knobs"]] == [f"cpus={min(os.sched_getaffinity(0))}"]
    verdict = answer["knobs"][0]["effects"][0]["verdict"]
    assert verdict in ("better", "worse", "~", "too few runs")
    # The control is the baseline against itself: it must not come out significant.
    assert answer["control"]["significant"] is False
    assert answer["control"]["verdicts"][0]["verdict"] in ("~", "too few runs")
    assert answer["recommended"].startswith('[targets."container:unshare"]\nkind = "container"')
    # The budget bounds the search (what runs after the last repetition aside: stopping).
    assert took < 75 + 45
    store = Store(tmp_path, readonly=True)
    singles = store.load_run(answer["runs"]["singles"])
    assert singles.status == "done"
    assert {r.target for r in singles.reps} == {
        "container:unshare", "container:unshare[control]",
        f"container:unshare[cpus={min(os.sched_getaffinity(0))}]"}
    # Asked again with --resume, the finished search is read back, nothing runs again.
    again = vmtax(*args, "--resume", timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["runs"] == answer["runs"]
    assert len(store.list_runs()) == (2 if answer["runs"]["combined"] else 1)
