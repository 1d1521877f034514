"""What a user sees first (issue 18): the summary table, flags in one line, named runs,
`compare` for CI, exports for benchstat and JSON Lines, progress, a quick CLI."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import vmtax
from rich.console import Console
from scipy import stats as scipy_stats

from vmtax.analysis.model import analyse
from vmtax.analysis import intervals
from vmtax.analysis import summary as analysis
from vmtax.cli import progress
from vmtax.core import workload as workloads
from vmtax.core import paths
from vmtax.core.types import Metric
from vmtax.host import quiet
from vmtax.report import parts
from vmtax.report import export
from vmtax.report import terminal as report
from vmtax.results.store import Store, check_run_name

CLASSIC = ["cpu", "threads", "memory", "fileio", "mutex"]
TARGETS = {"native": {"kind": "native", "bare_host": True},
           "container": {"kind": "container", "bare_host": False, "runtime": "runc"},
           "vm": {"kind": "vm", "bare_host": False, "accel": "tcg"}}
KEEPS = {"native": 1.0, "container": 0.97, "vm": 0.6}


def _metrics(workload, target, idx, keep, noisy_secondary):
    """Every metric of the workload's real manifest: throughput kept at `keep`, times and
    latencies stretched by 1/keep, a 0.4% wiggle; secondary ones very noisy if asked."""
    wiggle = 1 + 0.004 * (idx % 3 - 1)
    out = []
    for spec in workloads.registered()[workload].metrics:
        factor = keep if spec.higher_is_better else 1 / keep
        value = 100.0 * factor * wiggle
        if spec.secondary and noisy_secondary:
            value *= 1 + 0.5 * idx
        out.append(Metric(spec.name, value, spec.unit, spec.higher_is_better))
    return out


def store_classic(results, *, runs=5, keeps=None, name=None, noisy_secondary=True,
                  targets=TARGETS, workload_names=CLASSIC):
    """A stored run shaped like the classic plan's, built from the real manifests."""
    keeps = keeps or KEEPS
    store = Store(results)
    plan = {"targets": [{"name": t} for t in targets], "baseline": "native", "runs": runs,
            "warmup": 0, "time": 2, **({"name": name} if name else {})}
    run_id = store.new_run(plan, {"cpu_model": "Synthetic CPU", "logical_cpus": 2,
                                  "arch": "x86_64"}, "0")
    for target, fp in targets.items():
        store.set_target(run_id, target, fp["kind"], fp)
    for workload in workload_names:
        for idx in range(runs):
            for target in targets:
                store.add_rep(run_id, target=target, workload=workload, params={"time": 2},
                              phase="measure", idx=idx, status="ok", argv=["sysbench"],
                              started=1_700_000_000.5 + idx, host_elapsed=2.0,
                              metrics=_metrics(workload, target, idx, keeps[target],
                                               noisy_secondary))
    store.finish_run(run_id, "done")
    store.close()
    return run_id


def _headline(run, width=80):
    console = Console(record=True, width=width)
    report.print_headline(console, analyse(run))
    return console.export_text()


# -- 5: the summary table ------------------------------------------------------------------

def test_classic_summary_fits_one_80_column_screen(tmp_path):
    run = Store(tmp_path).load_run(store_classic(tmp_path))
    text = _headline(run)
    lines = text.rstrip("\n").splitlines()
    assert len(lines) <= 30, text
    assert max(len(line.rstrip()) for line in lines) <= 80
    rows = [line.split()[0] for line in lines if line.split() and line.split()[0] in CLASSIC]
    assert rows == CLASSIC, text                       # one row per workload, in plan order
    # each target's ratio with 3 significant digits and its 95% CI; the baseline's median
    cpu = next(line for line in lines if line.split()[:1] == ["cpu"])
    assert re.search(r"0\.970 \[0\.9\d*–0\.9\d*\]", cpu) and re.search(r"0\.600 \[", cpu), cpu
    assert "100" in cpu and "events/s" in cpu
    # the composite index per class of the workloads shown, with its CI, and overall
    geo = {line.split()[1]: line.split()[2:] for line in lines if line.startswith(" index")}
    assert set(geo) >= {"CPU", "memory", "disk", "overall"}, text
    assert geo["CPU"][:2] == ["1", "0.970"] and geo["CPU"][3] == "0.600", text
    assert "→ CPU: native (the others lose beyond noise; vm keeps 0.600 of native" in text
    assert "more metric rows: vmtax show" in text and "--all" in text


def test_long_target_names_do_not_squeeze_out_the_row_names(tmp_path):
    # Guests named after their sweep point (E2's plan), each with its accelerator.
    guests = {f"{k}[pin={p}]": {"kind": "vm", "bare_host": False, "accel": "tcg"}
              for k, p in (("gp", "none"), ("rt", "none"), ("rt", "1"))}
    targets = {"native": TARGETS["native"], **guests}
    run_id = store_classic(tmp_path, targets=targets, keeps={t: 1.0 for t in targets},
                           workload_names=["cpu"])
    text = _headline(Store(tmp_path).load_run(run_id))
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    assert re.search(r"^ cpu +↑ events", text, re.MULTILINE), text
    assert "gp[pin=none]" in text and "(tcg)" in text


def test_a_single_sample_gets_no_interval(tmp_path):
    run = Store(tmp_path).load_run(store_classic(tmp_path, runs=1, workload_names=["cpu"]))
    cpu = next(line for line in _headline(run).splitlines() if line.split()[:1] == ["cpu"])
    assert "0.970" in cpu and "[" not in cpu, cpu


def test_all_shows_every_metric(tmp_path):
    run_id = store_classic(tmp_path, workload_names=["cpu"])
    short = vmtax("show", run_id, "--results", str(tmp_path), env={"COLUMNS": "120"},
                  check=True).stdout
    full = vmtax("show", run_id, "--all", "--results", str(tmp_path), env={"COLUMNS": "120"},
                 check=True).stdout
    assert "latency p95" not in short and "latency p95" in full
    assert "fairness time stddev" in full


# -- 6: flags that inform --------------------------------------------------------------------

def test_secondary_metrics_are_never_noisy_and_flags_fit_one_line(tmp_path):
    run = Store(tmp_path).load_run(store_classic(tmp_path, noisy_secondary=True))
    summary = analysis.summarize_run(run)
    flagged = {(row.workload, row.metric) for row in summary.rows
               for cell in row.cells.values() if "noisy" in cell.flags}
    secondary = {(row.workload, row.metric) for row in summary.rows
                 if analysis.is_secondary(row.workload, row.metric)}
    assert secondary and not flagged & secondary
    # noisy primary metrics: counted in one line, cells marked, not spelt out per cell
    noisy = Store(tmp_path / "b").load_run(store_classic(tmp_path / "b"))
    for r in noisy.reps:
        if r.target == "vm":
            r.metrics[:] = [Metric(m.name, m.value * (1 + 0.3 * (r.idx % 2)), m.unit,
                                   m.higher_is_better) for m in r.metrics]
    text = _headline(noisy)
    flag_lines = [line for line in text.splitlines() if "noisy" in line]
    assert flag_lines == ["⚠ primary metrics: 5 cells noisy (CV > 5%)"], text
    assert text.count("⚠") == 6
    summary = analysis.summarize_run(noisy)
    assert parts.flags_line(analysis.headline(summary.rows), "host load 1.9 on 2 CPUs") == (
        "⚠ primary metrics: 5 cells noisy (CV > 5%): host load 1.9 on 2 CPUs")


# -- 9: which database -------------------------------------------------------------------

def test_runs_names_the_database_it_read(tmp_path):
    store_classic(tmp_path, name="nightly", workload_names=["cpu"])
    out = vmtax("runs", "--results", str(tmp_path), env={"COLUMNS": "200"}, check=True).stdout
    assert f"stored runs in {tmp_path / 'vmtax.sqlite'}" in out and "nightly" in out


# -- 10: exports -------------------------------------------------------------------------

def test_jsonl_and_iso_timestamps(tmp_path):
    run = Store(tmp_path).load_run(store_classic(tmp_path, workload_names=["cpu"]))
    records = [json.loads(line) for line in export.to_jsonl(run).decode().splitlines()]
    assert records == json.loads(export.to_json(run))
    assert records[0]["started"] == "2023-11-14T22:13:20.500000+00:00"


def test_benchstat_lines_carry_every_sample_and_direction(tmp_path):
    run = Store(tmp_path).load_run(store_classic(tmp_path, workload_names=["cpu", "mutex"]))
    text = export.to_benchstat(run).decode()
    assert "Unit events/s better=higher" in text and "Unit latency-avg-ms better=lower" in text
    assert "Unit total-events better=higher" in text          # no "total-events-events"
    lines = [line for line in text.splitlines() if line.startswith("Benchmark")]
    assert len(lines) == 2 * 5 * 3
    # the baseline first, so benchstat makes it the base column
    assert lines[0].startswith("BenchmarkCpu/target=native/time=2-2 1 ")
    name, iterations, *pairs = lines[0].split()
    assert iterations == "1" and len(pairs) == 2 * len(workloads.registered()["cpu"].metrics)
    assert float(pairs[0]) == pytest.approx(100 * 0.996) and pairs[1] == "events/s"


def _benchstat() -> str:
    """Go's benchstat: the one `make builds` puts in vmtax's cache (scripts/benchstat.py),
    else one the user installed."""
    built = paths.cache_dir() / "bin" / "benchstat"
    tool = str(built) if built.exists() else shutil.which("benchstat")
    if tool is None:
        pytest.skip("benchstat is not installed")
    return tool


def test_two_runs_exports_share_their_configuration_lines(tmp_path):
    """benchstat sets files whose configuration lines ("key: value") differ in tables of
    their own: the run's id and name are comments, so two runs of a host compare."""
    def configuration(run_id):
        text = export.to_benchstat(Store(tmp_path).load_run(run_id)).decode()
        return [line for line in text.splitlines() if re.match(r"[a-z][^\s:]*:", line)]
    old = store_classic(tmp_path, name="old", workload_names=["cpu"])
    new = store_classic(tmp_path, name="new", workload_names=["cpu"])
    assert configuration(old) == configuration(new)
    text = export.to_benchstat(Store(tmp_path).load_run(new)).decode()
    assert f"# vmtax-run: {new}" in text and "# vmtax-name: new" in text


def test_benchstat_compares_two_runs(tmp_path):
    tool = _benchstat()
    for name, keeps in (("old", KEEPS), ("new", {**KEEPS, "vm": 0.5})):
        run_id = store_classic(tmp_path, name=name, keeps=keeps, workload_names=["cpu"])
        (tmp_path / f"{name}.txt").write_text(vmtax(
            "export", run_id, "--format", "benchstat", "--results", str(tmp_path),
            check=True).stdout)
    out = subprocess.run([tool, "-filter", ".unit:events/s", "old.txt", "new.txt"],
                         cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    # One table, the new run beside the old with a verdict per benchmark.
    assert out.count("old.txt") == 1 and "vs base" in out, out
    assert re.search(r"target=vm/.*-16\.67% \(p=", out), out
    assert re.search(r"target=native/.*~ \(p=", out), out


def test_benchstat_reads_the_export(tmp_path):
    tool = _benchstat()
    run_id = store_classic(tmp_path, workload_names=["cpu"])
    data = vmtax("export", run_id, "--format", "benchstat", "--results", str(tmp_path),
                 check=True).stdout
    (tmp_path / "b.txt").write_text(data)
    out = subprocess.run([tool, "-col", "/target", "-filter", ".unit:events/s",
                          str(tmp_path / "b.txt")], capture_output=True, text=True, check=True)
    assert "native" in out.stdout and "vm" in out.stdout and "-40.00%" in out.stdout


def test_export_refuses_two_formats_on_stdout(tmp_path):
    run_id = store_classic(tmp_path, workload_names=["cpu"])
    res = vmtax("export", run_id, "--format", "jsonl", "--csv", "-", "--results", str(tmp_path))
    assert res.returncode == 2 and "only one format can go to stdout" in res.stderr


# -- 11: named runs and CI use -------------------------------------------------------------

def test_names_compare_without_arguments_and_fail_on(tmp_path):
    results = str(tmp_path)
    before = store_classic(tmp_path, runs=6, name="before", workload_names=["cpu"])
    after = store_classic(tmp_path, runs=6, name="after", workload_names=["cpu"],
                          keeps={"native": 0.8, "container": 0.97, "vm": 0.6})
    shown = json.loads(vmtax("show", "after", "--json", "--results", results,
                             check=True).stdout)
    assert shown["run"]["id"] == after and shown["run"]["plan"]["name"] == "after"
    # no arguments: the latest run against the one before it
    plain = json.loads(vmtax("compare", "--json", "--results", results, check=True).stdout)
    named = json.loads(vmtax("compare", "before", "after", "--json", "--results", results,
                             check=True).stdout)
    assert plain == named
    assert {r["a"].split(":")[0] for r in plain["rows"]} == {before}
    eps = next(r for r in plain["rows"] if r["metric"] == "events/s" and r["a"].endswith(
        ":native"))
    assert eps["comparison"]["verdict"] == "worse"
    assert any(r["metric"] == "fairness time stddev" for r in plain["rows"])   # JSON: all
    table = vmtax("compare", "--results", results, env={"COLUMNS": "160"}, check=True).stdout
    assert "fairness" not in table and "12 secondary metrics hidden: --all" in table
    fail = vmtax("compare", "--fail-on", "worse", "--results", results)
    assert fail.returncode == 1, fail.stderr
    assert fail.stderr.startswith("vmtax: ") and "significantly worse (--fail-on worse)" in (
        fail.stderr) and "cpu events/s" in fail.stderr
    # B against itself: refused, it could show no change
    itself = vmtax("compare", "after", "after", "--fail-on", "change", "--results", results)
    assert itself.returncode == 2 and f"are both run {after}" in itself.stderr
    one = vmtax("compare", "after", "--results", results)
    assert one.returncode == 2 and "compare takes two runs" in one.stderr


def test_a_bad_name_is_refused_before_anything_runs(tmp_path):
    res = vmtax("run", "--targets", "native", "--workloads", "cpu", "--name", "2026 run",
                "--results", str(tmp_path / "r"))
    assert res.returncode == 2 and res.stderr.startswith("vmtax: error: --name: expected")
    assert not (tmp_path / "r").exists()
    with pytest.raises(Exception, match="not 'last'"):
        check_run_name("last")


# -- 12: --dry-run -------------------------------------------------------------------------

def test_run_dry_run_prints_the_plan_and_runs_nothing(tmp_path):
    res = vmtax("run", "--targets", "native,container", "--workloads", "cpu,memory",
                "--runs", "3", "--dry-run", "--results", str(tmp_path / "r"), check=True)
    assert "2 targets × 2 workload configurations × (1 warm-up + 3 measured) = 16" in res.stdout
    assert "estimated run time" in res.stdout and "cpu-max-prime" in res.stdout
    assert not (tmp_path / "r").exists()


# -- 8: progress ---------------------------------------------------------------------------

def test_time_left_moves_from_the_estimate_to_the_measured_pace(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    reporter = progress.ProgressReporter(estimate=100.0, per_cell=2)
    reporter.start(10)
    assert reporter.eta() == pytest.approx(100)
    for _ in range(5):
        reporter.advance()
    now[0] += 10             # half done in 10 s where 50 were planned
    assert reporter.eta() == pytest.approx(0.5 * 50 + 0.5 * 10)
    for _ in range(5):
        reporter.advance()
    assert reporter.eta() == pytest.approx(0)


def test_without_a_terminal_one_line_per_finished_cell(capsys):
    reporter = progress.ProgressReporter(estimate=10.0, per_cell=2)
    with reporter:
        reporter.start(4)
        for target in ("native", "vm", "vm", "native"):
            reporter.step(f"{target} · cpu · run 1")
            reporter.advance()
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" done")[0] for line in lines] == [
        "[0/4] native · cpu starts", "[1/4] vm · cpu starts", "[3/4] vm · cpu",
        "[4/4] native · cpu"]
    assert lines[-1].endswith("~0 s left")


# -- 15: a CLI that answers at once --------------------------------------------------------

@pytest.mark.parametrize("args", [["--help"], ["runs"], ["show", "last"]])
def test_read_commands_load_no_statistics_or_plotting_stack(tmp_path, args):
    store_classic(tmp_path, workload_names=["cpu"])
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "vmtax", *args,
                          *(["--results", str(tmp_path)] if args != ["--help"] else [])],
                         capture_output=True, text=True, timeout=120, check=True)
    loaded = {line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines()
              if line.startswith("import time:")}
    assert not loaded & {"scipy", "matplotlib", "jinja2"}, sorted(loaded & {
        "scipy", "matplotlib", "jinja2"})


def test_median_interval_without_scipy_matches_the_binomial():
    for n in range(1, 40):
        x = np.arange(n, dtype=float)
        for level in (0.5, 0.9, 0.95, 0.99):
            lo, hi, coverage = intervals.median_ci(x, level)
            k = np.arange(1, (n + 1) // 2 + 1)
            expected = 1 - 2 * scipy_stats.binom.cdf(k - 1, n, 0.5)
            ok = np.flatnonzero(expected >= level - 1e-12)
            i = ok[-1] if ok.size else 0
            assert (lo, hi) == (x[k[i] - 1], x[n - k[i]])
            assert coverage == pytest.approx(expected[i], abs=1e-12)


# -- 7: host quietness ---------------------------------------------------------------------

def _fake_host(root, governor="powersave", no_turbo="0", smt_active="1"):
    cpu = root / "sys/devices/system/cpu"
    for n in (0, 1):
        (cpu / f"cpu{n}/cpufreq").mkdir(parents=True)
        (cpu / f"cpu{n}/cpufreq/scaling_governor").write_text(governor + "\n")
    (cpu / "intel_pstate").mkdir()
    (cpu / "intel_pstate/no_turbo").write_text(no_turbo + "\n")
    (cpu / "smt").mkdir()
    (cpu / "smt/active").write_text(smt_active + "\n")
    return str(root / "sys")


def test_quietness_reads_governor_turbo_and_smt(tmp_path):
    sys_root = _fake_host(tmp_path)
    assert quiet.governors(sys_root) == ["powersave"]
    assert quiet.turbo(sys_root) is True and quiet.smt(sys_root) is True
    calm = _fake_host(tmp_path / "calm", "performance", "1", "0")
    assert (quiet.turbo(calm), quiet.smt(calm)) == (False, False)
    assert quiet.governors(str(tmp_path / "none")) == [] and quiet.turbo(str(tmp_path)) is None


def test_a_busy_host_is_named_and_a_quiet_one_passes():
    busy = {"load": [1.9, 1.0, 0.5], "cpus": 2, "governors": ["powersave"], "turbo": True,
            "smt": True, "busiest": [{"pid": 42, "name": "cc1 (x)", "cpu": 0.93},
                                     {"pid": 43, "name": "idle", "cpu": 0.01}]}
    found = quiet.problems(busy)
    assert found[0].startswith("load average 1.9 on 2 CPUs")
    assert found[1] == "busiest processes: cc1 (x) (PID 42) 93% CPU"
    assert "cpupower frequency-set -g performance" in found[2] and "turbo" in found[3]
    calm = {**busy, "load": [0.1, 0.1, 0.1], "governors": [], "turbo": None, "busiest": []}
    assert quiet.problems(calm) == []
    assert quiet.describe(calm) == ("load 0.1 on 2 CPUs; governor none (no cpufreq); turbo "
                                    "unknown; SMT on")
    assert quiet.during({"quiet": {"before": calm, "after": busy}}) == (
        "host load 1.9 on 2 CPUs during the run")
    assert quiet.during({"quiet": {"before": calm, "after": calm}}) == quiet.during({}) == ""


def test_busiest_measures_other_processes_cpu():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        found = quiet.busiest(count=50, interval=0.5)
    finally:
        spinner.kill()
        spinner.wait()
    mine = [p for p in found if p["pid"] == spinner.pid]
    assert mine and mine[0]["cpu"] > 0.1, found   # a shared 2-CPU host: at least some
    assert all(p["pid"] != os.getpid() for p in found)


# -- live: a real run as a script or CI sees it ---------------------------------------------

@pytest.mark.live
def test_a_named_run_without_a_terminal(tmp_path):
    results = str(tmp_path / "results")
    res = vmtax("run", "--targets", "native", "--workloads", "cpu", "--runs", "2",
                "--warmup", "0", "--time", "1", "--name", "first", "--results", results,
                env={"COLUMNS": "80"}, check=True)
    progress = [line for line in res.stderr.splitlines() if line.startswith("[")]
    assert progress and progress[-1].startswith("[2/2] native · cpu done, "), res.stderr
    assert "cpu" in res.stdout and "first" in res.stdout
    assert len(res.stdout.splitlines()) <= 20, res.stdout
    shown = json.loads(vmtax("show", "first", "--json", "--results", results,
                             check=True).stdout)
    recorded = shown["run"]["host"]["quiet"]
    assert set(recorded) == {"before", "after"} and recorded["after"]["cpus"] >= 1
    one = vmtax("compare", "--results", results)
    assert one.returncode == 2 and "needs two stored runs" in one.stderr


def test_plans_suggest_the_key_meant_and_warn_of_more_vcpus_than_cpus(tmp_path):
    plan = tmp_path / "p.toml"
    plan.write_text('rnus = 3\n[targets.native]\n[[workloads]]\nname = "cpu"\n')
    res = vmtax("plan", str(plan))
    assert res.returncode == 2 and res.stderr.rstrip().endswith(
        'got "rnus" (did you mean "runs"?)'), res.stderr
    plan.write_text('[targets.native]\n[targets.vm]\nvcpus = 64\n[targets.container]\n'
                    'cpus = "0"\n[[workloads]]\nname = "cpu"\n')
    res = vmtax("plan", str(plan), check=True)
    assert res.stdout.rstrip().splitlines()[-1] == (
        f"warning: vm: vcpus = 64 is more than the {len(os.sched_getaffinity(0))} CPUs this "
        "host lets vmtax use: the vCPUs take turns on them")
    dry = vmtax("run", str(plan), "--dry-run", "--results", str(tmp_path / "r"), check=True)
    assert "vcpus = 64 is more than" in dry.stdout and "targets (baseline: native)" in dry.stdout


# -- 13: the report --------------------------------------------------------------------------

def test_report_hides_secondary_metrics_collapses_flags_and_compares_two_runs(tmp_path):
    from vmtax.report import html as htmlreport

    before = store_classic(tmp_path, runs=6, workload_names=["cpu", "memory"])
    after = store_classic(tmp_path, runs=6, workload_names=["cpu", "memory"],
                          keeps={"native": 0.8, "container": 0.97, "vm": 0.6})
    res = vmtax("report", before, after, "--html", str(tmp_path / "r.html"),
                "--results", str(tmp_path), check=True)
    assert res.stdout.startswith("wrote ")
    html = (tmp_path / "r.html").read_text()
    # secondary metrics: in a closed <details>, 4 per workload (totals and fairness)
    assert html.count('<details class="more" data-secondary="8">') == 2
    main_table = html.split('data-secondary=')[0]
    assert "fairness time stddev" not in main_table.split("Every metric")[-1]
    # the comparison: B against A, every shared target and metric, with a verdict
    section = html.split('id="comparison"')[1].split("</section>")[0]
    assert f"{after} against {before}" in section
    rows = re.findall(r'<tr data-verdict="([^"]+)">\s*<td class="l">(\w+)</td>\s*'
                      r'<td class="metric">([^<]+?) <span.*?<td class="l">([^<]+)</td>',
                      section, re.DOTALL)
    per_target = sum(len(workloads.registered()[w].metrics) for w in ("cpu", "memory"))
    assert len(rows) == 3 * per_target
    verdict = {(w, m, t): v for v, w, m, t in rows}
    assert verdict[("cpu", "events/s", "native")] == "worse"      # 20% slower
    assert verdict[("cpu", "events/s", "vm")] == "~"               # unchanged
    # one run: no comparison; flags counted in one line, each in a closed <details>
    noisy = Store(tmp_path).load_run(after)
    for r in noisy.reps:
        if r.target == "vm":
            r.metrics[:] = [Metric(m.name, m.value * (1 + 0.3 * (r.idx % 2)), m.unit,
                                   m.higher_is_better) for m in r.metrics]
    built = htmlreport.build(analyse(noisy))
    assert [c.slug for c in built.charts] == ["cpu-ratio", "cpu-repetitions", "memory-ratio",
                                              "memory-repetitions"]   # strips beside bars
    page = htmlreport.render_html([built])
    assert 'id="comparison"' not in page
    line = re.search(r'<p class="flags-line"><span class="flag">([^<]+)</span>', page)[1]
    assert line.startswith("⚠ ") and "cells noisy (CV &gt; 5%)" in line
    assert "<summary>each of the" in page


def test_not_quiet_is_said_when_measuring_starts(capsys):
    reporter = progress.ProgressReporter(estimate=10.0, per_cell=1)
    reporter.before_first = ["host not quiet: load average 3.0 on 2 CPUs"]
    with reporter:
        reporter.start(2)
        reporter.step("preparing vm")
        assert "not quiet" not in capsys.readouterr().err   # a target may yet fail to start
        reporter.step("native · cpu · run 1")
        reporter.step("native · cpu · run 2")
    assert capsys.readouterr().err.count("warning: host not quiet: load average 3.0") == 1


def test_a_plan_file_names_its_runs(tmp_path):
    plan = tmp_path / "p.toml"
    plan.write_text('name = "nightly"\n[targets.native]\n[[workloads]]\nname = "cpu"\n')
    shown = json.loads(vmtax("plan", str(plan), "--json", check=True).stdout)
    assert shown["plan"]["name"] == "nightly"
    plan.write_text('name = "2026"\n[targets.native]\n[[workloads]]\nname = "cpu"\n')
    res = vmtax("plan", str(plan))
    assert res.returncode == 2 and "name: expected a letter then" in res.stderr


def test_a_snapshot_without_an_interval_does_not_wait():
    snap = quiet.snapshot(interval=None)
    assert snap["busiest"] == [] and len(snap["load"]) == 3 and snap["cpus"] >= 1


def test_a_long_step_shows_its_own_time(monkeypatch):
    now = [50.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    reporter = progress.ProgressReporter(estimate=100.0, per_cell=1)
    reporter.start(2)
    reporter.step("vm · fileio · prepare")
    column = progress._StepTime(reporter)
    task = reporter.progress.tasks[0]
    assert column.render(task).plain == ""          # a short step: nothing to say
    now[0] += 34
    assert column.render(task).plain == "(34 s)"
    reporter.step("vm · fileio · run 1")
    assert column.render(task).plain == ""


def test_without_a_terminal_a_slow_step_is_said_once(capsys, monkeypatch):
    """Found in the lab: a piped run said nothing for minutes while its guests booted; a
    step that ends quickly (a target refused at once) says nothing, so an error stays one
    line."""
    monkeypatch.setattr(progress, "SLOW_STEP", 0.3)
    with progress.ProgressReporter(estimate=10.0, per_cell=1) as reporter:
        reporter.start(1)
        reporter.step("preparing native")
        reporter.step("preparing vm:kvm")
        time.sleep(0.8)
    assert capsys.readouterr().err.splitlines() == ["preparing vm:kvm: 0.3 s so far"]
