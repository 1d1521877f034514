"""vmtax lab: its QEMU command line, its checks (AMD-V in TCG, kvm_amd, memory), the host's
check of the command before the lab boots, runs coming back into the host's store, and the
"nested" label every renderer shows."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

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
    argv = lab.lab_argv("qemu-system-x86_64", _kernel(tmp_path), 2, 4 << 30, tmp_path,
                        tmp_path / "cache")
    assert argv[argv.index("-accel") + 1].startswith("tcg")
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
    (["lab", "run", "--results", "x"], "give --results before the command"),
    (["lab", "frobnicate"], "'frobnicate' is not a vmtax command the lab runs"),
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


def test_a_lab_that_hangs_while_booting_is_caught_by_the_watchdog(tmp_path, monkeypatch):
    """Found in CI: a lab's QEMU busy for 15 minutes without a console line. Its vmtax
    never wrote STARTED: the watch gives up at BOOT_TIMEOUT, with QEMU still running."""
    from vmtax.studies import lab as study

    monkeypatch.setattr(study, "BOOT_TIMEOUT", 0.3)
    hung = subprocess.Popen(["sleep", "30"])
    try:
        assert study._watch(hung, tmp_path, lambda data: None) is False
        assert hung.poll() is None
    finally:
        hung.kill()
        hung.wait()
    # Started, it is watched until QEMU exits, however long after the timeout.
    (tmp_path / lab.STARTED).write_text("12.5")
    (tmp_path / "out.log").write_bytes(b"hello\n")
    seen: list[bytes] = []
    booted = subprocess.Popen(["sleep", "0.8"])
    assert study._watch(booted, tmp_path, seen.append) is True
    assert b"".join(seen) == b"hello\n"


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


def test_a_lab_whose_kernel_dies_mid_run_is_booted_again_to_resume_the_run(tmp_path,
                                                                            monkeypatch):
    """Found in CI: the lab's kernel panicked 278 s into a run (a stack overflow in an
    interrupt, under TCG's emulated SVM). What it stored stays in the share; a new lab
    resumes that run, once, and the host imports it finished."""
    from types import SimpleNamespace

    from vmtax.host.journal import Journal
    from vmtax.results.store import Store
    from vmtax.studies import lab as study

    monkeypatch.setattr(study, "check", lambda *args: 1 << 30)
    monkeypatch.setattr(study, "find_qemu", lambda qemu: "qemu")
    monkeypatch.setattr(study, "make_scratch_disk", lambda path, *args: path.write_bytes(b""))
    monkeypatch.setattr(lab, "lab_kernel", lambda cache: SimpleNamespace(
        modules_tree=tmp_path, version="6.1"))
    monkeypatch.setattr(lab, "lab_argv", lambda *args: ["qemu"])
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    jobs: list[list[str]] = []

    def spawn(argv, log):
        share = log.parent
        jobs.append(json.loads((share / lab.JOB).read_text())["argv"][3:])
        (share / lab.STARTED).write_text("1")
        store = Store(share / lab.RESULTS)
        if len(jobs) == 1:      # the first lab: a run begun, then its kernel dies
            store.new_run({"runs": 1}, {"hostname": "lab"}, "0")
            (share / "console.log").write_text("Kernel panic - not syncing: Fatal exception\n")
            (share / "out.log").write_text("[1/2] done\n")
        else:
            [run] = store.list_runs()
            store.finish_run(run["id"], "done")
            (share / lab.RC).write_text("0")
        store.close()
        # Like QEMU, the second lab empties out.log a while after it starts.
        return subprocess.Popen(["sh", "-c", "sleep 0.5; echo '[2/2] done; the report' >out.log"]
                                if len(jobs) == 2 else ["true"], cwd=share)

    monkeypatch.setattr(lab, "spawn", spawn)
    said: list[str] = []
    echoed: list[bytes] = []
    outcome = study.run(["run", "plan.toml"], vcpus=2, memory="1G", disk="1G", qemu="qemu",
                        results=tmp_path / "results", journal=Journal(tmp_path / "journal"),
                        echo=echoed.append, say=said.append)
    [run_id] = outcome.run_ids
    assert b"".join(echoed) == b"[1/2] done\n[2/2] done; the report\n"   # once, whole
    assert jobs == [["run", "plan.toml"], ["run", "--resume", run_id]]
    assert outcome.exit_code == 0 and "booting it again to resume run " + run_id in said[-1]
    assert "Kernel panic" in said[-1]
    assert Store(tmp_path / "results").list_runs()[0]["status"] == "done"
    assert not list(tmp_path.glob("vmtax-lab-*"))    # the share, undone
