"""The command line as a user meets it: real subprocesses, real sysbench, real SQLite."""

import inspect
import json
import os
import re
import subprocess
import sys

import click
import pytest
from conftest import ROOT, vmtax

from vmtax.core import target as targets
from vmtax.host import kvm


@pytest.mark.parametrize("args, message", [
    pytest.param(["run", "--targets", "native,xen"],
                 "vmtax: error: unknown target 'xen'; known targets: "
                 + ", ".join(targets.known_names()), marks=pytest.mark.plugin_lists),
    (["run", "--workloads", "nosuchload"],
     "vmtax: error: unknown workload 'nosuchload'; known workloads: "),
    (["run", "--runs", "many"],
     "vmtax: error: --runs takes a whole number from 1 to 1000000000 or 'auto', got 'many'"),
    (["run", "--runs", "auto", "--min-runs", "9", "--max-runs", "3"],
     "vmtax: error: --max-runs (3) must be at least --min-runs (9)"),
    (["run", "--targets", "vm", "--qemu", "/nonexistent/qemu-system-x86_64", "--workloads", "cpu"],
     "vmtax: error: "),
    # Read commands never create a results directory or database.
    (["show", "nope"], "vmtax: error: no results database at "),
    (["compare", "a", "b"], "vmtax: error: no results database at "),
    (["export", "last", "--csv", "-"], "vmtax: error: no results database at "),
])
def test_bad_input_is_one_line_without_traceback(tmp_path, args, message):
    res = vmtax(*args, "--results", str(tmp_path / "results"), cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(message), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    if args[0] != "run":
        assert not (tmp_path / "results").exists()
    assert "Traceback" not in res.stderr


def test_accel_kvm_where_kvm_cannot_run_this_guest_says_why(tmp_path):
    status = kvm.probe()
    if status.usable:
        pytest.skip("KVM runs guests on this host")
    res = vmtax("run", "--targets", "native,vm", "--accel", "kvm", "--workloads", "cpu",
                "--results", str(tmp_path / "results"))
    assert res.returncode == 2
    assert res.stderr == f"vmtax: error: --accel kvm: {status.reason}; use --accel tcg or auto\n"
    # This machine; only a user who may open /dev/kvm gets as far as the vCPU test that
    # finds kvm_pvm (others are told to join the device's group).
    if os.path.exists("/sys/module/kvm_pvm") and os.access("/dev/kvm", os.R_OK | os.W_OK):
        assert "KVM is present but provided by kvm_pvm" in status.reason


def test_results_dir_not_writable(tmp_path):
    (tmp_path / "file").write_text("")
    res = vmtax("run", "--targets", "native", "--results", str(tmp_path / "file" / "r"))
    assert res.returncode == 2
    assert "is not writable" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_help_teaches():
    res = vmtax("--help")
    assert res.returncode == 0 and "vmtax run" in res.stdout and "vmtax doctor" in res.stdout
    res = vmtax("run", "--help")
    for option in ("--targets", "--workloads", "--runs", "--warmup", "--time", "--results",
                   "--qemu", "--accel", "--vcpus", "--memory", "--json"):
        assert option in res.stdout


@pytest.mark.live
def test_run_runs_show_and_compare_on_native(tmp_path):
    results = str(tmp_path / "results")
    first = vmtax("run", "--targets", "native", "--workloads", "cpu", "--runs", "3",
                  "--time", "1", "--results", results, "--json", check=True)
    data = json.loads(first.stdout)
    run_id = data["run"]["id"]
    rows = {r["metric"]: r for r in data["summary"]["rows"]}
    cell = rows["events/s"]["cells"]["native"]
    assert cell["n"] == 3 and cell["summary"]["median"] > 0
    assert data["run"]["host"]["cpu_model"]

    table = vmtax("show", run_id[:17], "--results", results, check=True).stdout
    assert "events/s" in table and run_id in table

    listed = json.loads(vmtax("runs", "--results", results, "--json", check=True).stdout)
    assert [r["id"] for r in listed] == [run_id] and listed[0]["workloads"] == ["cpu"]

    # A second run with more work per event: compare must call it worse on events/s.
    vmtax("run", "--targets", "native", "--workloads", "cpu", "--runs", "3", "--time", "1",
          "--results", results, check=True)
    cmp = json.loads(vmtax("compare", run_id, "last", "--results", results, "--json",
                           check=True).stdout)
    by_metric = {r["metric"]: r for r in cmp["rows"]}
    assert by_metric["events/s"]["comparison"]["n_a"] == 3
    assert by_metric["events/s"]["comparison"]["verdict"] in ("~", "better", "worse")
    res = vmtax("compare", f"{run_id}:vm", "last:native", "--results", results)
    assert res.returncode == 2 and f"run {run_id} has no target 'vm'" in res.stderr


def test_compare_json_says_too_few_runs_and_below_resolution(tmp_path):
    # issue 18: n=2 per side printed "~" next to -83%, and a latency median of 0 "+inf%".
    from vmtax.core.types import Metric
    from vmtax.results.store import Store

    store = Store(tmp_path)
    ids = []
    for eps in ([100.0, 101.0], [17.0, 18.0]):
        run_id = store.new_run({"targets": [{"name": "native"}]}, {}, "0")
        store.set_target(run_id, "native", "native", {"bare_host": True})
        for i, value in enumerate(eps):
            store.add_rep(run_id, target="native", workload="cpu", params={}, phase="measure",
                          idx=i, status="ok", argv=[], started=0.0,
                          metrics=[Metric("events/s", value, "events/s", True),
                                   Metric("latency avg", 0.0, "ms", False)])
        store.finish_run(run_id, "done")
        ids.append(run_id)
    store.close()
    out = vmtax("compare", *ids, "--results", str(tmp_path), "--json", check=True)
    rows = {r["metric"]: r["comparison"] for r in json.loads(out.stdout)["rows"]}
    assert rows["events/s"]["verdict"] == "too few runs"
    assert rows["events/s"]["note"].startswith("n=2 per side: the smallest possible p is 0.33")
    assert rows["latency avg"]["verdict"] == "below resolution"
    table = vmtax("compare", *ids, "--results", str(tmp_path), check=True).stdout
    # "below resolution" wraps in its column
    assert "need ≥ 5 runs" in table and "resolution" in table and "inf" not in table


def test_resuming_a_run_another_vmtax_executes_is_refused_before_anything_runs(tmp_path):
    from vmtax.host import proc
    from vmtax.results.store import Store
    from vmtax.studies import plan as plan_mod

    store = Store(tmp_path / "results")
    run_id = store.new_run(plan_mod.from_names(["native"], ["cpu"]).to_dict(), {}, "0")
    other = proc.spawn(["sleep", "30"])     # stands for the vmtax executing it
    with store.db:
        store.db.execute("UPDATE runs SET pid = ?, pid_start = ?",
                         (other.pid, proc.process_start_time(other.pid)))
    try:
        res = vmtax("run", "--resume", run_id, "--results", str(tmp_path / "results"))
    finally:
        proc.kill_group(other)
    assert res.returncode == 2
    assert res.stderr == f"vmtax: error: run {run_id} is in progress (PID {other.pid})\n"
    assert not list((tmp_path / "results").glob(".work-*"))


def test_lazily_loaded_commands_keep_their_own_help():
    """`vmtax --help` shows lazy commands' help from the group's table without importing
    them: it must say what the command itself says."""
    import click

    from vmtax.cli.main import cli
    ctx = click.Context(cli)
    for name, (_, text) in cli.LAZY.items():
        command = cli.get_command(ctx, name)
        assert command is not None and command.get_short_help_str(1000) == \
            click.Command(name, help=text).get_short_help_str(1000), name


def test_help_imports_nothing_heavy():
    code = ("import sys; sys.argv = ['vmtax', '--help']\n"
            "from vmtax.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "heavy = {'numpy', 'scipy', 'matplotlib', 'pydantic', 'ray', 'asyncssh', 'jinja2'}\n"
            "print(sorted(heavy & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_run_gets_one_request_and_how_to_show_it_not_its_flags(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from vmtax.cli import main
    from vmtax.studies import comparison
    from vmtax.studies.requests import FleetRequest, RunRequest

    assert list(inspect.signature(main.run.callback.__wrapped__).parameters) == [
        "request", "output"]
    asked = []

    def plan_of(request, store):
        asked.append(request)
        raise SystemExit(0)
    monkeypatch.setattr(comparison, "plan_of", plan_of)
    results = str(tmp_path / "r")
    done = CliRunner().invoke(main.cli, [
        "run", "--targets", "native,vm", "--workloads", "cpu", "--runs", "auto",
        "--min-runs", "3", "--max-runs", "7", "--ci-target", "5", "--vcpus", "2",
        "--vcpus", "big=4", "--collect", "host-cpu", "--no-interleave", "--name", "nightly",
        "--fleet", "head:6379", "--hosts", "a,b", "--time", "3", "--results", results])
    assert done.exit_code == 0, done.output
    assert asked == [RunRequest(
        targets=["native", "vm"], workloads=["cpu"], target_options={"vcpus": ["2", "big=4"]},
        runs="auto", min_runs=3, max_runs=7, ci_target=5.0, time=3, collect=["host-cpu"],
        interleave=False, name="nightly", fleet=FleetRequest("head:6379", ["a", "b"], None))]


def _run_params():
    """`vmtax run`'s parameters, its help option aside."""
    from vmtax.cli import main

    ctx = click.Context(main.run)
    return [p for p in main.run.get_params(ctx) if p is not main.run.get_help_option(ctx)]


def test_run_s_flags_are_made_from_the_declarations_alone():
    """Issue 46.5: `vmtax run` declared 22 click options by hand beside the RunRequest it
    fills. Now each is a field's declaration (RunRequest, FleetRequest, RunOutput), or a
    target option a plugin marks cli=True; the command declares none of its own."""
    import dataclasses

    from vmtax.cli import main, run_flags
    from vmtax.core import plugin
    from vmtax.core import target as targets

    assert main.run.params == _run_params()
    declared = {run_flags._key(record, f.name) for record in run_flags.RECORDS
                for f in dataclasses.fields(record) if "flag" in f.metadata}
    marked = {run_flags.TARGET_FLAG + info.field for kind in targets.kinds().values()
              for info in plugin.option_infos(kind.Options).values() if info.cli}
    assert {p.name for p in _run_params()} == declared | marked
    helps = {p.name: p.help for p in _run_params() if isinstance(p, click.Option)}
    assert all(helps[name] for name in declared - {"runrequest__plan_file"})


def test_a_shared_flag_says_what_it_means_for_each_kind():
    """Issue 48.12: --machine had libvirt's default, q35, though vm's is microvm; --cpus
    had LXD's meaning, a count, though a container's is a host CPU list."""
    from vmtax.cli import run_flags

    helps = {p.name: p.help for p in _run_params() if isinstance(p, click.Option)}
    machine = helps[run_flags.TARGET_FLAG + "machine"]
    assert re.search(r"libvirt: .*\[default: q35\]", machine), machine
    assert re.search(r"vm: QEMU machine type \[default: microvm\]", machine), machine
    cpus = helps[run_flags.TARGET_FLAG + "cpus"]
    assert "container: Host CPUs the container may run on (a cpuset)" in cpus
    assert "lxd: limits.cpu as a count" in cpus


@pytest.mark.parametrize("args, said", [
    (["run", "--targets", "native", "--workloads", "cpu", "--qemu", "/usr/bin/qemu"],
     "--qemu: no target of this run takes it (it is an option of vm), so it would do nothing"),
    (["run", "--resume", "20261201-000000-0000", "--targets", "native", "--time", "3"],
     "--targets, --time would do nothing here: --resume goes on with the run as it was "
     "planned and stored"),
    (["run", "plans/hugepages.toml", "--quick", "--runs", "3", "--vcpus", "1"],
     "--runs, --vcpus would do nothing here: PLAN.toml says what to run; set it there"),
    (["run", "--targets", "native", "--workloads", "cpu,cpu"],
     "workload names must be unique, got cpu, cpu"),
])
def test_a_flag_that_would_do_nothing_is_refused_in_one_line(tmp_path, args, said):
    """Issue 48.13: --qemu with no VM target, --resume with other flags (and a plan file
    with the classic plan's), --workloads cpu,cpu (which ran twice) did nothing silently."""
    result = vmtax(*args, "--dry-run", "--results", str(tmp_path), cwd=ROOT)
    assert result.returncode == 2 and result.stderr == f"vmtax: error: {said}\n", result.stderr


def test_resuming_a_finished_run_says_so_and_starts_nothing(tmp_path):
    from test_history import add_run

    from vmtax.results.store import Store

    run_id = add_run(Store(tmp_path), "nightly", {"vm:tcg": 100})
    result = vmtax("run", "--resume", run_id, "--results", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert f"run {run_id} is finished: nothing to resume" in result.stderr
    assert f"run {run_id} (nightly)" in result.stdout


def test_dry_run_says_what_a_collector_cannot_record_here(tmp_path):
    """Issue 48.13: --collect exits on a host without usable KVM: --dry-run accepted it."""
    result = vmtax("run", "--targets", "native,vm:tcg", "--workloads", "cpu", "--collect",
                   "exits", "--dry-run", "--results", str(tmp_path), check=True)
    status = kvm.probe()
    assert ("warning: --collect exits: cannot record VM exits: no usable KVM" in result.stdout
            ) == (not status.usable), result.stdout
