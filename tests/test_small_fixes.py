"""Issue 30, item 10: doctor takes the version line of tools that fail on --version, and
why a collector could not record is said once for all the targets it holds for (every
TCG guest of plans/exits.toml), in the run's warnings, its table and `vmtax exits`."""

import stat

from conftest import vmtax, warnings_reporter

from vmtax.core.types import Metric
from vmtax.host import doctor
from vmtax.report.terminal import grouped_notes
from vmtax.results.store import Store
from vmtax.studies import plan as plan_mod
from vmtax.studies.runner import Runner

TCG_GUESTS = ["gp[pin=1]", "gp[pin=none]", "rt[pin=1]", "rt[pin=none]"]
KVM_UNUSABLE = ("(and KVM is unusable here: /dev/kvm is kvm_pvm, the PVM module, which "
                "cannot run a stock guest kernel)")


def _tool(directory, name, script):
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_doctor_takes_a_version_line_whatever_the_exit_status(tmp_path, monkeypatch):
    # dbench has no --version and ffmpeg's is -version: both print it, then exit 1.
    _tool(tmp_path, "dbench", 'echo "dbench version 4.00 - Copyright Andrew Tridgell"\n'
                              'echo "Invalid option --version: unknown option" >&2; exit 1\n')
    _tool(tmp_path, "ffmpeg", 'echo "ffmpeg version 5.1.9-0+deb12u1 Copyright" >&2; exit 1\n')
    # A broken one stays broken: its loader names a symbol version, not a version number.
    _tool(tmp_path, "broken", "echo \"broken: /lib/libc.so.6: version `GLIBC_2.34' not "
                              "found\" >&2; exit 1\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    dbench = doctor._tool_check("dbench", "apt-get install dbench")
    assert dbench.ok and dbench.detail.endswith("dbench version 4.00 - Copyright Andrew "
                                                "Tridgell")
    assert doctor._tool_check("ffmpeg", "apt-get install ffmpeg").ok
    broken = doctor._tool_check("broken", "apt-get install broken")
    assert not broken.ok and "does not answer --version" in broken.detail


def _tcg_notes():
    return [f"{t} · cyclictest: exits: unavailable — {t} runs under TCG, which has no VM "
            f"exits {KVM_UNUSABLE}" for t in TCG_GUESTS]


def test_the_same_why_of_several_targets_is_one_note():
    notes = _tcg_notes() + ["native · cpu: host-cpu: unavailable — native is the host",
                            "a note of another shape"]
    assert grouped_notes(notes) == [
        "gp[pin=1], gp[pin=none], rt[pin=1], rt[pin=none] · cyclictest: exits: unavailable "
        f"— each runs under TCG, which has no VM exits {KVM_UNUSABLE}",
        "native · cpu: host-cpu: unavailable — native is the host",
        "a note of another shape"]


def _tcg_run(results):
    store = Store(results)
    run = store.new_run({"targets": [{"name": t} for t in TCG_GUESTS],
                         "baseline": TCG_GUESTS[1]}, {}, "test")
    for target, note in zip(TCG_GUESTS, _tcg_notes()):
        store.set_target(run, target, "vm", {"kind": "vm", "accel": "tcg"})
        store.add_rep(run, target=target, workload="cyclictest", params={"threads": 1},
                      phase="measure", idx=0, status="ok", argv=["cyclictest"], started=0.0,
                      host_elapsed=2.0,
                      metrics=[Metric("latency max", 40.0, "µs", False, {"thread": "0"})])
        store.add_rep(run, target=target, workload="cyclictest", params={"threads": 1},
                      phase="collect", idx=0, status="unavailable", argv=["exits"],
                      started=0.0, error=note.split(": ", 1)[1])
    store.finish_run(run, "done")
    store.close()
    return run


def test_show_and_exits_say_why_not_once(tmp_path):
    run = _tcg_run(tmp_path)
    shown = vmtax("show", run, "--results", str(tmp_path), env={"COLUMNS": "80"})
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("runs under TCG") == 1, shown.stdout
    assert "not recorded gp[pin=1], gp[pin=none], rt[pin=1], rt[pin=none] · cyclictest" \
        in shown.stdout
    exits = vmtax("exits", run, "--results", str(tmp_path))
    assert exits.returncode == 2 and exits.stderr.count("runs under TCG") == 1, exits.stderr


def test_the_run_warns_once_of_a_collector_no_target_can_feed(tmp_path):
    plan = plan_mod.from_names(["vm:tcg"], ["cyclictest"], collect=["exits"])
    warnings = warnings_reporter()
    runner = Runner(plan, Store(tmp_path), warnings)
    runner.run_id = runner.store.new_run(plan.to_dict(), {}, "test")
    workload = plan.workloads[0].make(plan.time)
    for target, note in zip(TCG_GUESTS, _tcg_notes()):
        runner._store_collected(target, workload, 0, "exits", [], note.split(": ", 1)[1])
    runner._store_collected("native", workload, 0, "exits", [],
                            "exits: unavailable — native is no VM")
    assert warnings.lines == [_tcg_notes()[0].replace(": ", " · ", 1),
                             "native · cyclictest · exits: unavailable — native is no VM"]


def test_a_listing_cut_short_by_its_reader_is_no_failure(tmp_path):
    """Issue 48.17: `vmtax list targets | head -1` exited 1, so pipefail scripts broke."""
    import subprocess

    from conftest import VMTAX

    for what in ("targets", "collectors", "workloads"):
        listing = subprocess.Popen([*VMTAX, "list", what], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE)
        assert listing.stdout.readline()
        listing.stdout.close()
        assert listing.wait(timeout=60) == 0 and listing.stderr.read() == b"", what


def test_list_collectors_says_what_each_needs(tmp_path):
    """Issue 48.17: exits and profile said "needs: nothing"; they need perf."""
    from conftest import vmtax

    listing = vmtax("list", "collectors", check=True).stdout
    for name in ("exits", "profile"):
        block = listing[listing.index(f"{name} — "):]
        assert block.splitlines()[2] == "  needs: the Debian package linux-perf", block[:300]


def test_doctor_says_the_load_once():
    from vmtax.host import quiet

    snap = {"load": [6.3, 6.0, 5.0], "cpus": 2, "busiest": [], "governors": [],
            "turbo": None, "smt": False}
    line = quiet.doctor_line(snap)
    assert line.count("6.3") == 1 and "load average 6.3 on 2 CPUs" in line


def test_an_interrupted_run_s_listing_says_what_is_missing(tmp_path):
    from conftest import vmtax

    from vmtax.results.store import Store

    store = Store(tmp_path)
    plan = {"targets": [{"name": "native"}, {"name": "vm"}], "runs": 2,
            "workloads": [{"name": "cpu", "params": {}}, {"name": "mutex", "params": {}}]}
    run_id = store.new_run(plan, {"hostname": "h"}, "0")
    for target in ("native", "vm"):
        for idx in range(2 if target == "native" else 1):
            store.add_rep(run_id, target=target, workload="cpu", params={}, phase="measure",
                          idx=idx, status="ok", argv=[], started=0.0)
    store.db.execute("UPDATE runs SET pid = 999999999 WHERE id = ?", (run_id,))
    store.db.commit()
    store.close()
    listing = vmtax("runs", "--results", str(tmp_path), check=True).stdout
    assert (f"{run_id} interrupted, missing native · mutex (0 of 2), vm · cpu (1 of 2), "
            f"vm · mutex (0 of 2); continue it: vmtax run --resume {run_id}") in " ".join(
                listing.split())
