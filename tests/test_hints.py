"""Every command vmtax prints for the user works as pasted (issue 36, item 6): it carries
--results DIR when the results directory is not the default, quoted as a shell needs it."""

import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import start_vmtax, vmtax

from vmtax.core import hints
from vmtax.core.errors import VmtaxError
from vmtax.results.store import Store

GOLDEN = Path(__file__).parent / "fixtures" / "golden" / "golden.sqlite"


def pasted(line: str, cwd: Path) -> subprocess.CompletedProcess:
    """line run by a shell, as a user pasting it would, with this venv's vmtax on PATH."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "COLUMNS": "100"}
    env.pop("VMTAX_RESULTS", None)
    return subprocess.run(["sh", "-c", line], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_hint_names_the_results_directory_unless_it_is_the_default(monkeypatch):
    monkeypatch.delenv("VMTAX_RESULTS", raising=False)
    assert hints.command("show", "last", "--all", results="results") == "vmtax show last --all"
    assert hints.command("show", "last", results="./results/") == "vmtax show last"
    assert (hints.command("run", "--resume", "r1", results="my results")
            == "vmtax run --resume r1 --results 'my results'")
    assert (hints.command("trend", "it's", results="/a;b")
            == "vmtax trend 'it'\"'\"'s' --results '/a;b'")
    monkeypatch.setenv("VMTAX_RESULTS", "/srv/r")
    assert hints.command("runs", results="/srv/r") == "vmtax runs"
    assert hints.command("runs", results="results") == "vmtax runs --results results"


def golden_copy(tmp_path: Path) -> Path:
    results = tmp_path / "my [results]; x"
    results.mkdir()
    shutil.copy(GOLDEN, results / "vmtax.sqlite")
    return results


def test_the_show_all_hint_works_when_pasted(tmp_path):
    results = golden_copy(tmp_path)
    shown = vmtax("show", "golden-a", "--results", str(results), env={"COLUMNS": "80"},
                  check=True).stdout
    hint = re.search(r"more metric rows: (vmtax .*)$", shown, re.MULTILINE).group(1)
    assert shlex.split(hint)[-2:] == ["--results", str(results)]
    got = pasted(hint, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert "more metric rows" not in got.stdout and len(got.stdout) > len(shown)


def test_an_unknown_run_points_to_the_listing_of_its_own_store(tmp_path):
    results = golden_copy(tmp_path)
    with pytest.raises(VmtaxError) as caught:
        Store(results, readonly=True).load_run("nope")
    hint = re.search(r"`(vmtax [^`]*)` lists them", str(caught.value)).group(1)
    got = pasted(hint, cwd=tmp_path)
    assert got.returncode == 0 and "golden-a" in got.stdout, got.stderr


def test_an_empty_store_says_how_to_start_a_run_there(tmp_path):
    results = tmp_path / "empty one"
    Store(results).db.close()
    said = vmtax("runs", "--results", str(results), check=True).stdout
    assert f"start one with `vmtax run --results '{results}'`" in said


def test_a_plan_given_to_the_other_command_is_run_into_the_same_store(tmp_path):
    results = tmp_path / "my results"
    res = vmtax("density", "plans/classic.toml", "--results", str(results),
                cwd=Path(__file__).parents[1])
    assert res.returncode == 2
    assert res.stderr.rstrip().endswith(
        f"run it with `vmtax run plans/classic.toml --results '{results}'`")


def interrupted_run(results: Path, runs: int, after: int) -> str:
    """Ctrl-C a native cpu run of `runs` repetitions once `after` are stored; its stderr."""
    proc = start_vmtax("run", "--targets", "native", "--workloads", "cpu", "--runs", str(runs),
                       "--warmup", "0", "--time", "1", "--results", str(results))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            db = sqlite3.connect(results / "vmtax.sqlite")
            reps, = db.execute("SELECT count(*) FROM reps").fetchone()
            db.close()
            if reps >= after:
                break
        except sqlite3.OperationalError:
            pass
        time.sleep(0.2)
    proc.send_signal(2)
    return proc.communicate(timeout=60)[1]


@pytest.mark.live
def test_the_resume_hint_after_ctrl_c_works_when_pasted(tmp_path):
    results = tmp_path / "my results"
    err = interrupted_run(results, runs=5, after=2)
    found = re.search(r"continue it with: (vmtax .*)\)$", err, re.MULTILINE)
    assert found, err
    hint = found.group(1)
    assert shlex.split(hint)[-2:] == ["--results", str(results)]
    got = pasted(hint, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    db = sqlite3.connect(results / "vmtax.sqlite")
    assert db.execute("SELECT status, count(*) FROM runs").fetchone() == ("done", 1)
    assert not (tmp_path / "results").exists()   # the default store was never touched


# -- item 9: progress without a terminal reports every cell, sweeps included -----------------

def test_each_configuration_of_a_sweep_is_named_by_what_varies():
    from vmtax.studies.plan import WorkloadSpec, point_labels

    specs = [WorkloadSpec("memory", {"threads": t, "memory-block-size": b, "time": 1})
             for t in (1, 2) for b in ("16K", "1M")]
    specs += [WorkloadSpec("serving", {"mode": "rate", "download_rates": [10.0, 20.0]}),
              WorkloadSpec("serving", {"mode": "workers", "workers": 2}),
              WorkloadSpec("fio", {"rw": "read"}), WorkloadSpec("fio", {"size": "1M"}),
              WorkloadSpec("cpu", {"cpu-max-prime": 100})]
    assert point_labels(specs) == [
        "memory threads=1 memory-block-size=16K", "memory threads=1 memory-block-size=1M",
        "memory threads=2 memory-block-size=16K", "memory threads=2 memory-block-size=1M",
        "serving mode=rate", "serving mode=workers", "fio #1", "fio #2", "cpu"]


def test_without_a_terminal_every_configuration_of_a_sweep_reports(capsys):
    from vmtax.cli.progress import ProgressReporter
    from vmtax.studies.plan import WorkloadSpec, point_labels

    labels = point_labels([WorkloadSpec("memory", {"threads": t}) for t in (1, 2, 4)])
    with ProgressReporter(estimate=10.0, per_cell=1) as reporter:
        reporter.start(6)
        for label in labels:            # as the runner steps: A B per configuration
            for target in ("native", "vm"):
                reporter.step(f"{target} · {label} · run 1")
                reporter.advance()
    lines = capsys.readouterr().err.splitlines()
    # A line as each cell starts too (found in the lab: a piped run printed a few cells in
    # minutes, and never which one was running).
    assert [line.split(" done")[0] for line in lines] == [
        "[0/6] native · memory threads=1 starts", "[1/6] native · memory threads=1",
        "[1/6] vm · memory threads=1 starts", "[2/6] vm · memory threads=1",
        "[2/6] native · memory threads=2 starts", "[3/6] native · memory threads=2",
        "[3/6] vm · memory threads=2 starts", "[4/6] vm · memory threads=2",
        "[4/6] native · memory threads=4 starts", "[5/6] native · memory threads=4",
        "[5/6] vm · memory threads=4 starts", "[6/6] vm · memory threads=4"]


def test_a_resumed_cell_that_had_some_repetitions_reports_when_it_finishes(capsys):
    """A resumed run counts what it had into its cells: a cell 2 of whose 3 repetitions
    were stored reports when its third finishes (it printed nothing); a cell stored whole
    is no news."""
    from vmtax.cli.progress import ProgressReporter
    from vmtax.studies.runner import STORED_BEFORE

    with ProgressReporter(estimate=10.0, per_cell=3) as reporter:
        reporter.start(6)
        for target, stored in (("native", 3), ("vm", 2)):
            for i in range(3):
                reporter.step(f"{target} · cpu · {STORED_BEFORE if i < stored else 'run 3'}")
                reporter.advance()
    assert [line.split(" done")[0] for line in capsys.readouterr().err.splitlines()] == [
        "[5/6] vm · cpu starts", "[6/6] vm · cpu"]


@pytest.mark.live
def test_resuming_a_partly_done_cell_reports_it(tmp_path):
    results = tmp_path / "r"
    err = interrupted_run(results, runs=3, after=1)
    run_id = re.search(r"--resume (\S+)", err).group(1)
    res = vmtax("run", "--resume", run_id, "--results", str(results), check=True)
    assert re.search(r"^\[3/3\] native · cpu done, ", res.stderr, re.MULTILINE), res.stderr


@pytest.mark.live
def test_a_piped_sweep_reports_every_cell(tmp_path):
    plan = tmp_path / "sweep.toml"
    plan.write_text('runs = 1\nwarmup = 0\ntime = 1\n[targets.native]\n'
                    '[[workloads]]\nname = "cpu"\n'
                    '[workloads.params]\ncpu-max-prime = [100, 200, 300]\n')
    res = vmtax("run", str(plan), "--results", str(tmp_path / "r"), check=True)
    # Each cell says when it starts (issue 49.6) and when it is done.
    progress = [line.split(", ")[0] for line in res.stderr.splitlines()
                if line.startswith("[")]
    assert progress == [line for i, p in ((1, 100), (2, 200), (3, 300)) for line in (
        f"[{i - 1}/3] native · cpu cpu-max-prime={p} starts",
        f"[{i}/3] native · cpu cpu-max-prime={p} done")], res.stderr


# -- item 8: help and docs that agree with the program --------------------------------------

def test_list_targets_shows_what_tune_tries_and_each_unsafe_value(tmp_path):
    described = json.loads(vmtax("list", "targets", "--json", check=True).stdout)
    shown = " ".join(vmtax("list", "targets", env={"COLUMNS": "100"}, check=True).stdout.split())
    knobs = [o for kind in described for o in kind["options"] if o.get("tune")]
    unsafe = [(o, t) for o in knobs for t in o["tune"] if t["safety"]]
    assert knobs and unsafe
    for option in knobs:
        tried = ", ".join(json.dumps(t["value"]) for t in option["tune"])
        assert f"vmtax tune tries: {tried}" in shown, option["name"]
    for option, value in unsafe:
        said = " ".join(f'⚠ {json.dumps(value["value"])} is unsafe: {value["safety"]}'.split())
        assert said in shown, option["name"]


@pytest.mark.parametrize("have_go", [True, False])
def test_doctor_says_the_serving_server_is_built_on_first_use(tmp_path, monkeypatch, have_go):
    from vmtax.core import workload as workloads
    from vmtax.helpers import go_toolchain, serving_tools
    from vmtax.host import doctor

    httpd = workloads.registered()["serving"].binaries[1]
    which = shutil.which
    monkeypatch.setattr(doctor.shutil, "which",   # as where nothing is built yet
                        lambda name, *args: None if name == httpd else which(name, *args))
    monkeypatch.setattr(go_toolchain, "bootstrap_go", lambda: "/usr/bin/go" if have_go else None)
    checks = [check for make in doctor._plugin_checks() if (check := make()) is not None]
    found = next(c for c in checks if c.name == httpd)
    assert "not found on PATH" not in found.detail
    if have_go:
        assert found.ok and "the first serving run builds it from " in found.detail
        assert str(serving_tools.SOURCE) in found.detail and "/usr/bin/go" in found.detail
    else:
        assert not found.ok and "needs Go: apt-get install golang-go" in found.detail


def test_kvm_asked_for_by_a_target_name_names_that_target(tmp_path):
    from vmtax.host import kvm

    status = kvm.probe()
    if status.usable:
        pytest.skip("KVM runs guests on this host")
    res = vmtax("run", "--targets", "native,vm:kvm", "--workloads", "cpu",
                "--results", str(tmp_path / "results"))
    assert res.returncode == 2
    assert res.stderr == f"vmtax: error: vm:kvm: {status.reason}; use vm:tcg or vm:auto\n"


@pytest.mark.parametrize("table, args, asked", [
    ('[targets.vm]\naccel = "kvm"\n', (), 'plans/x.toml:3: [targets.vm] accel = "kvm"'),
    ('[targets.vm]\naccel = ["tcg", "kvm"]\n', (),
     'plans/x.toml:3: [targets.vm] accel = "kvm"'),
    ('[targets.vm]\naccel = "tcg"\n[quick.targets.vm]\naccel = "kvm"\n', ("--quick",),
     'plans/x.toml:5: [quick.targets.vm] accel = "kvm"'),
    ('[targets."vm:kvm"]\n', (), 'plans/x.toml:2: [targets."vm:kvm"] (its name sets accel '
                                 '= "kvm")'),
    ('[targets."vm:kvm"]\nkind = "vm"\n', (),
     'plans/x.toml:2: [targets."vm:kvm"] (its name sets accel = "kvm")'),
])
def test_kvm_asked_for_by_a_plan_file_names_its_line_not_a_flag(tmp_path, table, args, asked):
    """A plan's accel = "kvm" (or a table named vm:kvm) where KVM cannot run guests names
    what the user wrote there, not --accel, a flag they never typed."""
    from vmtax.host import kvm

    status = kvm.probe()
    if status.usable:
        pytest.skip("KVM runs guests on this host")
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "x.toml").write_text(
        '[targets.native]\n' + table + '\n[[workloads]]\nname = "cpu"\n')
    res = vmtax("run", "plans/x.toml", *args,
                "--results", "results", cwd=tmp_path)
    assert res.stderr == f'vmtax: error: {asked}: {status.reason}; use "tcg" or "auto"\n'


def test_a_plan_table_named_as_a_target_means_that_target():
    """[targets."vm:kvm"] is the vm:kvm of --targets (it ran TCG under that name before),
    and an option that contradicts its name is refused at its line."""
    from vmtax.studies import planfile

    plan = planfile.loads('[targets."vm:kvm"]\n[[workloads]]\nname = "cpu"\n', "p.toml")
    assert (plan.targets[0].kind, plan.targets[0].options) == ("vm", {"accel": "kvm"})
    with pytest.raises(planfile.PlanError) as caught:
        planfile.loads('[targets."vm:kvm"]\naccel = "tcg"\n[[workloads]]\nname = "cpu"\n',
                       "p.toml")
    assert str(caught.value) == ('p.toml:2: targets."vm:kvm".accel: expected "kvm", as the '
                                 'target\'s name says, got "tcg"')
    # A name that is not a target's keeps its kind from the kind key, its options its own.
    plan = planfile.loads('[targets.fast]\nkind = "vm"\n[[workloads]]\nname = "cpu"\n', "p.toml")
    assert plan.targets[0].options == {}


def test_a_misspelt_target_gets_a_did_you_mean_as_a_workload_does():
    from vmtax.core import target as targets

    for typo, meant in (("contianer:runc", "container:runc"), ("vm:kmv", "vm:kvm")):
        with pytest.raises(VmtaxError) as caught:
            targets.parse_name(typo)
        assert str(caught.value).endswith(f" (did you mean {meant!r}?)")


@pytest.mark.parametrize("args, message", [
    (["plan", "plans/classic.toml", "--results", "r"],
     "vmtax: error: No such option '--results'; `vmtax plan --help` lists what it takes"),
    (["run", "--runs"],
     "vmtax: error: Option '--runs' requires an argument; `vmtax run --help` lists what it "
     "takes"),
    (["nosuch"], "vmtax: error: No such command 'nosuch'; `vmtax --help` lists what it takes"),
])
def test_a_usage_mistake_is_one_line(args, message):
    res = vmtax(*args, cwd=Path(__file__).parents[1])
    assert res.returncode == 2 and res.stderr == message + "\n"
