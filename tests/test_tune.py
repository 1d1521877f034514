"""`vmtax tune` (issue #27): knob declarations, the racing rule, the adjusted verdicts, the
control, the budget, resume and bad input; no target is started here (see
test_tune_live.py)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest

from vmtax.analysis.model import analyse
from vmtax.analysis import stats
from vmtax.analysis import tune as tuning
from vmtax.core import plugin
from vmtax.core import target as targets
from vmtax.core.errors import VmtaxError
from vmtax.core.types import Metric
from vmtax.guest.qemu import VmConfig, qemu_argv
from vmtax.results.store import Store
from vmtax.studies import tune as search_mod
from vmtax.studies import tune_run as racing


def noisy(rng, centre: float, n: int, cv: float = 0.01) -> list[float]:
    return list(centre * np.exp(rng.normal(0, cv, n)))


# --- declarations ----------------------------------------------------------------------------

def test_every_declared_knob_value_passes_its_own_check():
    found = 0
    for cls in targets.kinds().values():
        for info in plugin.option_infos(cls.Options).values():
            for value in info.tune:
                info.check(value, strict=False)   # raises plugin.Invalid on a typo
                found += 1
    assert found >= 15


def test_vm_declares_the_knobs_the_issue_asks_for():
    knobs = search_mod.declared("vm")
    for key in ("machine", "cpu", "vcpus", "pin", "hugepages", "disk_cache", "disk_aio",
                "iothread", "network", "vhost", "kernel_args", "tb_size", "tcg_thread"):
        assert key in knobs, key
    assert knobs["disk_cache"].safety("unsafe")
    assert knobs["kernel_args"].safety("mitigations=off")
    assert knobs["kernel_args"].safety("clocksource=tsc") is None
    assert "io_uring" in knobs["disk_aio"].tune


def test_option_json_lists_knob_values_with_safety():
    described = {o["name"]: o for o in targets.get("vm").options_json()}
    assert {"value": "unsafe", "safety": knob_safety("unsafe")} in described["disk_cache"]["tune"]
    assert "tune" not in described["memory"]


def knob_safety(value):
    return search_mod.declared("vm")["disk_cache"].safety(value)


# --- QEMU's argv for the new vm options --------------------------------------------------------

def cfg(**changes) -> VmConfig:
    base = VmConfig(qemu="/q", accel="tcg", machine="microvm", cpu="max", vcpus=2,
                    memory="1G", kernel=Path("/k"), initramfs=Path("/i"), append="",
                    agent_socket=Path("/a"), qmp_socket=Path("/m"), console_log=Path("/c"),
                    disk=Path("/d"), disk_cache="none")
    return dataclasses.replace(base, **changes)


def test_argv_tcg_thread_and_tb_size():
    argv = qemu_argv(cfg(tcg_thread="single", tb_size=64))
    assert argv[argv.index("-accel") + 1] == "tcg,thread=single,tb-size=64"
    assert qemu_argv(cfg())[qemu_argv(cfg()).index("-accel") + 1] == "tcg,thread=multi"
    argv = qemu_argv(cfg(icount="shift=0", tb_size=256))
    assert argv[argv.index("-accel") + 1] == "tcg,tb-size=256"


def test_argv_disk_aio_cache_and_iothread():
    argv = qemu_argv(cfg(accel="kvm", disk_aio="io_uring", disk_cache="unsafe", iothread=True))
    drive = argv[argv.index("-drive") + 1]
    assert drive.endswith("cache=unsafe,aio=io_uring")
    assert argv[argv.index("-object") + 1] == "iothread,id=iothread0"
    assert "virtio-blk-device,drive=scratch,iothread=iothread0" in argv
    plain = qemu_argv(cfg())
    assert "aio=" not in " ".join(plain) and "iothread" not in " ".join(plain)


def test_vm_options_reach_the_configuration(tmp_path, monkeypatch):
    from vmtax.targets import vm

    with pytest.raises(VmtaxError, match='disk_aio: expected "threads" or "io_uring" with '
                                         'disk_cache = "unsafe"'):
        plugin.build(vm.VmOptions, {"disk_cache": "unsafe", "disk_aio": "native"}, "vm")
    opts = plugin.build(vm.VmOptions, {"accel": "tcg", "disk_cache": "writeback",
                                       "tb_size": 64, "tcg_thread": "single"}, "vm")

    class Image:
        kernel_arg = "debian"

        def kernel(self): return Path("/k")
        def initramfs(self): return Path("/i")

    target = vm.VmTarget("vm", opts, targets.TargetContext(work_dir=tmp_path, journal=None))
    monkeypatch.setattr(target, "image", lambda: Image(), raising=False)
    monkeypatch.setattr(target, "_cmdline", lambda image, accel: "", raising=False)
    config = target.resolve(tmp_path, tmp_path / "d", "none")
    assert (config.disk_cache, config.tcg_thread, config.tb_size) == ("writeback", "single", 64)


def test_iothread_needs_kvm():
    from vmtax.targets import vm

    with pytest.raises(VmtaxError, match="iothread: expected false under TCG"):
        plugin.build(vm.VmOptions, {"accel": "tcg", "iothread": True}, "vm")


def test_io_uring_missing_is_a_host_problem(monkeypatch):
    from vmtax.targets import vm

    monkeypatch.setattr(vm, "io_uring_problem", lambda qemu: "built without io_uring")
    with pytest.raises(VmtaxError, match="disk_aio: expected .*built without io_uring"):
        plugin.build(vm.VmOptions, {"disk_aio": "io_uring"}, "vm")


# --- the racing rule ---------------------------------------------------------------------------

RULE = tuning.RaceRule(alpha=0.01, noise_floor=0.02, tests=4, min_runs=3)


def test_race_state_needs_min_runs():
    assert RULE.state([100, 101], [150, 151], True) == "open"


def test_race_state_better_worse_and_no_gain():
    rng = np.random.default_rng(1)
    base = noisy(rng, 100, 8)
    assert RULE.state(base, noisy(rng, 120, 8), True) == "better"
    assert RULE.state(base, noisy(rng, 80, 8), True) == "worse"
    assert RULE.state(base, noisy(rng, 100, 8, cv=0.002), True) == "no gain"
    # A time: lower is better.
    assert RULE.state(base, noisy(rng, 80, 8), False) == "better"


def test_race_state_stays_open_while_unclear():
    # A 3% gain in 3% noise at 3 runs a side: neither called nor excluded.
    assert RULE.state([100, 97, 103], [103, 100, 106], True) == "open"


def test_race_gives_runs_only_to_open_pairs():
    rng = np.random.default_rng(2)
    truth = {"base": 100.0, "control": 100.0, "bad": 70.0, "open": 103.0}
    values = {name: noisy(rng, centre, 3, 0.02) for name, centre in truth.items()}
    counts = dict.fromkeys(truth, 0)

    def measure(name):
        counts[name] += 1
        return noisy(rng, truth[name], 1, 0.02)[0]

    pairs = [("base", n) for n in ("control", "bad", "open")]
    states = tuning.race(values, pairs, True, RULE, measure, max_runs=12,
                         time_left=lambda: True)
    assert states[("base", "bad")] == "worse"
    assert counts["bad"] == 0            # decided at the fixed runs: no more for it
    assert counts["base"] >= counts["open"] > 0
    assert all(len(v) <= 12 for v in values.values())


def test_race_stops_when_time_is_out_and_counts_failures():
    calls = []
    values = {"a": [1.0, 1.1, 0.9], "b": [1.0, 1.2, 0.8]}
    tuning.race(values, [("a", "b")], True, RULE, lambda n: calls.append(n), 10,
                time_left=lambda: False)
    assert calls == []
    tuning.race(values, [("a", "b")], True, RULE, lambda n: calls.append(n), 5,
                time_left=lambda: True)
    assert len(calls) == 4               # failed (None) repetitions count as attempts


# --- adjusted verdicts, the control ------------------------------------------------------------

def test_judge_adjusts_over_every_comparison():
    rng = np.random.default_rng(3)
    base = noisy(rng, 100, 6)
    cand = noisy(rng, 103, 6)
    alone = tuning.judge([("x", base, cand, True)], alpha=0.05)[0]
    nulls = [(f"n{i}", base, noisy(rng, 100, 6), True) for i in range(30)]
    together = tuning.judge([("x", base, cand, True), *nulls], alpha=0.05)[0]
    assert together.p_adjusted > alone.p_adjusted
    holm = tuning.judge([("x", base, cand, True), *nulls], alpha=0.05, method="holm")[0]
    bh = tuning.judge([("x", base, cand, True), *nulls], alpha=0.05, method="bh")[0]
    assert holm.p_adjusted >= bh.p_adjusted


def test_a_stopped_candidate_is_judged_against_its_own_rounds():
    reference = [(1, 10.0), (2, 11.0), (3, 12.0), (4, 13.0), (5, 14.0)]
    assert tuning.matched(reference, [(1, 5.0), (3, 6.0)]) == ([10.0, 11.0, 12.0], [5.0, 6.0])
    assert tuning.matched(reference, []) == ([10.0, 11.0, 12.0, 13.0, 14.0], [])


def test_judge_without_data_says_too_few_runs():
    judged = tuning.judge([("x", [1.0], [2.0, 3.0], True)])
    assert judged[0].verdict == "too few runs" and not judged[0].significant


def synthetic_search(seed: int, planted: float, knobs: int = 4) -> dict[str, stats.Comparison]:
    rng = np.random.default_rng(seed)
    truth = {"base": 100.0, "control": 100.0, "planted": 100.0 * (1 + planted),
             **{f"null{i}": 100.0 for i in range(knobs - 2)}}
    values = {name: noisy(rng, centre, 3) for name, centre in truth.items()}
    pairs = [("base", n) for n in truth if n != "base"]
    rule = tuning.RaceRule(tests=len(pairs))
    tuning.race(values, pairs, True, rule, lambda n: noisy(rng, truth[n], 1)[0], 15,
                lambda: True)
    judged = tuning.judge([(b, *tuning.matched(list(enumerate(values[a])),
                                                list(enumerate(values[b]))), True)
                           for a, b in pairs])
    return {c.name: c for c in judged}


def test_planted_effect_found_and_control_quiet_over_20_searches():
    found = alarms = 0
    for seed in range(20):
        result = synthetic_search(seed, 0.05)
        found += result["planted"].verdict == "better"
        alarms += result["control"].significant
    assert found >= 18
    assert alarms <= 1


# --- summarizing a stored search ----------------------------------------------------------------

def store_search(store: Store, samples: dict[str, list[float]], options: dict[str, dict],
                 name: str = "tune-test-singles", baseline: str = "vm",
                 runs: int | None = None) -> str:
    plan = {"targets": [{"name": n, "kind": "vm" if n != "native" else "native",
                         "options": o} for n, o in options.items()],
            "workloads": [{"name": "cpu", "params": {}}], "baseline": baseline, "name": name,
            **({"runs": runs} if runs is not None else {})}
    run_id = store.new_run(plan, {}, "test")
    for target, values in samples.items():
        for i, value in enumerate(values):
            store.add_rep(run_id, target=target, workload="cpu", params={"time": 1},
                          phase="measure", idx=i, status="ok", argv=["x"], started=time.time(),
                          metrics=[Metric("events/s", value, "events/s", True)])
    store.finish_run(run_id, "done")
    return run_id


def test_summarize_ranks_knobs_and_names_the_control(tmp_path):
    rng = np.random.default_rng(4)
    store = Store(tmp_path)
    base = {"accel": "tcg"}
    run_id = store_search(store, {
        "vm": noisy(rng, 100, 8), "vm[control]": noisy(rng, 100, 8),
        "vm[vcpus=1]": noisy(rng, 90, 8), "vm[machine=q35]": noisy(rng, 112, 8)},
        {"vm": base, "vm[control]": base, "vm[vcpus=1]": {**base, "vcpus": 1},
         "vm[machine=q35]": {**base, "machine": "q35"}})
    summary = tuning.summarize(store.load_run(run_id))
    assert [k.label for k in summary.knobs] == ["machine=q35", "vcpus=1", "control"]
    assert summary.knobs[0].effects[0].comparison.verdict == "better"
    assert summary.knobs[0].effects[0].group == "CPU"
    assert summary.knobs[1].effects[0].comparison.verdict == "worse"
    assert not summary.control_alarm
    data = summary.to_json()
    assert data["control"]["significant"] is False
    assert "stayed ~" in data["control"]["note"]
    assert {k["label"]: k["effects"][0]["verdict"] for k in data["knobs"]} == {
        "machine=q35": "better", "vcpus=1": "worse"}
    assert [k.label for k in summary.winners()] == ["machine=q35"]
    json.dumps(data)


def test_combined_stage_tax_recovered_and_snippet(tmp_path):
    rng = np.random.default_rng(5)
    store = Store(tmp_path)
    base = {"accel": "tcg"}
    singles = store_search(store, {
        "vm": noisy(rng, 100, 8), "vm[control]": noisy(rng, 100, 8),
        "vm[disk_cache=unsafe]": noisy(rng, 110, 8), "vm[machine=q35]": noisy(rng, 110, 8)},
        {"vm": base, "vm[control]": base, "vm[disk_cache=unsafe]": {**base,
                                                                      "disk_cache": "unsafe"},
         "vm[machine=q35]": {**base, "machine": "q35"}})
    tuned = {**base, "disk_cache": "unsafe", "machine": "q35"}
    combined = store_search(store, {
        "vm": noisy(rng, 100, 8), "vm[tuned]": noisy(rng, 150, 8),
        "vm[disk_cache=unsafe]": noisy(rng, 110, 8), "native": noisy(rng, 200, 8)},
        {"vm": base, "vm[tuned]": tuned, "vm[disk_cache=unsafe]": {**base,
                                                                      "disk_cache": "unsafe"},
         "native": {}}, name="tune-test-combined")
    summary = tuning.summarize(store.load_run(singles), store.load_run(combined))
    assert summary.confirmed
    assert summary.tuned == {"disk_cache": "unsafe", "machine": "q35"}
    assert summary.tax_recovered["CPU"] == pytest.approx(0.5, abs=0.05)
    assert summary.interactions and "interact" in summary.interactions[0]
    snippet = summary.recommended()
    assert 'disk_cache = "unsafe"   # safety: ' in snippet
    assert 'machine = "q35"   # tuned' in snippet


def test_forest_plot_and_tax_recovered_in_the_report(tmp_path):
    from vmtax.report import html, plots

    rng = np.random.default_rng(6)
    store = Store(tmp_path)
    base = {"accel": "tcg"}
    singles = store_search(store, {"vm": noisy(rng, 100, 6), "vm[control]": noisy(rng, 100, 6),
                                   "vm[machine=q35]": noisy(rng, 110, 6)},
                           {"vm": base, "vm[control]": base,
                            "vm[machine=q35]": {**base, "machine": "q35"}})
    charts = plots.tune_forest(analyse(store.load_run(singles)).tune, {})
    assert [c.slug for c in charts] == ["tune-forest"]
    assert "stayed ~" in charts[0].caption
    assert plots.render(charts[0], "svg").startswith(b"<?xml")
    combined = store_search(store, {"vm": noisy(rng, 100, 6), "vm[tuned]": noisy(rng, 110, 6),
                                    "native": noisy(rng, 120, 6)},
                            {"vm": base, "vm[tuned]": {**base, "machine": "q35"}, "native": {}},
                            name="tune-test-combined")
    charts = plots.tune_forest(analyse(store.load_run(combined)).tune, {})
    assert [c.slug for c in charts] == ["tune-forest", "tune-tax-recovered"]
    page = html.render_html([html.build(analyse(store.load_run(combined)))])
    assert "tune: tax recovered per class" in page and "Tax recovered by the combination" in page
    plain = analyse(store.load_run(store_search(store, {"vm": [1.0, 2.0]}, {"vm": base},
                                                name="plain")))
    assert plain.tune is None and plots.tune_forest(plain.tune, {}) == []


def test_tax_recovered_in_either_direction():
    assert tuning.tax_recovered(100, 150, 200) == 0.5       # a rate
    assert tuning.tax_recovered(2.0, 1.5, 1.0) == 0.5       # a time
    assert tuning.tax_recovered(100, 90, 100) is None       # no tax to recover


# --- the budget, bad input, plan files ---------------------------------------------------------

def test_parse_budget():
    assert search_mod.parse_budget("30m") == 1800
    assert search_mod.parse_budget("90s") == 90
    assert search_mod.parse_budget("1.5h") == 5400
    for bad in ("30", "0m", "-1m", "m", "3 days"):
        with pytest.raises(ValueError):
            search_mod.parse_budget(bad)


def test_bad_knobs_refused_one_line_each():
    with pytest.raises(VmtaxError) as err:
        search_mod.from_names(["vm:tcg"], ["cpu"], ["machine", "bogus", "vcpus=x",
                                                    "pin=0,4096"], "30m")
    lines = str(err.value).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("--knobs: expected a knob of vm (vcpus, ")
    assert lines[0].endswith('got "bogus"')
    assert lines[1] == '--knobs: vcpus: expected a whole number from 1 to 1000000000, got "x"'
    assert lines[2].startswith("--knobs: pin: expected distinct host CPUs")


def test_knob_the_host_cannot_satisfy(monkeypatch):
    from vmtax.targets import vm

    monkeypatch.setattr(vm, "io_uring_problem", lambda qemu: "no liburing in this QEMU")
    with pytest.raises(VmtaxError, match=r"^--knobs: disk_aio=io_uring: this host cannot run "
                                         r"it: .*no liburing"):
        search_mod.from_names(["vm:tcg"], ["cpu"], ["disk_aio=io_uring"], "30m")
    # Asked for all knobs, an impossible value is left out, with a note.
    search = search_mod.from_names(["vm:tcg"], ["cpu"], None, "3h")
    assert "disk_aio=io_uring" not in [k.label for k in search.knobs]
    assert any(n.startswith("disk_aio=io_uring left out") for n in search.notes)


def test_budget_too_small_for_one_comparison_each():
    with pytest.raises(VmtaxError, match=r"^--budget: expected a budget of at least .* for "
                                         r"one comparison of each of the 3 knob values"):
        search_mod.from_names(["vm:tcg"], ["cpu"], ["machine", "vcpus"], "1m")
    search = search_mod.from_names(["vm:tcg"], ["cpu"], ["machine", "vcpus"], "6m")
    assert [k.label for k in search.knobs] == ["machine=q35", "vcpus=1", "vcpus=4"]
    singles, combined = search.minimum_seconds()
    assert singles + combined < 360


def test_baseline_value_is_no_candidate():
    search = search_mod.from_names(["vm:tcg"], ["cpu"], ["machine=q35", "machine=microvm"],
                                   "30m")
    assert [k.label for k in search.knobs] == ["machine=q35"]
    assert any("baseline's own value" in n for n in search.notes)


def test_plan_file_errors_at_their_lines(tmp_path):
    plan = tmp_path / "tune.toml"
    plan.write_text('time = 1\n\n[targets.tcg]\nkind = "vm"\naccel = "tcg"\n\n'
                    '[[workloads]]\nname = "cpu"\n\n[tune]\nknobs = [\n  "machine",\n'
                    '  "nope",\n]\nbudget = "10"\ncolour = 1\n')
    with pytest.raises(VmtaxError) as err:
        search_mod.load(str(plan))
    lines = str(err.value).splitlines()
    assert lines[0].startswith(f"{plan}:16: tune.colour: expected one of baseline, knobs")
    assert any(line.startswith(f"{plan}:13: tune.knobs[1]: expected a knob of vm")
               for line in lines)
    assert any(line.startswith(f"{plan}:15: tune.budget: expected a duration") for line in lines)


def test_plan_file_with_tune_table(tmp_path):
    plan = tmp_path / "tune.toml"
    plan.write_text('time = 1\n[targets.native]\n[targets.tcg]\nkind = "vm"\naccel = "tcg"\n'
                    '[[workloads]]\nname = "cpu"\n[tune]\nbaseline = "tcg"\n'
                    'knobs = ["machine"]\nbudget = "20m"\nmethod = "bh"\n')
    search = search_mod.load(str(plan))
    assert (search.baseline.name, search.native.name) == ("tcg", "native")
    assert search.method == "bh" and search.budget == 1200 and search.plan.runs == 3
    names = [t.name for t in search.singles_plan().targets]
    assert names == ["tcg", "tcg[control]", "tcg[machine=q35]"]
    combined = search.combined_plan({"machine": "q35"}, None)
    assert [t.name for t in combined.targets] == ["tcg", "tcg[tuned]", "native"]


# --- resume --------------------------------------------------------------------------------------

def test_resume_without_a_stored_search_is_refused(tmp_path):
    search = search_mod.from_names(["vm:tcg"], ["cpu"], ["machine"], "30m")
    with pytest.raises(VmtaxError, match="--resume: no stored search to continue"):
        racing.run(search, Store(tmp_path), resume=True)


def test_resume_reuses_a_finished_stage_and_continues_an_interrupted_one(tmp_path, monkeypatch):
    search = search_mod.from_names(["vm:tcg"], ["cpu"], ["machine"], "30m")
    store = Store(tmp_path)
    plan = search.singles_plan()
    done = store.new_run(plan.to_dict(), {}, "test")
    store.finish_run(done, "done")
    assert racing._stage(search, store, plan, [], time.monotonic(), None, None,
                             resume=True) == done
    store.finish_run(done, "interrupted")
    resumed = []

    def execute(self):
        resumed.append(self.resume_id)
        return self.resume_id

    monkeypatch.setattr(racing.Runner, "execute", execute)
    racing._stage(search, store, plan, [], time.monotonic(), None, None, resume=True)
    assert resumed == [done]
    racing._stage(search, store, plan, [], time.monotonic(), None, None, resume=False)
    assert resumed == [done, None]


def test_the_same_search_has_the_same_key():
    a = search_mod.from_names(["vm:tcg"], ["cpu"], ["machine"], "30m")
    b = search_mod.from_names(["vm:tcg"], ["cpu"], ["machine"], "30m")
    c = search_mod.from_names(["vm:tcg"], ["cpu"], ["vcpus"], "30m")
    assert a.key == b.key != c.key


def test_the_whole_search_on_synthetic_runs(tmp_path, monkeypatch):
    """run(): the singles stage, the winners combined (a value the others make impossible
    left out), the combination confirmed against the baseline and the best single."""
    truth = {"machine=q35": 1.10, "tb_size=64": 1.04, "vcpus=1": 0.85, "tuned": 1.15,
             "control": 1.0}
    rng = np.random.default_rng(7)
    plans = []

    def execute(self):
        plans.append(self.plan)
        run_id = self.store.new_run(self.plan.to_dict(), {}, "test")
        for spec in self.plan.targets:
            label = spec.name.partition("[")[2].rstrip("]")
            centre = 200.0 if spec.kind == "native" else 100.0 * truth.get(label, 1.0)
            for i, value in enumerate(noisy(rng, centre, 8, cv=0.005)):
                self.store.add_rep(run_id, target=spec.name, workload="cpu",
                                   params={"time": 2}, phase="measure", idx=i, status="ok",
                                   argv=["x"], started=time.time(),
                                   metrics=[Metric("events/s", value, "events/s", True)])
        self.store.finish_run(run_id, "done")
        return run_id

    monkeypatch.setattr(racing.Runner, "execute", execute)
    search = search_mod.from_names(["native", "vm:tcg"], ["cpu"],
                                   ["machine", "vcpus=1", "tb_size=64"], "30m")
    # With no time left for the confirmation, the budget wins: the singles stand alone.
    short = dataclasses.replace(search, budget=search_mod.STOP_MARGIN + 1)
    outcome = racing.run(short, Store(tmp_path / "short"))
    assert outcome.combined is None and len(plans) == 1
    assert any("budget ran out before the winners" in n for n in outcome.summary.notes)
    plans.clear()
    stages = []
    outcome = racing.run(search, Store(tmp_path), on_stage=lambda s, t: stages.append(s))
    assert stages == ["singles", "combined"]
    assert [t.name for t in plans[1].targets] == [
        "vm:tcg", "vm:tcg[tuned]", "vm:tcg[machine=q35]", "native"]
    summary = outcome.summary
    assert [k.label for k in summary.winners()] == ["machine=q35", "tb_size=64"]
    assert summary.tuned == {"machine": "q35", "tb_size": 64}
    assert summary.confirmed and summary.best == "machine=q35"
    assert summary.vs_best[0].comparison.verdict == "better"
    assert summary.tax_recovered["CPU"] == pytest.approx(0.15, abs=0.03)
    data = summary.to_json()
    assert data["combined"]["options"] == {"machine": "q35", "tb_size": 64}
    assert "tb_size = 64   # tuned" in data["recommended"]
    from io import StringIO

    from rich.console import Console

    from vmtax.report import tune_table

    shown = StringIO()
    tune_table.print_summary(Console(file=shown, width=200, highlight=False), summary)
    text = shown.getvalue()
    assert "1 │ machine=q35" in text and "control (A vs A)" in text
    assert "stayed ~, as it must" in text
    assert "combined (machine=q35, tb_size=64) against vm:tcg: CPU +" in text
    assert "tax recovered (tuned − baseline) / (native − baseline): CPU 1" in text
    assert '[targets."vm:tcg"]' in text


def test_a_resumed_cell_with_an_open_race_races_on():
    """Race, the tune stage's repetition policy of the Runner: a resumed cell whose fixed
    repetitions are all stored runs one more baseline repetition while its race is open."""
    from vmtax.studies.repetitions import Cell, Unit

    search = search_mod.from_names(["vm:tcg"], ["cpu"], ["machine"], "30m")
    plan = search.singles_plan()
    names = [t.name for t in plan.targets]
    workload = plan.workloads[0].make(plan.time)
    pairs = [(names[0], n) for n in names[1:]]
    race = racing.Race(plan, pairs, tuning.RaceRule(), time.monotonic())

    def cell(values):
        return Cell(workload, [], {n: list(values) for n in names}, dict.fromkeys(names, 3),
                    {}, lambda name, why: None)

    # Open: 3 noisy runs a side, neither called nor excluded.
    assert race.resumed(cell([100.0, 97.0, 103.0])) == [
        Unit(names[0], "measure", plan.warmup + 3)]
    # Decided (the same constant everywhere: no gain possible), nothing is added.
    assert race.resumed(cell([100.0, 100.0, 100.0])) == []


def test_the_runner_asks_its_repetition_policy_for_a_resumed_cell(tmp_path, monkeypatch):
    """The Runner's side of the policy: a resumed cell with nothing left to run is given
    the policy's units (and the policy sees what is stored of it), or skipped."""
    from vmtax.studies import runner as runner_mod
    from vmtax.studies.repetitions import Unit

    search = search_mod.from_names(["vm:tcg"], ["cpu"], ["machine"], "30m")
    plan = search.singles_plan()
    store = Store(tmp_path)
    names = [t.name for t in plan.targets]
    run_id = store_search(store, {n: [100.0, 97.0, 103.0] for n in names},
                          {t.name: t.options for t in plan.targets}, name=plan.name)
    workload = plan.workloads[0].make(plan.time)
    store_params = {"time": 1}
    monkeypatch.setattr(type(workload), "params", property(lambda self: store_params),
                        raising=False)
    extra = Unit(names[0], "measure", 99)
    seen = []

    class Policy:
        def resumed(self, cell):
            seen.append((dict(cell.values), dict(cell.attempts)))
            return [extra] if len(seen) == 1 else []

        def more(self, cell):
            raise AssertionError("not reached: _measure is stopped first")

    runner = runner_mod.Runner(plan, store, resume=run_id, repetitions=Policy())
    runner.run_id, runner.targets = run_id, dict.fromkeys(names)
    units = runner_mod.schedule(plan)
    done = {(u.target, "cpu", json.dumps(store_params), u.phase, u.idx) for u in units}
    measured = []

    class Stop(Exception):
        pass

    def drop_caches(name):
        measured.append(name)
        raise Stop

    monkeypatch.setattr(runner, "_start_servers", lambda w, a: None)
    monkeypatch.setattr(runner, "_drop_caches", drop_caches)
    with pytest.raises(Stop):
        runner._run_workload(workload, units, done)
    assert measured == [names[0]]
    assert seen[0] == ({n: [100.0, 97.0, 103.0] for n in names}, dict.fromkeys(names, 3))
    runner._run_workload(workload, units, done)   # the policy adds nothing: skipped
    assert measured == [names[0]] and len(seen) == 2


def test_dry_run_says_what_the_search_would_try_and_runs_nothing(tmp_path):
    from click.testing import CliRunner

    from vmtax.cli.main import cli

    done = CliRunner().invoke(cli, ["tune", "--targets", "native,vm:tcg", "--workloads", "cpu",
                                    "--knobs", "machine,disk_cache=unsafe", "--budget", "6m",
                                    "--results", str(tmp_path / "r"), "--dry-run"])
    assert done.exit_code == 0, done.output
    text = " ".join(done.output.split())
    assert ("tune vm:tcg (vm) on cpu, with native for the tax recovered: 2 knob values and an "
            "A-vs-A control, budget 6 min 0 s") in text
    assert "machine=q35" in text and "disk_cache=unsafe ignores the guest's flushes" in text
    assert text.endswith("nothing runs (--dry-run)")
    assert not (tmp_path / "r").exists()


def test_a_not_significant_change_whose_interval_excludes_zero_is_marked_and_explained():
    from vmtax.report import tune_table as cli_tune

    def effect(ci: tuple[float, float], verdict: str) -> tuning.Effect:
        return tuning.Effect("iperf3", {}, "throughput", "network", stats.Comparison(
            "throughput", 9.0, 4.0, -0.55, ci, 0.004, 0.2, verdict, True, 3, 3, 0.1))

    assert cli_tune._effect(effect((-0.7, -0.3), "~")).endswith("~* n=3/3")
    assert cli_tune._effect(effect((-0.7, 0.1), "~")).endswith("~ n=3/3")
    assert cli_tune._effect(effect((-0.7, -0.3), "worse")).endswith("worse n=3/3[/red]")


# -- #36 item 7: an answer that says what it stands on ----------------------------------------

def _raced_search(store: Store, rng) -> str:
    """A singles run as racing leaves it: 3 fixed runs, the baseline and one knob raced to 9."""
    base = {"accel": "tcg"}
    return store_search(store, {
        "vm": noisy(rng, 100, 9), "vm[control]": noisy(rng, 100, 3),
        "vm[machine=q35]": noisy(rng, 104, 9)},
        {"vm": base, "vm[control]": base, "vm[machine=q35]": {**base, "machine": "q35"}},
        runs=3)


def test_the_answer_states_the_baseline_the_runs_and_the_smallest_visible_gain(tmp_path):
    from io import StringIO

    from rich.console import Console

    from vmtax.report import tune_table

    store = Store(tmp_path)
    summary = tuning.summarize(store.load_run(_raced_search(store, np.random.default_rng(5))))
    shown = StringIO()
    tune_table.print_summary(Console(file=shown, width=200, highlight=False), summary)
    text = " ".join(shown.getvalue().split())
    assert "baseline vm (vm): accel=tcg" in text
    assert "n=9/9" in text and "n=3/3" in text     # the raced knob, the control
    half = summary.resolution()["CPU"]
    assert half > 0
    assert f"its interval (CPU ±{half:.1%}) is the smallest gain this search could tell" in text
    data = summary.to_json()
    assert data["baseline_options"] == {"accel": "tcg"}
    assert data["control"]["resolution"] == {"CPU": pytest.approx(half, abs=1e-6)}


def test_the_recommended_snippet_runs_as_pasted(tmp_path):
    from vmtax.studies import planfile

    store = Store(tmp_path)
    summary = tuning.summarize(store.load_run(_raced_search(store, np.random.default_rng(5))))
    pasted = tmp_path / "tuned.toml"
    pasted.write_text(summary.recommended() + "\n")
    plan = planfile.load(str(pasted))
    assert [(t.name, t.kind, t.options) for t in plan.targets] == [
        ("vm", "vm", {"accel": "tcg"})]
    assert [(w.name, w.params) for w in plan.workloads] == [("cpu", {"time": 1})]


def test_a_tune_runs_report_counts_the_runs_each_cell_had(tmp_path):
    from vmtax.report import html

    store = Store(tmp_path)
    run = store.load_run(_raced_search(store, np.random.default_rng(5)))
    model = analyse(run)
    assert model.measured == ("3 to 9 measured runs (3 fixed, more where the run's "
                              "adaptive rule asked)")
    page = html.render_html([html.build(model)])
    assert "3 to 9 measured runs" in page and "3 measured runs per cell" not in page


def test_the_findings_cards_rank_no_control(tmp_path):
    store = Store(tmp_path)
    model = analyse(store.load_run(_raced_search(store, np.random.default_rng(5))))
    ranked = [s.target for standings in model.standings.values() for s in standings]
    assert ranked == ["vm[machine=q35]"]


def test_a_tune_runs_forest_plot_comes_first(tmp_path):
    from vmtax.report import html

    store = Store(tmp_path)
    report = html.build(analyse(store.load_run(_raced_search(store,
                                                             np.random.default_rng(5)))))
    assert report.charts[0].slug == "tune-forest" and len(report.charts) > 1


def test_resuming_a_finished_search_says_so_and_races_nothing(tmp_path, monkeypatch):
    search = search_mod.from_names(["vm:tcg"], ["cpu"], ["machine"], "30m")
    plan = search.singles_plan()
    store = Store(tmp_path)
    store_search(store, {t.name: [100.0, 100.0, 100.0] for t in plan.targets},
                 {t.name: t.options for t in plan.targets}, name=plan.name,
                 baseline=search.baseline.name)

    def execute(self):
        raise AssertionError("a finished stage runs nothing")

    monkeypatch.setattr(racing.Runner, "execute", execute)
    said = []
    outcome = racing.run(search, store, resume=True,
                             on_stage=lambda stage, text: said.append((stage, text)))
    assert said == [("singles", "already done, its stored runs reused")]
    assert outcome.combined is None
    assert any("less than the control's interval (CPU ±" in n for n in outcome.summary.notes)


def test_a_search_stopped_by_ctrl_c_ends_in_stopped_with_its_journal_and_progress_closed(
        tmp_path, monkeypatch):
    """guarded(): the study owns the journal's guard and the interrupt; the CLI only says
    how it ended."""
    import contextlib

    from vmtax.studies import session

    events = []

    @contextlib.contextmanager
    def journal(recovered):
        recovered("a crashed run's mount")
        events.append("guarded")
        try:
            yield "journal"
        finally:
            events.append("undone")

    @contextlib.contextmanager
    def progress():
        events.append("progress")
        try:
            yield "reporter"
        finally:
            events.append("progress closed")

    def run(search, store, reporter, own, resume, on_stage):
        assert (reporter, own) == ("reporter", "journal")
        raise KeyboardInterrupt

    def stopped():
        events.append("stopped")
        raise SystemExit(130)

    monkeypatch.setattr(session, "guarded_journal", journal)
    monkeypatch.setattr(racing, "run", run)
    search = search_mod.from_names(["vm:tcg"], ["cpu"], ["machine"], "30m")
    with pytest.raises(SystemExit):
        racing.guarded(search, Store(tmp_path), progress(), events.append, stopped)
    assert events == ["a crashed run's mount", "guarded", "progress", "progress closed",
                      "undone", "stopped"]
