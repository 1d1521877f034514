"""Runs that repeat (analysis/history.py, `vmtax trend`, `vmtax export --format otava`), on
synthetic stores: a step is found at the run that made it, with what changed there; the
newest run alone is judged as `compare` judges it; CI fails until the change is accepted."""

import csv
import re
import io
import json

import numpy as np
import pytest
from conftest import vmtax

from vmtax.analysis import differences, history
from vmtax.core.types import Metric
from vmtax.results.store import Store

HOST = {"hostname": "rack1", "kernel": "6.1.0-18-amd64", "cpu_model": "Xeon", "vmtax": "0.1.0",
        "quiet": {"load": [0.1]}}
EVENTS = ("events/s", "events/s", True)
MIB = ("MiB/s", "MiB/s", True)


def add_run(store, name, levels, *, options=None, host=None, params=None, version="0.1.0",
            seed=0, reps=3, workloads=("cpu",), noise=0.01):
    """One run named name: per target, its level of every workload's headline metric,
    `reps` repetitions around it; options per target (the plan's and the fingerprint's)."""
    rng = np.random.default_rng(seed)
    options = options or {}
    plan = {"name": name, "runs": reps, "time": 1,
            "targets": [{"name": t, "kind": t.split(":")[0], "options": options.get(t, {})}
                        for t in levels],
            "workloads": [{"name": w, "params": {}} for w in workloads]}
    run_id = store.new_run(plan, host or HOST, version)
    for target, level in levels.items():
        store.set_target(run_id, target, target.split(":")[0],
                         {"bare_host": target == "native", "boot_seconds": rng.random(),
                          **options.get(target, {})})
        for workload in workloads:
            name_, unit, hib = EVENTS if workload == "cpu" else MIB
            for i in range(reps):
                value = level * float(np.exp(rng.normal(0, noise)))
                store.add_rep(run_id, target=target, workload=workload,
                              params=(params or {}).get(workload, {"time": 1}),
                              phase="measure", idx=i, status="ok", argv=[], started=0.0,
                              metrics=[Metric(name_, value, unit, hib),
                                       Metric("total time", 1.0, "s", False)])
    store.finish_run(run_id, "done")
    return run_id


def series_of(results, name="nightly", worse_from=6, runs=12, factor=0.8):
    """runs runs of native and vm:tcg; from run worse_from + 1 on, vm:tcg runs with 1 vCPU
    instead of 2 at `factor` of its speed."""
    store = Store(results)
    ids = []
    for i in range(runs):
        changed = i >= worse_from
        levels = {"native": 1000, "vm:tcg": 200 * (factor if changed else 1)}
        ids.append(add_run(store, name, levels,
                           options={"vm:tcg": {"accel": "tcg", "vcpus": 1 if changed else 2}},
                           seed=i))
    return ids


def judged(results, name="nightly", **kwargs):
    store = Store(results, readonly=True)
    return history.judge(history.load(store, name, **kwargs), accepted=store.accepted(name))


def by_target(trend):
    return {s.target: s for s in trend.series}


def test_a_step_is_found_at_the_run_that_made_it_with_what_changed_there(tmp_path):
    ids = series_of(tmp_path)
    trend = judged(tmp_path)
    native, vm = by_target(trend)["native"], by_target(trend)["vm:tcg"]
    assert native.changes == [] and native.regression() is None
    [change] = vm.changes
    assert change.after.id == ids[6] and change.after.number == 7 and change.before.number == 6
    assert change.verdict == "worse"
    assert change.change.change == pytest.approx(-0.2, abs=0.02)
    assert change.change.ci[1] < 1 and change.change.p_adjusted <= 0.05
    # The option, once: the plan's request and the fingerprint agree; the boot time each
    # run measured, and the host's load, are no change.
    assert change.what_changed == ["vm:tcg vcpus: 2 → 1"]
    assert "from run 7" in vm.regression()


def test_the_terminal_output_fits_80_columns_and_names_the_change(tmp_path):
    series_of(tmp_path)
    result = vmtax("trend", "nightly", "--results", str(tmp_path), env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    text = result.stdout
    assert "nightly on rack1: 12 runs" in text
    assert "vm:tcg · cpu · events/s ↑" in text
    assert "what changed since run 6: vm:tcg vcpus: 2 → 1" in text
    assert text.count("no change") == 1          # native's series
    assert "▶ run 7 (" in text and ") worse: -20" in text


def test_fail_on_regression_until_the_change_is_accepted(tmp_path):
    ids = series_of(tmp_path, runs=6, worse_from=6)    # the six runs before the change
    assert vmtax("trend", "nightly", "--fail-on", "regression",
                 "--results", str(tmp_path)).returncode == 0
    store = Store(tmp_path)
    for i in range(6, 12):
        ids.append(add_run(store, "nightly", {"native": 1000, "vm:tcg": 160},
                           options={"vm:tcg": {"accel": "tcg", "vcpus": 1}}, seed=i))
    failing = vmtax("trend", "nightly", "--fail-on", "regression", "--results", str(tmp_path))
    assert failing.returncode == 1
    assert failing.stderr.strip().splitlines() == [
        "vmtax: 1 series regressed (--fail-on regression): vm:tcg · cpu · events/s -20.0% "
        f"from run 7 ({ids[6]}) on; if intended: vmtax trend nightly --accept RUN"] or \
        "1 series regressed" in failing.stderr
    accepted = vmtax("trend", "nightly", "--accept", ids[6], "--results", str(tmp_path),
                     env={"SUDO_USER": "alice"})
    assert accepted.returncode == 0 and "by alice" in accepted.stdout
    after = vmtax("trend", "nightly", "--fail-on", "regression", "--results", str(tmp_path))
    assert after.returncode == 0, after.stderr
    assert "accepted by alice" in after.stdout
    # Accepting a run before the change accepts nothing after it.
    fresh = tmp_path / "fresh"
    ids = series_of(fresh)
    vmtax("trend", "nightly", "--accept", ids[5], "--results", str(fresh), check=True)
    assert vmtax("trend", "nightly", "--fail-on", "regression",
                 "--results", str(fresh)).returncode == 1


def test_accept_refuses_a_run_of_another_name(tmp_path):
    series_of(tmp_path, runs=2)
    other = add_run(Store(tmp_path), "weekly", {"native": 1000})
    result = vmtax("trend", "nightly", "--accept", other, "--results", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr == (f"vmtax: error: --accept: run {other} is not a run of 'nightly' "
                             "(it is one of 'weekly')\n")


def test_the_newest_run_alone_is_judged_as_compare_judges_it(tmp_path):
    store = Store(tmp_path)
    for i in range(8):
        add_run(store, "nightly", {"native": 1000}, seed=i)
    newest = add_run(store, "nightly", {"native": 700}, seed=9)
    [s] = judged(tmp_path).series
    assert s.changes == []                   # one point: too soon to call a change
    assert s.recent.verdict == "worse"
    assert s.recent.comparison.change == pytest.approx(-0.3, abs=0.02)
    assert s.regression().startswith(f"-29.7% at run 9 ({newest}) against runs 1–8")
    result = vmtax("trend", "nightly", "--fail-on", "regression", "--results", str(tmp_path))
    assert result.returncode == 1
    assert "newest run 9 worse: -29.7%" in result.stdout and "against runs 1–8" in result.stdout


def test_a_newest_run_within_the_earlier_runs_own_spread_is_no_regression(tmp_path):
    # Each run is tight (1% noise) but runs differ by ±15% from night to night: pooled
    # repetitions call the newest -15% "worse"; the spread of the runs' medians does not.
    store = Store(tmp_path)
    for i, level in enumerate((1000, 1150, 880, 1100, 900, 1050, 950, 1120)):
        add_run(store, "nightly", {"native": level}, seed=i)
    add_run(store, "nightly", {"native": 860}, seed=9)
    [s] = judged(tmp_path).series
    assert s.recent.comparison.verdict == "worse" and s.recent.verdict == "no verdict"
    low, high = s.recent.spread
    assert low < -0.15 and high > 0.15 and s.recent.within_spread
    assert s.regression() is None
    result = vmtax("trend", "nightly", "--fail-on", "regression", "--results", str(tmp_path))
    assert result.returncode == 0, result.stdout
    assert "within those runs' own run-to-run spread" in result.stdout
    assert "no verdict" in result.stdout and "newest run 9 worse" not in result.stdout


def test_the_run_to_run_spread_needs_three_runs_before_the_newest(tmp_path):
    store = Store(tmp_path)
    for i, level in enumerate((1000, 1150)):
        add_run(store, "nightly", {"native": level}, seed=i)
    add_run(store, "nightly", {"native": 700}, seed=9)
    [s] = judged(tmp_path).series
    assert s.recent.spread is None and not s.recent.within_spread


def test_a_name_with_no_runs_lists_the_names_there_are(tmp_path):
    store = Store(tmp_path)
    add_run(store, "nightly", {"native": 1000})
    add_run(store, "weekly", {"native": 1000})
    result = vmtax("trend", "nighty", "--results", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr == (f"vmtax: error: no runs named 'nighty' in {tmp_path}/vmtax.sqlite; "
                             "the names there: nightly, weekly\n")


def test_too_few_runs_show_their_points_and_how_many_more_are_needed(tmp_path):
    series_of(tmp_path, runs=4, worse_from=2)
    trend = judged(tmp_path)
    vm = by_target(trend)["vm:tcg"]
    assert len(vm.points) == 4 and vm.detection.points_needed == 4 and vm.changes == []
    result = vmtax("trend", "nightly", "--results", str(tmp_path))
    assert "4 runs: up to 4 more before a change can be called" in result.stdout


def test_runs_whose_plans_differ_are_compared_where_they_overlap(tmp_path):
    store = Store(tmp_path)
    for i in range(8):
        workloads = ("cpu", "memory") if i % 2 else ("cpu",)
        add_run(store, "nightly", {"native": 1000}, seed=i, workloads=workloads)
    trend = judged(tmp_path)
    points = {s.workload: len(s.points) for s in trend.series}
    assert points == {"cpu": 8, "memory": 4}
    assert trend.notes == ["the runs of nightly on rack1 differ in what they ran (native · "
                           "memory in 4 of 8); each series is judged over the runs that have it"]


def test_what_changed_names_the_host_the_parameters_and_vmtax(tmp_path):
    store = Store(tmp_path)
    add_run(store, "nightly", {"native": 1000})
    add_run(store, "nightly", {"native": 1000}, host={**HOST, "kernel": "6.1.0-20-amd64",
                                                      "quiet": {"load": [3.0]}},
            params={"cpu": {"time": 1, "cpu-max-prime": 3000}}, version="0.2.0")
    add_run(store, "nightly", {"native": 1000}, host={**HOST, "kernel": "6.1.0-20-amd64"},
            params={"cpu": {"time": 1, "cpu-max-prime": 3000}}, version="0.2.0")
    [s] = history.load(Store(tmp_path), "nightly").series
    assert differences.what_changed(s.points[0], s.points[1], "native", "cpu") == [
        "host kernel: 6.1.0-18-amd64 → 6.1.0-20-amd64",
        "cpu cpu-max-prime: (none) → 3000",
        "vmtax 0.1.0 → 0.2.0"]
    assert differences.what_changed(s.points[1], s.points[2], "native", "cpu") == []


def test_a_kernel_command_line_change_shows_the_words_that_changed():
    base = "console=ttyS0 quiet panic=-1 vmtax.bus=mmio tsc=reliable no_timer_check"
    assert differences._change_text(base, base + " mitigations=off") == "+mitigations=off"


def test_fleet_hosts_are_series_of_their_own(tmp_path):
    store = Store(tmp_path)
    for i in range(3):
        for name in ("h1", "h2"):
            add_run(store, "nightly", {"native": 1000},
                    host={**HOST, "fleet": {"host": name, "id": f"f{i}"}}, seed=i)
    trend = judged(tmp_path)
    assert sorted(trend.runs) == ["h1", "h2"]
    assert [(s.host, len(s.points)) for s in trend.series] == [("h1", 3), ("h2", 3)]


def test_metric_target_and_since_narrow_the_series(tmp_path):
    ids = series_of(tmp_path, runs=6)
    store = Store(tmp_path, readonly=True)
    only = history.load(store, "nightly", targets=["vm:tcg"], metrics=["total time"])
    assert [(s.target, s.metric) for s in only.series] == [("vm:tcg", "total time")]
    since = history.load(store, "nightly", since=store.load_run(ids[3]).created)
    assert {len(s.points) for s in since.series} == {3}
    result = vmtax("trend", "nightly", "--metric", "nope", "--results", str(tmp_path))
    assert result.stderr == "vmtax: error: no series of 'nightly' has metric nope\n"


def test_json_has_every_point_and_change(tmp_path):
    series_of(tmp_path)
    result = vmtax("trend", "nightly", "--json", "--results", str(tmp_path), check=True)
    data = json.loads(result.stdout)
    vm = next(s for s in data["series"] if s["target"] == "vm:tcg")
    assert len(vm["points"]) == 12 and len(vm["points"][0]["values"]) == 3
    [change] = vm["changes"]
    assert change["after_run"]["number"] == 7 and change["what_changed"] == ["vm:tcg vcpus: 2 → 1"]
    assert change["ci"][0] < change["change"] < change["ci"][1] < 0


def test_otava_csv_has_a_time_column_and_one_column_per_series(tmp_path):
    ids = series_of(tmp_path, runs=4)
    result = vmtax("export", "nightly", "--format", "otava", "--results", str(tmp_path),
                   check=True)
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows[0] == ["time", "run", "host", "native.cpu.events/s", "vm:tcg.cpu.events/s"]
    assert [r[1] for r in rows[1:]] == ids
    assert rows[1][0].endswith("+00:00") and float(rows[1][4]) == pytest.approx(200, rel=0.05)


def test_the_html_page_draws_each_series_with_its_changes_and_fetches_nothing(tmp_path):
    series_of(tmp_path)
    page = tmp_path / "trend.html"
    result = vmtax("trend", "nightly", "--html", str(page), "--results", str(tmp_path))
    assert result.returncode == 0, result.stderr
    html = page.read_text()
    assert html.count("<svg") == 2 and html.count('class="change"') == 1
    assert html.count("<circle") == 24                  # one per run of each series
    assert "<li>vm:tcg vcpus: 2 → 1</li>" in html and "run 7 worse:" in html
    assert "http" not in html and "src=" not in html    # nothing from elsewhere


def test_publish_writes_a_site_that_links_only_to_itself(tmp_path):
    ids = series_of(tmp_path / "results", runs=10, worse_from=5, factor=0.5)
    site = tmp_path / "site"
    result = vmtax("publish", "nightly", str(site), "--results", str(tmp_path / "results"))
    assert result.returncode == 0, result.stderr
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))
    change = f"changes/{ids[4]}--{ids[5]}.html"
    assert pages == sorted(["index.html", "trends/nightly.html", change,
                            *(f"runs/{i}.html" for i in ids)])
    index = (site / "index.html").read_text()
    assert f'href="{change}"' in index and 'href="trends/nightly.html"' in index
    assert f'href="../{change}"' in (site / "trends" / "nightly.html").read_text()
    for page in site.rglob("*.html"):
        text = page.read_text()
        assert "http://" not in text and "https://" not in text, page
    # Figures only on the pages of the runs either side of the change and of the newest run;
    # the others say how to get theirs.
    drawn = {ids[4], ids[5], ids[-1]}
    for i in ids:
        text = (site / "runs" / f"{i}.html").read_text()
        assert ("<h3>Figures</h3>" in text) == (i in drawn), i
        assert (f"<code>vmtax report {i} --html" in text) == (i not in drawn), i


def test_publish_again_draws_the_figures_of_a_run_a_new_change_point_singles_out(tmp_path):
    # Two runs after the step are too few to call it: the first site has no change.
    ids = series_of(tmp_path / "results", runs=7, worse_from=5, factor=0.5)
    site = tmp_path / "site"
    args = ("--results", str(tmp_path / "results"))
    assert vmtax("publish", "nightly", str(site), *args).returncode == 0
    assert not list((site / "changes").iterdir())
    assert "<h3>Figures</h3>" not in (site / "runs" / f"{ids[4]}.html").read_text()
    store = Store(tmp_path / "results")
    for i in range(7, 10):
        add_run(store, "nightly", {"native": 1000, "vm:tcg": 100},
                options={"vm:tcg": {"accel": "tcg", "vcpus": 1}}, seed=i)
    store.close()
    assert vmtax("publish", "nightly", str(site), *args).returncode == 0
    assert "<h3>Figures</h3>" in (site / "runs" / f"{ids[4]}.html").read_text()


def test_a_step_stays_a_failure_until_it_is_accepted_and_json_agrees(tmp_path):
    """Issue 48.1: 8 runs of a name, vm:tcg 4x slower from run 5 on (native unchanged).
    Detection cannot call the step before run 8 (and across two series not even then),
    so the newest-run rule holds it: runs 5 on against runs 1-4, their spread from runs
    1-4 alone. The gate fails on runs 5, 6, 7 and 8, names the run to accept, and passes
    once it is accepted; --json says what the text and the gate say."""
    store = Store(tmp_path)
    ids = []
    for i in range(8):
        ids.append(add_run(store, "nightly", {"native": 1000, "vm:tcg": 1000 if i < 4 else 250},
                           seed=i))
        if i < 3:
            continue
        gate = vmtax("trend", "nightly", "--fail-on", "regression", "--results", str(tmp_path))
        shown = json.loads(json.dumps(history.to_json(judged(tmp_path)), default=str))
        vm = next(s for s in shown["series"] if s["target"] == "vm:tcg")
        if i < 4:
            assert gate.returncode == 0, gate.stderr
            assert vm["regression"] is None
            continue
        assert gate.returncode == 1, (i, gate.stdout)
        assert f"--accept {ids[4]}" in gate.stderr            # the run, not "RUN"
        assert vm["regressed_from"]["id"] == ids[4] and vm["regression"]
        newest = vm["newest"]
        assert newest["verdict"] == "worse" and not newest["within_run_to_run_spread"]
        assert [r["number"] for r in newest["runs"]] == list(range(5, i + 2))
        assert [r["number"] for r in newest["against_runs"]] == [1, 2, 3, 4]
        low, high = newest["run_to_run_spread"]
        assert -0.1 < low and high < 0.1                       # runs 1-4's, not the drop's
        text = gate.stdout
        assert (f"runs 5–{i + 1} worse: -75" if i > 4 else "newest run 5 worse: -75") in text
        assert "no verdict" not in text
    accepted = vmtax("trend", "nightly", "--accept", ids[4], "--results", str(tmp_path))
    assert accepted.returncode == 0, accepted.stderr
    after = vmtax("trend", "nightly", "--fail-on", "regression", "--results", str(tmp_path))
    assert after.returncode == 0, after.stderr
    assert "accepted by" in after.stdout and "as it is from run 5 on" in after.stdout
    shown = json.loads(vmtax("trend", "nightly", "--json", "--results", str(tmp_path),
                             check=True).stdout)
    assert all(s["regression"] is None and (s["newest"] or {}).get("verdict") != "worse"
               for s in shown["series"])
    # As it was at run 7, before the acceptance: failing.
    assert vmtax("trend", "nightly", "--until", ids[6], "--fail-on", "regression",
                 "--results", str(tmp_path)).returncode == 1


def test_a_held_step_that_recovers_passes_and_a_spike_is_not_held(tmp_path):
    store = Store(tmp_path)
    for i, level in enumerate((1000, 1010, 990, 1000, 250, 250, 1000)):
        add_run(store, "nightly", {"native": level}, seed=i)
    [s] = judged(tmp_path).series
    assert s.regression() is None and not s.recent.held
    assert [p.run.number for p in s.recent.against] == [1, 2, 3, 4, 5, 6]


def test_a_drop_is_judged_against_the_runs_before_it_never_with_it(tmp_path):
    """The second series of issue 48.1: a -23% step at run 13 of 24 on a host whose runs
    wander ~2% from night to night. Each run from 13 on fails until a change point is
    called there, which then fails; the spread is never the drop's own."""
    rng = np.random.default_rng(3)
    store = Store(tmp_path)
    for i in range(24):
        level = (1000 if i < 12 else 770) * float(np.exp(rng.normal(0, 0.02)))
        add_run(store, "nightly", {"native": level}, seed=i)
        if i >= 12:
            [s] = judged(tmp_path).series
            assert s.regression() is not None, i
            if s.recent is not None and s.recent.held:
                assert max(p.run.number for p in s.recent.against) <= 12
                assert s.recent.spread[0] > -0.15 and s.recent.spread[1] < 0.15


def test_no_trend_promises_a_change_its_test_cannot_call(tmp_path):
    """Issue 48.2: 3 runs on each side of a clean step: the rank test's smallest p is 0.1,
    so no change can be called at α=0.05; the trend says how many more runs it needs, and
    states the promise its test keeps."""
    store = Store(tmp_path)
    for i in range(6):
        add_run(store, "nightly", {"native": 1000 if i < 3 else 500}, seed=i)
    [s] = judged(tmp_path).series
    assert s.changes == [] and s.detection.points_needed == 2
    text = vmtax("trend", "nightly", "--results", str(tmp_path), check=True).stdout
    assert "6 runs: up to 2 more before a change can be called" in text
    assert "once it has 5 runs on each side" in text and "3 runs on each side" not in text


def test_a_run_id_is_never_read_as_a_date_and_keeps_its_number(tmp_path):
    """Issue 48.5: 20261201-230955-2105 ends in digits that ISO 8601's basic format reads as
    a UTC offset (23:09:55-21:05): --until then took the whole series, --since no run.
    And 48.16: --since renumbered the runs it kept from 1."""
    store = Store(tmp_path)
    ids = [add_run(store, "nightly", {"native": 1000}, seed=i) for i in range(5)]
    like_a_date = "20261201-230955-2105"
    store.db.execute("UPDATE runs SET id = ? WHERE id = ?", (like_a_date, ids[2]))
    for table in ("targets", "reps", "points"):
        store.db.execute(f"UPDATE {table} SET run_id = ? WHERE run_id = ?",
                         (like_a_date, ids[2]))
    store.db.commit()
    until = json.loads(vmtax("trend", "nightly", "--until", like_a_date, "--json",
                             "--results", str(tmp_path), check=True).stdout)
    assert [r["number"] for r in until["hosts"]["rack1"]] == [1, 2, 3]
    since = json.loads(vmtax("trend", "nightly", "--since", like_a_date, "--json",
                             "--results", str(tmp_path), check=True).stdout)
    assert [r["number"] for r in since["hosts"]["rack1"]] == [3, 4, 5]
    assert [p["number"] for p in since["series"][0]["points"]] == [3, 4, 5]


def test_accept_says_what_it_covers_and_when_nothing_had_regressed(tmp_path):
    ids = series_of(tmp_path, runs=4)
    quiet = vmtax("trend", "nightly", "--accept", ids[-1], "--results", str(tmp_path),
                  check=True)
    assert "nothing of it had regressed up to that run" in quiet.stdout
    store = Store(tmp_path)
    ids.append(add_run(store, "nightly", {"native": 1000, "vm:tcg": 50}, seed=9))
    covering = vmtax("trend", "nightly", "--accept", ids[-1], "--results", str(tmp_path),
                     check=True)
    assert "1 series that regressed (vm:tcg · cpu · events/s)" in covering.stdout


def test_otava_takes_a_run_of_the_name_and_writes_no_float_noise(tmp_path):
    store = Store(tmp_path)
    for i in range(3):
        add_run(store, "nightly", {"native": 24756.06}, seed=i, reps=2, noise=0)
    result = vmtax("export", "last", "--format", "otava", "--results", str(tmp_path),
                   check=True)
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert [r[3] for r in rows[1:]] == ["24756.06"] * 3


def test_every_view_names_what_the_plans_changed_and_from_which_run(tmp_path):
    """Issue 48.3: a workload parameter and a target option changed part-way, before any
    change point: the text, --json, the HTML page, publish's index and the Otava export
    each name what differs and from which run."""
    results = tmp_path / "results"
    store = Store(results)
    ids = [add_run(store, "nightly", {"native": 1000, "vm:tcg": 200}, seed=i,
                   params={"cpu": {"time": 1, "cpu-max-prime": 2000 if i < 3 else 20000}},
                   options={"vm:tcg": {"vcpus": 2 if i < 4 else 1}}) for i in range(5)]
    store.close()
    said = [f"from run 4 ({ids[3]}) on, cpu cpu-max-prime: 2000 → 20000 (2 series)",
            f"from run 5 ({ids[4]}) on, vm:tcg vcpus: 2 → 1"]
    args = ("--results", str(results))
    text = vmtax("trend", "nightly", *args, env={"COLUMNS": "300"}, check=True).stdout
    shown = json.loads(vmtax("trend", "nightly", "--json", *args, check=True).stdout)
    vmtax("trend", "nightly", "--html", str(tmp_path / "t.html"), *args, check=True)
    vmtax("publish", "nightly", str(tmp_path / "site"), *args, check=True)
    otava = vmtax("export", "nightly", "--format", "otava", *args, check=True)
    for view in (text, " ".join(shown["notes"]), (tmp_path / "t.html").read_text(),
                 (tmp_path / "site" / "index.html").read_text(), otava.stderr):
        for line in said:
            assert line in view, view
    vm = next(s for s in shown["series"] if s["target"] == "vm:tcg")
    assert [(c["run"]["number"], c["what"]) for c in vm["plan_changes"]] == [
        (4, ["cpu cpu-max-prime: 2000 → 20000"]), (5, ["vm:tcg vcpus: 2 → 1"])]


def test_a_change_page_compares_the_segments_as_the_trend_does(tmp_path):
    """Issue 48.6: the change page compared run 13 with run 12 alone (-41.7%, run 12 being
    the highest before the change) where the trend said -23.4%. It now shows the trend's
    segments, their effect, and what changed; 48.16: and says so on the index."""
    results = tmp_path / "results"
    store = Store(results)
    levels = [1000, 990, 1010, 1000, 995, 1005, 1300] + [770] * 6
    ids = [add_run(store, "nightly", {"native": level}, seed=i,
                   options={"native": {"note": "a" if i < 7 else "b"}})
           for i, level in enumerate(levels)]
    store.close()
    trend = judged(results)
    [change] = trend.series[0].changes
    site = tmp_path / "site"
    vmtax("publish", "nightly", str(site), "--results", str(results), check=True)
    page = (site / "changes" / f"{ids[6]}--{ids[7]}.html").read_text()
    said = f"{change.change.change:+.1%}"
    assert f"worse {said}" in page and "runs 1–7" in page and "runs 8–13" in page
    run_against_run = f"{770 / 1300 - 1:+.1%}"
    assert run_against_run not in page
    assert "What changed since run 7" in page and "native note: a → b" in page
    index = (site / "index.html").read_text()
    assert f"run 8 worse {said}, not accepted" in index


def test_publish_and_trend_pages_read_as_a_published_site_should(tmp_path):
    """Issue 48.16 and 48.11: the index labels host, target, workload and metric and dates
    each run with its status; trend charts label their runs and values with the unit; no
    "over 1 tests" or "1 more pages"; a run page's command carries --results."""
    results = tmp_path / "results"
    ids = series_of(results, runs=8, worse_from=8)
    site = tmp_path / "site"
    published = vmtax("publish", "nightly", str(site), "--results", str(results), check=True)
    assert re.search(r"and \d+ more pages\n", published.stdout)
    index = (site / "index.html").read_text()
    for head in ("<th>host</th>", "<th>target</th>", "<th>workload</th>", "<th>metric</th>",
                 "<th>started</th>", "<th>status</th>"):
        assert head in index
    assert "<td>done</td>" in index and "rack1 · " not in index
    trend = (site / "trends" / "nightly.html").read_text()
    assert trend.count('class="run-tick"') >= 2 * 8 and "events/s</text>" in trend
    assert len(re.findall(r'text-anchor="end">[\d,.]+</text>', trend)) >= 2 * 3
    assert "over 1 tests" not in trend
    run_page = (site / "runs" / f"{ids[2]}.html").read_text()
    assert f"vmtax report {ids[2]} --html report.html --results {results}" in run_page
    one = tmp_path / "one"
    for i in range(6):
        add_run(Store(one), "solo", {"native": 1000}, seed=i)
    vmtax("trend", "solo", "--results", str(one), "--html", str(tmp_path / "solo.html"),
          check=True)
    solo = (tmp_path / "solo.html").read_text()
    assert "over 1 test," in solo and "over 1 tests" not in solo


def test_what_changed_names_a_rebuilt_program_at_the_same_path_and_version(tmp_path):
    """Issue 48.4: E1's part two rebuilds QEMU over the stock one, same path and version;
    so can a kernel or a workload binary be. What changed names what differs by content."""
    store = Store(tmp_path)
    for sha, qemu in (("aaaa", "1111"), ("bbbb", "2222")):
        add_run(store, "nightly", {"vm:tcg": 200},
                options={"vm:tcg": {"qemu": "/usr/bin/qemu-system-x86_64",
                                    "qemu_version": "QEMU emulator version 7.2.19",
                                    "qemu_sha256": qemu, "kernel_sha256": "k1",
                                    "programs": {"sysbench": sha}}})
    [s] = history.load(Store(tmp_path), "nightly").series
    assert differences.what_changed(s.points[0], s.points[1], "vm:tcg", "cpu") == [
        "vm:tcg qemu_sha256: 1111 → 2222", "vm:tcg programs.sysbench: aaaa → bbbb"]


def test_what_more_runs_need_is_worked_out_only_for_a_verdict_that_says_it(tmp_path,
                                                                          monkeypatch):
    """Which more runs would let detection call the newest runs' step costs up to a second
    a series (a test per count of more runs): a trend worked it out for every series, said
    or not; now only when its text asks. Beside the 5 runs before a step the test calls it
    with 2 more; beside 3, within HELD_AT_MOST more never, which the text says so."""
    from vmtax.analysis import changepoint
    from vmtax.report.parts import recent_status

    tested = []
    calls = changepoint.calls
    monkeypatch.setattr(changepoint, "calls", lambda *a, **k: tested.append(a) or calls(*a, **k))
    store = Store(tmp_path)
    for i in range(8):
        add_run(store, "nightly", {"native": 1000}, seed=i)
    [s] = judged(tmp_path).series
    assert s.recent is not None and tested == []
    assert history.Recent(s.recent.judged[:1] * 3, [], None, None, 5).more_runs == 2
    never = history.Recent(s.recent.judged[:1] * 3, [], None, None, 3)
    assert never.more_runs is None
    assert recent_status(never) == (f"no change point there within {history.HELD_AT_MOST} "
                                    "more runs like these")
