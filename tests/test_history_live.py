"""`vmtax trend` on real runs, kept tiny: eight runs of sysbench cpu natively, the last four
with a larger cpu-max-prime (each prime costs more: events/s falls several-fold). Eight, as
four points on each side are the fewest a single series calls a change with at α=0.05 (the
rank test's smallest p over 3 + 4 points is about 0.1). `vmtax trend` then finds the change at
run 5 and names the parameter; CI fails on it until it is accepted."""

import json

import pytest
from conftest import vmtax

pytestmark = pytest.mark.live

PLAN = """runs = 3
warmup = 0
time = 1
[targets.native]
[[workloads]]
name = "cpu"
params = {{ cpu-max-prime = {prime} }}
"""


# Where the test expects no regression: this host's runs of one plan land up to ~8% apart
# from one night to the next (bench-stats' A vs A runs), and a 4th run 7% below three close
# ones is what the newest-run rule is for (a CI run saw "newest run 4 worse: -7.0%
# [-7.8%, -0.1%]"). The change this test plants is -80% or more.
QUIET = ("--noise-floor", "0.1")


def test_a_parameter_changed_in_real_runs_is_found_and_named(tmp_path):
    results = str(tmp_path / "results")
    ids = []
    for i in range(8):
        plan = tmp_path / f"run{i}.toml"
        plan.write_text(PLAN.format(prime=2000 if i < 4 else 20000))
        run = vmtax("run", str(plan), "--name", "tiny", "--results", results, "--json",
                    check=True)
        ids.append(json.loads(run.stdout)["run"]["id"])
        if i == 3:   # before the change: nothing to fail on
            assert vmtax("trend", "tiny", "--fail-on", "regression", *QUIET,
                         "--results", results).returncode == 0

    shown = vmtax("trend", "tiny", "--results", results, "--json", check=True)
    [series] = json.loads(shown.stdout)["series"]
    assert (series["target"], series["metric"]) == ("native", "events/s")
    [change] = series["changes"]
    assert change["after_run"]["id"] == ids[4] and change["verdict"] == "worse"
    assert change["what_changed"] == ["cpu cpu-max-prime: 2000 → 20000"]
    assert change["ci"][1] < -0.5

    failing = vmtax("trend", "tiny", "--fail-on", "regression", "--results", results)
    assert failing.returncode == 1 and "1 series regressed" in failing.stderr
    vmtax("trend", "tiny", "--accept", ids[4], "--results", results, check=True)
    assert vmtax("trend", "tiny", "--fail-on", "regression", *QUIET,
                 "--results", results).returncode == 0
