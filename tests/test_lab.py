"""vmtax lab: its QEMU command line, its checks (AMD-V in TCG, kvm_amd, memory), the host's
check of the command before the lab boots, runs coming back into the host's store, and the
"nested" label every renderer shows."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import vmtax
from vmtax.core.errors import VmtaxError
from vmtax.guest import lab
from vmtax.host import machine
from vmtax.report import parts
from vmtax.results.store import Run, Store


def _kernel(tmp_path):
    return lab.LabKernel(tmp_path / "vmlinux", "6.1.0-56-amd64", tmp_path / "modules",
                         tmp_path / "initramfs.cpio")


def test_argv_is_a_tcg_q35_guest_with_amd_v_on_the_hosts_root_read_only(tmp_path):
    argv = lab.lab_argv("qemu-system-x86_64", _kernel(tmp_path), lab.Machine(), tmp_path,
                        tmp_path / "cache")
    assert argv[argv.index("-accel") + 1] == "tcg,thread=multi"
    assert argv[argv.index("-cpu") + 1] == "max,+svm,+npt"
    assert argv[argv.index("-M") + 1] == "q35"
    assert argv[argv.index("-smp") + 1] == "2" and argv[argv.index("-m") + 1] == "4096M"
    fsdevs = [argv[i + 1] for i, a in enumerate(argv) if a == "-fsdev"]
    assert fsdevs == ["local,id=host,path=/,security_model=none,readonly=on",
                      f"local,id=lab,path={tmp_path},security_model=none",
                      f"local,id=cache,path={tmp_path}/cache,security_model=none"]
    assert "-no-reboot" in argv   # the lab powers off by rebooting: QEMU then exits
    # The overlay's upper layer: a disk in the share, not the lab's RAM.
    assert f"if=none,id=upper,format=raw,file={tmp_path}/upper.img,cache=writeback" in argv
    # The commands' stdout and stderr, each on a console of its own (hvc0, hvc1).
    chardevs = [argv[i + 1] for i, a in enumerate(argv) if a == "-chardev"]
    assert chardevs[1:] == [f"file,id=out,path={tmp_path}/out.log",
                            f"file,id=err,path={tmp_path}/err.log"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-device"][-2:] == [
        "virtconsole,chardev=out", "virtconsole,chardev=err"]


def test_the_census_knobs_reach_qemus_command_line(tmp_path):
    """What the fault census varies (vmtax lab --cpu, --tb-size, --tcg-thread, --vcpus,
    --memory): the CPU model keeps AMD-V and nested paging whatever is asked."""
    machine = lab.Machine(vcpus=1, memory=2 << 30, cpu="EPYC,-x2apic", tb_size=256,
                          tcg_thread="single")
    argv = lab.lab_argv("qemu", _kernel(tmp_path), machine, tmp_path, tmp_path / "cache")
    assert argv[argv.index("-accel") + 1] == "tcg,thread=single,tb-size=256"
    assert argv[argv.index("-cpu") + 1] == "EPYC,-x2apic,+svm,+npt"
    assert argv[argv.index("-smp") + 1] == "1" and argv[argv.index("-m") + 1] == "2048M"
    assert lab.cpu_model("max,+svm,+npt") == "max,+svm,+npt"


def _fake_qemu(tmp_path, body: str) -> str:
    path = tmp_path / "qemu-fake"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_a_qemu_whose_tcg_lacks_svm_is_named_in_one_line(tmp_path):
    qemu = _fake_qemu(tmp_path, 'echo "$0: warning: TCG doesn\'t support requested feature: '
                      'CPUID.80000001H:ECX.svm [bit 2]" >&2; '
                      'echo "$0: TCG doesn\'t support requested features" >&2; exit 1')
    problem = lab.svm_problem(qemu)
    assert problem is not None and "does not emulate AMD-V" in problem
    assert "svm" in problem and "\n" not in problem
    assert lab.svm_problem(_fake_qemu(tmp_path, "cat >/dev/null; exit 0")) is None


def test_a_lab_larger_than_the_hosts_memory_is_refused(monkeypatch):
    monkeypatch.setattr(machine, "available_memory_bytes", lambda: 8 << 30)
    problem = lab.memory_problem(16 << 30)
    assert problem is not None and "16384 MiB" in problem and "--memory" in problem
    assert lab.memory_problem(4 << 30) is None


def test_a_guest_kernel_without_kvm_amd_is_named(tmp_path):
    # A kernel package with a module tree but no kvm_amd in it.
    pkg = tmp_path / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text(
        "Package: linux-image-9.9.9-test\nVersion: 1\nArchitecture: amd64\n"
        "Maintainer: t <t@t>\nDescription: t\n")
    (pkg / "lib" / "modules" / "9.9.9-test" / "kernel").mkdir(parents=True)
    deb = tmp_path / "k.deb"
    subprocess.run(["dpkg-deb", "-b", str(pkg), str(deb)], check=True, capture_output=True)
    (tmp_path / "lab").mkdir()
    with pytest.raises(VmtaxError, match=r"9\.9\.9-test .*has no kvm_amd module"):
        lab._build_lab_kernel(deb, "9.9.9-test", tmp_path / "lab" / "k")
    assert os.listdir(tmp_path / "lab") == []   # nothing half-built is left


def test_lab_run_refuses_what_run_refuses_before_the_lab_boots(tmp_path):
    direct = vmtax("run", "run", cwd=tmp_path, timeout=120)
    in_lab = vmtax("lab", "run", "run", cwd=tmp_path, timeout=120)
    assert direct.returncode == in_lab.returncode == 2
    assert in_lab.stderr == direct.stderr
    assert len(in_lab.stderr.strip().splitlines()) == 1
    assert "lab: booting" not in in_lab.stderr


@pytest.mark.parametrize("args, said", [
    (["lab", "--results", "a", "run", "--results", "b"], "--results a and --results b"),
    (["lab", "frobnicate"], "'frobnicate' is not a vmtax command the lab runs"),
    (["lab"], "give a COMMAND to run in the lab"),
    (["lab", "--vcpus", "64", "run"], "--vcpus 64: this host has"),
    (["lab", "--memory", "100T", "run"], "does not fit in this host's"),
    (["lab", "--kernel", "x;rm", "run"], "--kernel 'x;rm': expected a Debian kernel package"),
    (["lab", "lab", "run"], "'lab' is not a vmtax command the lab runs"),
    (["lab", "--memory", "512M", "run"], "--memory 512M: at least 1G"),
    (["lab", "--disk", "1G", "run"], "--disk 1G: at least 4G"),
])
def test_bad_lab_input_is_one_line(tmp_path, args, said):
    done = vmtax(*args, cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1


def _store_with_a_run(path: Path) -> tuple[Store, str]:
    from vmtax.core.types import Metric
    store = Store(path)
    run_id = store.new_run({"targets": ["native", "vm:kvm"]},
                           {"cpu_model": "lab", "lab": machine.LAB_LABEL}, "x")
    store.set_target(run_id, "vm:kvm", "vm", {"accel": "kvm"})
    store.add_rep(run_id, target="vm:kvm", workload="cpu", params={"threads": 1},
                  phase="measure", idx=0, status="ok", argv=["sysbench"], started=1.0,
                  metrics=[Metric("events_per_sec", 123.0, "events/s", True)])
    store.set_flags(run_id, [("vm:kvm", "cpu", {}, "events_per_sec", "noisy")])
    store.finish_run(run_id, "done")
    return store, run_id


def test_a_labs_runs_come_into_the_hosts_store_once_as_ordinary_runs(tmp_path):
    lab_store, run_id = _store_with_a_run(tmp_path / "lab")
    lab_store.close()
    host_store = Store(tmp_path / "host")
    assert host_store.import_runs(tmp_path / "lab") == [run_id]
    assert host_store.import_runs(tmp_path / "lab") == []     # already there
    run = host_store.load_run("last")
    assert run.id == run_id and run.status == "done" and run.host["lab"] == machine.LAB_LABEL
    [rep] = [r for r in run.reps if r.phase == "measure"]
    assert rep.metrics[0].value == 123.0
    assert host_store.flags(run_id) == [("vm:kvm", "cpu", {}, "events_per_sec", "noisy")]


def _run(host: dict) -> Run:
    return Run(id="20261127-000000-abcd", created=0.0, finished=1.0, status="done", plan={},
               host=host, version="x", targets={
                   "vm:kvm": {"kind": "vm", "fingerprint": {"accel": "kvm"}},
                   "lv": {"kind": "libvirt", "fingerprint": {"domain_type": "kvm"}}},
               reps=[])


def test_a_labs_kvm_is_labelled_nested_in_the_table_and_title():
    in_lab, on_host = _run({"lab": machine.LAB_LABEL}), _run({})
    assert parts.target_label(in_lab, "vm:kvm") == "vm:kvm (nested KVM)"
    assert machine.LAB_LABEL in parts.run_title(in_lab)
    assert parts.target_label(on_host, "vm:kvm") == "vm:kvm"
    # Found by the lab: a libvirt domain of type kvm was not marked nested.
    assert parts.target_label(in_lab, "lv") == "lv (nested KVM)"
    assert parts.target_label(on_host, "lv") == "lv"
    assert "lab" not in parts.run_title(on_host)


def test_in_a_lab_every_target_says_nested_and_native_is_no_bare_host(tmp_path, monkeypatch):
    """Found by a user: in a lab's run, native's fingerprint said `bare_host yes` and
    vm:kvm's said nothing of nesting. Beating the lab's native is still suspicious."""
    from vmtax.analysis.summary import summarize_run
    from vmtax.core.types import Metric
    from vmtax.host.journal import Journal
    from vmtax.studies.session import Session

    monkeypatch.setenv(machine.LAB_ENV, machine.LAB_LABEL)
    store = Store(tmp_path / "r")
    # No workload programs: the fingerprints under test are the targets' own (a169f3e
    # added the programs' hashes, read from the context's binaries).
    s = Session(store, Journal(tmp_path / "j"), SimpleNamespace(binaries=()))  # type: ignore[arg-type]
    s.run_id = store.new_run({"targets": [{"name": "native"}, {"name": "vm:kvm"}],
                              "baseline": "native"}, machine.fingerprint(), "x")
    s.targets = {"native": SimpleNamespace(kind="native", bare_host=True,
                                           fingerprint=lambda: {"kind": "native"}),
                 "vm:kvm": SimpleNamespace(kind="vm", bare_host=False,
                                           fingerprint=lambda: {"accel": "kvm"})}
    s.store_fingerprints()
    for idx, (target, value) in enumerate([("native", 100.0), ("vm:kvm", 300.0)] * 3):
        store.add_rep(s.run_id, target=target, workload="cpu", params={}, phase="measure",
                      idx=idx // 2, status="ok", argv=["sysbench"], started=1.0,
                      metrics=[Metric("events_per_sec", value + idx, "events/s", True)])
    run = store.load_run(s.run_id)
    native, kvm = run.targets["native"]["fingerprint"], run.targets["vm:kvm"]["fingerprint"]
    assert native["bare_host"] is False and native["lab_host"] is True
    assert native["lab"] == kvm["lab"] == machine.LAB_LABEL and "lab_host" not in kvm
    assert parts.target_label(run, "native") == "native (lab)"
    [row] = summarize_run(run).rows
    assert "faster than baseline" in row.cells["vm:kvm"].flags


def test_the_fingerprint_says_lab_only_in_a_lab(monkeypatch):
    monkeypatch.delenv(machine.LAB_ENV, raising=False)
    assert "lab" not in machine.fingerprint()
    monkeypatch.setenv(machine.LAB_ENV, machine.LAB_LABEL)
    assert machine.fingerprint()["lab"] == machine.LAB_LABEL


def test_the_lab_side_is_a_module_python_can_run():
    done = subprocess.run([sys.executable, "-c", "import vmtax.guest.lab as m; "
                           "print(m.inside.__name__)"], capture_output=True, text=True)
    assert done.stdout.strip() == "inside"
    assert json.loads(json.dumps(lab.EARLY_MODULES))


def test_the_html_report_says_a_run_is_the_labs(tmp_path):
    from vmtax.analysis.model import analyse
    from vmtax.core.types import Metric
    from vmtax.report import html
    store = Store(tmp_path / "r")
    run_id = store.new_run({"targets": [{"name": "native"}, {"name": "vm:kvm"}],
                            "baseline": "native"},
                           {"lab": machine.LAB_LABEL}, "x")
    store.set_target(run_id, "native", "native", {"bare_host": True})
    store.set_target(run_id, "vm:kvm", "vm", {"accel": "kvm"})
    for idx, (target, value) in enumerate([("native", 100.0), ("vm:kvm", 90.0)]):
        store.add_rep(run_id, target=target, workload="cpu", params={}, phase="measure",
                      idx=idx, status="ok", argv=["sysbench"], started=1.0,
                      metrics=[Metric("events_per_sec", value, "events/s", True)])
    store.finish_run(run_id, "done")
    page = html.render_html([html.build(analyse(store.load_run(run_id)))])
    assert f"{machine.LAB_LABEL}: the shape of the tax, not hardware" in page
    assert "vm:kvm (nested KVM)" in page


def test_vhost_in_a_plan_passes_the_hosts_check_when_the_labs_kernel_has_vhost_net(tmp_path):
    """Found by the lab: `vmtax lab run` refused vhost = true because THIS host has no
    /dev/vhost-net, though the lab's kernel loads vhost_net and makes one."""
    from vmtax.targets.vm import VmOptions

    (tmp_path / "modules").mkdir()
    (tmp_path / "modules" / "modules.dep").write_text(
        "kernel/drivers/net/tun.ko:\nkernel/drivers/vhost/vhost_net.ko: "
        "kernel/drivers/net/tun.ko kernel/drivers/vhost/vhost.ko\n")
    planned = lab.devices(_kernel(tmp_path))
    assert planned == {"/dev/vhost-net", "/dev/net/tun"}
    opts = VmOptions(accel="kvm", network="bridge", vhost=True)
    if not os.path.exists("/dev/vhost-net"):
        assert "vhost" in dict(opts.problems())
    with machine.planning_lab(planned):
        assert "vhost" not in dict(opts.problems())
    assert not machine.has_device("/dev/vhost-net") or os.path.exists("/dev/vhost-net")
    (tmp_path / "modules" / "modules.dep").write_text("kernel/drivers/net/tun.ko:\n")
    assert lab.devices(_kernel(tmp_path)) == {"/dev/net/tun"}


def test_help_after_the_command_is_the_labs_and_boots_nothing(tmp_path):
    """Found by a user: `vmtax lab run --help` booted a lab for 2 minutes, then printed the
    inner command's help (`python -m vmtax run`, the lab's own default paths)."""
    started = time.monotonic()
    done = vmtax("lab", "run", "--help", cwd=tmp_path, timeout=60)
    assert done.returncode == 0 and time.monotonic() - started < 30
    assert done.stdout.startswith("Usage: vmtax lab [OPTIONS] [COMMAND] [ARGS]...")
    assert "--session FILE" in done.stdout and "python -m" not in done.stdout
    assert "lab: booting" not in done.stderr


def test_results_after_the_command_is_the_labs_store(tmp_path):
    """`--results` is taken wherever `run` takes it: after the command too, where it names
    the host's store the runs come into (a run to resume is looked up there)."""
    done = vmtax("lab", "run", "--resume", "nosuchrun", "--results", str(tmp_path / "R"),
                 cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"unknown run id 'nosuchrun' in {tmp_path / 'R'}" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "lab: booting" not in done.stderr


@pytest.mark.parametrize("command, said", [
    (["run", "--targets", "native,vm:kvm", "--workloads", "cpu"], "vm:kvm"),
    # vhost passes: the lab's kernel makes /dev/vhost-net, which this host may lack
    (["tune", "--targets", "vm:kvm", "--workloads", "iperf3", "--knobs", "vhost"],
     "vhost=true")])
def test_a_dry_run_is_answered_on_the_host(tmp_path, command, said):
    done = vmtax("lab", *command, "--dry-run", cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert said in done.stdout and "lab: booting" not in done.stderr


def test_a_session_file_is_read_as_words_never_through_a_shell(tmp_path):
    from vmtax.cli.lab import _session

    (tmp_path / "s.txt").write_text("# the plan\nvmtax run plan.toml --name 'a b'\n\n"
                                    "exits last:kvm  # then its exits\nshow $(reboot)\n")
    assert _session(str(tmp_path / "s.txt")) == [
        ["run", "plan.toml", "--name", "a b"], ["exits", "last:kvm"], ["show", "$(reboot)"]]
    (tmp_path / "bad.txt").write_text("run 'unclosed\n")
    with pytest.raises(VmtaxError, match=r"bad\.txt:1: No closing quotation"):
        _session(str(tmp_path / "bad.txt"))


def test_hints_printed_in_a_lab_work_on_the_host(monkeypatch):
    """Found by a user: a lab's hints named the lab's own store (and so no --results), and
    a run to resume on the host, where it was never made."""
    from vmtax.core import hints

    monkeypatch.setenv("VMTAX_RESULTS", lab.LAB_RESULTS)
    monkeypatch.setenv(hints.LAB_RESULTS_ENV, "my results")
    assert hints.command("run", "--resume", "X", results=lab.LAB_RESULTS) == (
        "vmtax lab --results 'my results' run --resume X")
    assert hints.command("show", "X", "--all", results=lab.LAB_RESULTS) == (
        "vmtax show X --all --results 'my results'")
    monkeypatch.delenv(hints.LAB_RESULTS_ENV)
    assert hints.command("show", "X", results=lab.LAB_RESULTS) == "vmtax show X"


def _streams(tmp_path):
    out = open(tmp_path / "out", "wb", buffering=0)
    err = open(tmp_path / "err", "wb", buffering=0)
    return out, err, lab._Stream(out.fileno()), lab._Stream(err.fileno())


@pytest.mark.parametrize("tty", [False, True])
def test_the_labs_command_writes_stdout_and_stderr_apart_counted(tmp_path, tty):
    """Found by a user: a lab's errors reached the host's stdout (its one console had both).
    Each stream has a console of its own; through ptys when the host's side is a terminal
    (the command sees one), else through pipes."""
    out, err, out_stream, err_stream = _streams(tmp_path)
    code = ("import sys; print('table', sys.stdout.isatty()); "
            "print('vmtax: error: x', file=sys.stderr); sys.exit(2)")
    rc = lab._run([sys.executable, "-c", code], str(tmp_path), {"PATH": "/usr/bin:/bin"},
                  out_stream, err_stream, tty)
    out.close(), err.close()
    assert rc == 2
    assert (tmp_path / "out").read_bytes() == f"table {tty}\n".encode()   # no \r added
    assert (tmp_path / "err").read_bytes() == b"vmtax: error: x\n"
    assert (out_stream.written, err_stream.written) == (len(f"table {tty}\n"), 16)


def test_a_daemon_that_keeps_the_commands_output_open_is_not_waited_for(tmp_path):
    out, err, out_stream, err_stream = _streams(tmp_path)
    started = time.monotonic()
    rc = lab._run(["sh", "-c", "sleep 30 & echo started"], str(tmp_path),
                  {"PATH": "/usr/bin:/bin"}, out_stream, err_stream, False)
    out.close(), err.close()
    assert rc == 0 and time.monotonic() - started < 10
    assert (tmp_path / "out").read_bytes() == b"started\n"


def test_a_labs_run_is_resumed_in_a_lab_never_on_the_host(tmp_path, monkeypatch):
    """A run resumed on the host would mix nested numbers with the host's under one id."""
    from vmtax.studies import comparison
    from vmtax.studies import plan as plan_mod
    from vmtax.studies.requests import RunRequest

    store = Store(tmp_path / "r")
    plan = plan_mod.from_names(["native"], ["cpu"], {}, warmup=0, time=1, runs=1).to_dict()
    run_id = store.new_run(plan, {"lab": machine.LAB_LABEL}, "x")
    monkeypatch.delenv(machine.LAB_ENV, raising=False)
    with pytest.raises(VmtaxError, match=rf"made in a lab .*`vmtax lab --results "
                                         rf"{tmp_path}/r run --resume {run_id}`"):
        comparison.plan_of(RunRequest(resume=run_id), store)
    with machine.planning_lab(frozenset()):   # as `vmtax lab run --resume` checks it here
        assert comparison.plan_of(RunRequest(resume=run_id), store).runs == 1
    assert machine.lab() is None
    host_run = store.new_run({"targets": []}, {"cpu_model": "x"}, "x")
    monkeypatch.setenv(machine.LAB_ENV, machine.LAB_LABEL)
    with pytest.raises(VmtaxError, match="made on a host, not in a lab"):
        comparison.plan_of(RunRequest(resume=host_run), store)


def test_a_kvm_guest_in_a_lab_reports_rcu_stalls_at_the_latest(monkeypatch):
    """The fault census: at load 9, all 4 2-vCPU KVM guests of a lab reported an RCU stall
    (21 s) while booting, and vmtax gave each up; with the report at 300 s, every one
    booted. A KVM guest in a lab gets it; a TCG guest, or a guest on a host, does not; the
    plan's kernel_args still come after, and win."""
    from vmtax.guest.qemu import guest_cmdline

    monkeypatch.setenv(machine.LAB_ENV, machine.LAB_LABEL)
    nested = guest_cmdline("mmio", None, extra="rcupdate.rcu_cpu_stall_timeout=21").split()
    assert nested[-2:] == ["rcupdate.rcu_cpu_stall_timeout=300",
                           "rcupdate.rcu_cpu_stall_timeout=21"]
    assert "rcupdate" not in guest_cmdline("mmio", None, tcg=True)
    monkeypatch.delenv(machine.LAB_ENV)
    assert "rcupdate" not in guest_cmdline("mmio", None)


def test_the_labs_studies_work_on_the_labs_own_disk_not_in_the_share(tmp_path, monkeypatch):
    """Found by a user: in a lab, native's 2 GiB fileio and the guests' scratch disks were
    in the share beside the results database: on the host's disk, through 9p. A study
    works where VMTAX_WORK says (the lab gives its own disk), else beside its results."""
    from vmtax.host.journal import Journal
    from vmtax.studies import lab as study
    from vmtax.studies.session import session

    store = Store(tmp_path / "results")
    monkeypatch.setenv("VMTAX_WORK", str(tmp_path / "disk"))
    (tmp_path / "disk").mkdir()
    with session(store, Journal(tmp_path / "j")) as s:
        assert s.work_dir.parent == tmp_path / "disk"
    monkeypatch.delenv("VMTAX_WORK")
    with session(store, Journal(tmp_path / "j")) as s:
        assert s.work_dir.parent == (tmp_path / "results").resolve()
    assert study._lab_env(tmp_path, None)["VMTAX_WORK"] == lab.WORK
    assert not lab.WORK.startswith(lab.SHARE)
