"""`vmtax exits` as a user meets it: imported perf kvm stat reports of both layouts,
shown and diffed through the CLI and a real results database. Errors go through the real
command (one line on stderr); the rest runs in-process, to spare an interpreter start."""

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import vmtax
from test_perf_kvm import FIXTURES

from vmtax.cli.main import cli
from vmtax.results.store import Store


def ok(*args: str) -> str:
    """The command's stdout; it must succeed."""
    res = CliRunner().invoke(cli, list(args))
    assert res.exit_code == 0 and res.exception is None, (res.output, res.exception)
    return res.stdout


@pytest.fixture
def imported(tmp_path):
    """The E2 pair, imported: the RT guest unpinned (classic layout, 10 s of recording)
    and pinned (hists layout)."""
    results = str(tmp_path / "results")
    ids = []
    for name, label, extra in (("e2-rt-unpinned.txt", "rt-unpinned", ["--seconds", "10"]),
                               ("e2-rt-pinned.txt", "rt-pinned", [])):
        stdout = ok("exits", "import", str(FIXTURES / name), "--label", label, *extra,
                    "--results", results)
        assert stdout.startswith("stored 11 vmexit reasons"), stdout
        ids.append(stdout.split(" as run ")[1].split()[0])
    return results, ids


def test_diff_of_two_imported_reports_shows_the_published_change(imported):
    results, (a, b) = imported
    data = json.loads(ok("exits", "diff", a, b, "--json", "--results", results))
    first = data["reasons"][0]
    # E2: with the RT guest, pinning cut EXTERNAL_INTERRUPT from 4.11% to 0.35% of samples.
    assert (first["reason"], first["share_a"], first["share_b"], first["change"]) == (
        "EXTERNAL_INTERRUPT", 4.11, 0.35, -3.76)
    # Sorted by the size of the change; pinning raised IO_INSTRUCTION and MSR_WRITE.
    changes = [abs(r["change"]) for r in data["reasons"]]
    assert changes == sorted(changes, reverse=True)
    assert {r["reason"] for r in data["reasons"][1:3]} == {"IO_INSTRUCTION", "MSR_WRITE"}
    assert all(r["change"] > 0 for r in data["reasons"][1:3])
    # Exits per second where the recording's length is known (A: --seconds 10).
    assert first["per_second_a"] == 41.1 and first["per_second_b"] is None
    assert data["only_a"] == data["only_b"] == []
    assert "-3.76" in ok("exits", "diff", a, b, "--results", results)
    # By label, as by id.
    assert json.loads(ok("exits", "diff", "rt-unpinned", "rt-pinned", "--json", "--results",
                         results)) == data


def test_last_is_the_latest_import_for_exits_only(imported):
    results, (_, b) = imported
    assert json.loads(ok("exits", "last", "--json", "--results", results))["cells"][0]["run"] == b
    shown = CliRunner().invoke(cli, ["show", "last", "--results", results])
    assert "which `last` leaves out" in str(shown.exception)
    compared = CliRunner().invoke(cli, ["compare", "--results", results])
    assert "needs two stored runs" in str(compared.exception)


def test_show_sorts_by_time_share_with_totals_and_runs_lists_imports(imported):
    results, (a, _) = imported
    cell = json.loads(ok("exits", a, "--json", "--results", results))["cells"][0]
    shares = [r["time_share"] for r in cell["reasons"]]
    assert shares == sorted(shares, reverse=True) and cell["reasons"][0]["reason"] == "HLT"
    assert cell["total_samples"] == 10000 and cell["seconds"] == 10
    table = ok("exits", f"{a}:rt-unpinned", "--results", results)
    assert "EXTERNAL_INTERRUPT" in table and "10,000" in table
    runs = json.loads(ok("runs", "--json", "--results", results))
    assert [r["targets"] for r in runs] == [["rt-unpinned"], ["rt-pinned"]]


def test_reasons_on_one_side_only(tmp_path):
    results = str(tmp_path / "results")
    for name in ("classic-vmx.txt", "classic-old-vmx.txt"):
        ok("exits", "import", str(FIXTURES / name), "--label", name, "--results", results)
    a, b = (r["id"] for r in Store(results, readonly=True).list_runs())
    data = json.loads(ok("exits", "diff", a, b, "--json", "--results", results))
    # The old perf's capture has 8 of the 12 reasons; a missing one counts as 0% there.
    assert set(data["only_a"]) == {"INTERRUPT_WINDOW", "CPUID", "MSR_READ", "TDCALL"}
    assert data["only_b"] == []
    cpuid = next(r for r in data["reasons"] if r["reason"] == "CPUID")
    assert (cpuid["share_a"], cpuid["share_b"], cpuid["change"]) == (0.84, None, -0.84)


@pytest.mark.parametrize("content, message", [
    (None, "vmtax: error: {file}: cannot read the perf kvm stat report (No such file"),
    ("hello\n", "vmtax: error: {file}: no `perf kvm stat report` table"),
    ("TRUNCATED", "vmtax: error: {file}: line 20 (after the end): expected the closing"),
])
def test_import_errors_are_one_line(tmp_path, content, message):
    file = tmp_path / "report.txt"
    if content == "TRUNCATED":
        text = (FIXTURES / "classic-vmx.txt").read_text()
        file.write_text(text[:text.index("Total Samples")])
    elif content is not None:
        file.write_text(content)
    res = vmtax("exits", "import", str(file), "--label", "x", "--results",
                str(tmp_path / "results"))
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(message.format(file=file)), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_a_pvm_report_imports_every_row_with_its_total(tmp_path):
    results = str(tmp_path / "results")
    stdout = ok("exits", "import", str(FIXTURES / "classic-pvm.txt"), "--label", "pvm",
                "--results", results)
    assert stdout.startswith("stored 5 vmexit reasons"), stdout
    shown = json.loads(ok("exits", "last", "--json", "--results", results))
    text = json.dumps(shown)
    assert "UNKNOWN(131072)" in text and "UNKNOWN(65536)" in text
    assert "20000" in text


def test_the_collectors_of_vm_exits_are_found_by_their_manifest():
    from vmtax.analysis import exits

    assert exits.exits_collectors() == ["exits"]


def test_a_run_without_exits_says_why(tmp_path):
    results = tmp_path / "results"
    store = Store(results)
    run = store.new_run({}, {}, "test")
    store.set_target(run, "vm:tcg", "vm", {})
    store.add_rep(run, target="vm:tcg", workload="cyclictest", params={}, phase="collect",
                  idx=0, status="unavailable", argv=["exits"], started=0.0,
                  error="exits: unavailable — vm:tcg runs under TCG, which has no VM exits")
    store.finish_run(run, "done")
    store.close()
    res = vmtax("exits", run, "--results", str(results))
    assert res.returncode == 2
    assert res.stderr.strip() == (
        f"vmtax: error: {run}: no VM exits stored (vm:tcg · cyclictest: exits: unavailable — "
        "vm:tcg runs under TCG, which has no VM exits)")


def _recorded_run(store, target, report, latency, vcpu_report=None):
    """A run as the runner stores E2's cell: one measured cyclictest repetition of 2 s,
    and the exits collector's metrics (all vCPUs, and vCPU 0 when given)."""
    from vmtax.core.types import Metric
    from vmtax.helpers import perf_kvm

    run = store.new_run({}, {}, "test")
    store.set_target(run, target, "vm", {})
    store.add_rep(run, target=target, workload="cyclictest", params={"threads": 1},
                  phase="measure", idx=0, status="ok", argv=["cyclictest"], started=0.0,
                  host_elapsed=2.0, metrics=[
                      Metric(f"latency {k}", v, "µs", False, {"thread": "0"})
                      for k, v in zip(("min", "avg", "max"), latency)])
    metrics = perf_kvm.parse((FIXTURES / report).read_text()).metrics()
    if vcpu_report:
        metrics += [Metric(m.name, m.value, m.unit, m.higher_is_better,
                           {**m.dimensions, "vcpu": "0"})
                    for m in perf_kvm.parse((FIXTURES / vcpu_report).read_text()).metrics()]
    store.add_rep(run, target=target, workload="cyclictest", params={"threads": 1},
                  phase="collect", idx=0, status="ok", argv=["exits"], started=0.0,
                  metrics=metrics)
    store.finish_run(run, "done")
    return run


def test_diff_shows_the_workload_result_and_exits_per_second(tmp_path):
    store = Store(tmp_path / "results")
    a = _recorded_run(store, "rt[pin=none]", "e2-rt-unpinned.txt", (3, 12, 95),
                      vcpu_report="classic-old-vmx.txt")
    b = _recorded_run(store, "rt[pin=1]", "e2-rt-pinned.txt", (2, 8, 41))
    store.close()
    results = str(tmp_path / "results")
    data = json.loads(ok("exits", "diff", f"{a}:rt[pin=none]", f"{b}:rt[pin=1]", "--json",
                         "--results", results))
    assert data["a"]["result"] == {"latency min[thread=0] µs": 3, "latency avg[thread=0] µs": 12,
                                   "latency max[thread=0] µs": 95}
    assert data["b"]["result"]["latency max[thread=0] µs"] == 41
    first = data["reasons"][0]
    # 411 and 35 exits over the cell's 2 s of measured cyclictest.
    assert (first["reason"], first["per_second_a"], first["per_second_b"]) == (
        "EXTERNAL_INTERRUPT", 205.5, 17.5)
    text = " ".join(ok("exits", "diff", a, b, "--results", results).split())   # unwrapped
    assert "latency max[thread=0] 95 µs" in text and "latency max[thread=0] 41 µs" in text
    # One vCPU's table, where it was recorded; none where it was not.
    one = json.loads(ok("exits", a, "--vcpu", "0", "--json", "--results", results))
    assert one["cells"][0]["total_samples"] == 9721
    res = vmtax("exits", b, "--vcpu", "0", "--results", results)
    assert res.returncode == 2 and "no --event=vmexit --vcpu=0 recorded" in res.stderr


def test_a_target_with_several_workloads_is_diffed_one_workload_at_a_time(tmp_path):
    """Found by the lab: a run of cpu and memory with exits, `exits diff RUN:kvm RUN:tuned`
    said "name one target as RUN:TARGET" though a target was named."""
    from vmtax.helpers import perf_kvm

    store = Store(tmp_path / "results")
    run = store.new_run({}, {}, "test")
    for target, report in (("kvm", "classic-svm.txt"), ("tuned", "hists-svm.txt")):
        store.set_target(run, target, "vm", {})
        for workload in ("cpu", "memory"):
            store.add_rep(run, target=target, workload=workload, params={}, phase="collect",
                          idx=0, status="ok", argv=["exits"], started=0.0,
                          metrics=perf_kvm.parse((FIXTURES / report).read_text()).metrics())
    store.finish_run(run, "done")
    store.close()
    results = str(tmp_path / "results")
    res = vmtax("exits", "diff", f"{run}:kvm", f"{run}:tuned", "--results", results)
    assert res.returncode == 2
    assert res.stderr.strip().endswith("name one workload with --workload (cpu, memory)")
    data = json.loads(ok("exits", "diff", f"{run}:kvm", f"{run}:tuned", "--workload", "memory",
                         "--json", "--results", results))
    assert data["a"]["cell"].endswith("memory") and data["b"]["cell"].endswith("memory")
    shown = json.loads(ok("exits", f"{run}:kvm", "--workload", "cpu", "--json",
                          "--results", results))
    assert [c["workload"] for c in shown["cells"]] == ["cpu"]
    res = vmtax("exits", f"{run}:kvm", "--workload", "fileio", "--results", results)
    assert res.stderr.strip() == (f"vmtax: error: {run}:kvm: no workload 'fileio' recorded VM "
                                  "exits; these did: cpu, memory")


README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example(subcommand: str) -> list[str]:
    """The README's example of `vmtax exits SUBCOMMAND`, as the words after `vmtax`."""
    found = [words[1:] for line in README.read_text().splitlines()
             if line.startswith(".venv/bin/vmtax exits " + subcommand)
             for words in [shlex.split(line, comments=True)]]
    assert len(found) == 1, f"README: {len(found)} examples of `vmtax exits {subcommand}`"
    return found[0]


def test_the_readme_example_of_import_and_diff_runs_as_written(tmp_path):
    """The README imports a.txt as rt-pinned, then diffs gp-pinned against it by label; gp-pinned
    is imported by the same line with its own report and label. E2's pair of reports stands in
    for the two (EXTERNAL_INTERRUPT at 4.11% and 0.35% of samples)."""
    imported, diff = readme_example("import"), readme_example("diff")
    file, label = imported[imported.index("import") + 1], imported[imported.index("--label") + 1]
    a, b = diff[diff.index("diff") + 1:][:2]
    assert b == label != a, "the README's diff names its import second"
    shutil.copy(FIXTURES / "e2-rt-pinned.txt", tmp_path / file)
    shutil.copy(FIXTURES / "e2-rt-unpinned.txt", tmp_path / "gp.txt")
    env = {"VMTAX_RESULTS": str(tmp_path / "results")}
    for argv in ([*imported[:imported.index(file)], "gp.txt", "--label", a], imported):
        done = vmtax(*argv, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
    res = vmtax(*diff, cwd=tmp_path, env={**env, "COLUMNS": "160"})
    assert res.returncode == 0, res.stderr
    header, row = (next(cells for line in res.stdout.splitlines()
                        if (cells := _columns(line))[:1] == [first])
                   for first in ("reason", "EXTERNAL_INTERRUPT"))
    # The shares on both sides and the change in percentage points.
    assert header[:4] == ["reason", "A %", "B %", "Δ pp"]
    assert row[:4] == ["EXTERNAL_INTERRUPT", "4.11", "0.35", "-3.76"], res.stdout
    assert f":{a} · imported: 10,000 exits" in res.stdout
    assert f":{b} · imported: 10,000 exits" in res.stdout


def _columns(line: str) -> list[str]:
    """The cells of a table's line: its columns are two spaces apart or more."""
    return re.split(r"\s{2,}", line.strip())


# A lab run's cell, as a user saw it: 4,587 exits "handled in 96,211,784 µs" over 5.20 s of
# workload time on 2 vCPUs, and one hlt exit of 45.71 s.
NESTED_REPORT = """
Analyze events for all VMs, all VCPUs:

             VM-EXIT    Samples  Samples%     Time%    Min Time    Max Time         Avg time

                 hlt       1800    39.24%    99.48%      5.00us  45710000.00us  53172.50us ( +-  80.00% )
                  io       2787    60.76%     0.52%      2.00us   40000.00us    179.54us ( +-  30.00% )

Total Samples:4587, Total events handled time:96211784.00us.
"""  # noqa: E501 (perf's own line width)


def test_exit_times_no_workload_time_allows_are_not_given_as_facts(tmp_path):
    """Found in the lab: single exits "lasting" 37-46 s, and 18 times the workload's time on
    2 vCPUs in exits, printed as hlt 99.48% of the time. perf times an exit until the
    vCPU's next entry: across the guest's pauses between repetitions. The samples and
    their shares stand; the times are withheld, saying why."""
    from vmtax.core.types import Metric
    from vmtax.helpers import perf_kvm

    store = Store(tmp_path / "results")
    run = store.new_run({}, {}, "test")
    for target, report in (("kvm", NESTED_REPORT),
                           ("kvm-tuned", (FIXTURES / "classic-svm.txt").read_text())):
        store.set_target(run, target, "vm", {"vcpus": 2})
        store.add_rep(run, target=target, workload="cpu", params={}, phase="measure",
                      idx=0, status="ok", argv=["sysbench"], started=0.0, host_elapsed=5.2,
                      metrics=[Metric("events_per_sec", 10.0, "events/s", True)])
        store.add_rep(run, target=target, workload="cpu", params={}, phase="collect",
                      idx=0, status="ok", argv=["exits"], started=0.0,
                      metrics=perf_kvm.parse(report).metrics())
    store.finish_run(run, "done")
    store.close()
    results = str(tmp_path / "results")
    [cell] = json.loads(ok("exits", f"{run}:kvm", "--json", "--results", results))["cells"]
    assert cell["times_impossible"] == ("an exit lasted 45.7 s, longer than the 5.20 s of "
                                        "workload time the recording spans")
    hlt = next(r for r in cell["reasons"] if r["reason"] == "hlt")
    assert (hlt["share"], hlt["time_share"], hlt["max"], hlt["avg"]) == (39.24, None, None, None)
    text = ok("exits", f"{run}:kvm", "--results", results)
    flat = " ".join(text.split())
    assert "4.571e+07" not in text and "99.48" not in text and "45,710,000" not in text
    assert "4,587 exits over 5.20 s of workload time; their times are not shown, as they " \
           "cannot be true" in flat
    diff = " ".join(ok("exits", "diff", f"{run}:kvm", f"{run}:kvm-tuned", "--results",
                       results).split())
    assert "A's exit times cannot be true" in diff and "+98.33" not in diff
    # The other cell's times can be true: they are given.
    [tuned] = json.loads(ok("exits", f"{run}:kvm-tuned", "--json", "--results",
                            results))["cells"]
    assert tuned["times_impossible"] is None and tuned["reasons"][0]["time_share"] == 98.33
