"""Unit tests of the podman container runtime: its argv, limits, availability, clean-up."""

import hashlib
import json
import os
import resource
import subprocess
import sys
import time

import pytest

from vmtax.core import target as targets
from vmtax.core.errors import VmtaxError
from vmtax.core.runtime import DEFAULT_PATH, auto_order, runtimes
from vmtax.core.types import Job
from vmtax.targets import podman
from vmtax.targets.podman import Podman


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A hybrid-cgroup host with runc installed, fixed limits and pid_max; the target's
    directory and the runroot links in tmp_path."""
    monkeypatch.setattr(podman.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(podman.host, "cgroup_mounts", lambda: [
        ("/sys/fs/cgroup/cpuset", "cgroup"), ("/sys/fs/cgroup/unified", "cgroup2")])
    limits = {resource.RLIMIT_NOFILE: (1024, 20000),
              resource.RLIMIT_NPROC: (96365, resource.RLIM_INFINITY)}
    monkeypatch.setattr(podman.resource, "getrlimit", limits.__getitem__)
    monkeypatch.setattr(podman, "pid_max", lambda: 32768)
    monkeypatch.setattr(podman, "LINKS", tmp_path / "links")
    (tmp_path / "links").mkdir()
    return tmp_path / "a-results-directory-of-any-length" / "container-1"


def global_flags(home):
    runroot = home.parent.parent / "links" / (
        "vmtax-podman-" + hashlib.sha256(str(home).encode()).hexdigest()[:12])
    return ["/usr/bin/env", f"CONTAINERS_CONF={home}/containers.conf", "/usr/bin/podman",
            "--root", f"{home}/storage", "--runroot", str(runroot), "--tmpdir", f"{home}/tmp",
            "--storage-driver=vfs", "--network-backend=cni", "--network-config-dir",
            f"{home}/networks", "--cgroup-manager=cgroupfs", "--events-backend=file",
            "--runtime", "/usr/bin/runc"]


def test_launch_argv_is_exact(home):
    rt = Podman("/usr/bin/podman", home, cpus=[3, 1])
    job = Job(["sysbench", "fileio", "a b; $(x)"], env={"LANG": "C", "X": "1=2"},
              in_scratch=True, capabilities=("CAP_SYS_NICE", "CAP_CHOWN"))
    launch = rt.launch(job)
    name = launch.container
    assert name.startswith("vmtax-") and len(name) == len("vmtax-") + 12
    assert launch.argv == [
        *global_flags(home), "run", "--rm", f"--name={name}", "--network=none",
        "--hostname=vmtax", "--workdir=/work", "--unsetenv-all", f"--env=PATH={DEFAULT_PATH}",
        "--env=LANG=C", "--env=X=1=2", "--cap-drop=all",
        "--cap-add=CAP_CHOWN,CAP_DAC_OVERRIDE,CAP_FSETID,CAP_FOWNER,CAP_MKNOD,CAP_NET_RAW,"
        "CAP_SETGID,CAP_SETUID,CAP_SETFCAP,CAP_SETPCAP,CAP_NET_BIND_SERVICE,CAP_SYS_CHROOT,"
        "CAP_KILL,CAP_AUDIT_WRITE,CAP_SYS_NICE",
        "--security-opt=apparmor=unconfined", "--pids-limit=-1",
        "--ulimit=nofile=1024:20000", "--ulimit=nproc=32768:32768",
        "--cgroups=no-conmon", f"--cgroup-parent=/{name}", "--cpuset-cpus=1,3",
        "--rootfs", f"{home}/rootfs", "sysbench", "fileio", "a b; $(x)"]
    assert launch.undo == [*global_flags(home), "rm", "--force", "--time=0", "--ignore", name]
    assert launch.cgroups == [f"/sys/fs/cgroup/cpuset/{name}", f"/sys/fs/cgroup/unified/{name}"]
    assert launch.env is None and launch.preexec is None
    assert rt.placement() == "cpuset"
    assert rt.launch(job).container != name


def test_launch_defaults(home):
    rt = Podman("/usr/bin/podman", home)
    argv = rt.launch(Job(["true"])).argv
    assert "--workdir=/" in argv and argv[-3:] == ["--rootfs", f"{home}/rootfs", "true"]
    assert not any(a.startswith("--cpuset-cpus") for a in argv)
    assert rt.placement() is None


def test_runroot_is_a_short_link_into_the_target(home):
    """podman refuses a runroot over 50 characters; the state stays in the target's dir."""
    assert len(f"/run/{Podman('/usr/bin/podman', home / ('x' * 200)).runroot.name}") <= 50
    rt = Podman("/usr/bin/podman", home)
    rt.runroot.symlink_to("/left/by/a/crash")
    rt.launch(Job(["true"]))
    assert rt.runroot.is_symlink() and rt.runroot.resolve() == home / "run"
    assert (home / "run").is_dir()


def test_setup_writes_the_only_containers_conf(home):
    rt = Podman("/usr/bin/podman", home)
    home.mkdir(parents=True)
    rt.setup_root()
    assert 'lock_type = "file"' in (home / "containers.conf").read_text()
    assert rt.base()[1] == f"CONTAINERS_CONF={home}/containers.conf"


def test_nproc_never_above_pid_max(home, monkeypatch):
    monkeypatch.setattr(podman.resource, "getrlimit", lambda which: (500, 40000))
    assert podman.ulimits() == ["--ulimit=nofile=500:40000", "--ulimit=nproc=500:32768"]


def test_a_known_target_and_runtime():
    assert runtimes()["podman"] is Podman
    assert "podman" not in auto_order()      # only ever when asked for by name
    assert targets.parse_name("container:podman") == ("container", {"runtime": "podman"})
    assert "container:podman" in targets.known_names()


def test_unavailable_is_one_line(monkeypatch):
    installed = {"podman", "runc"}
    monkeypatch.setattr(podman.shutil, "which",
                        lambda name: f"/usr/bin/{name}" if name in installed else None)
    monkeypatch.setattr(podman.os, "geteuid", lambda: 0)
    assert Podman.unavailable() is None
    monkeypatch.setattr(podman.os, "geteuid", lambda: 1000)
    assert Podman.unavailable() == "podman runs rootful here: vmtax must run as root"
    installed.discard("runc")
    assert Podman.unavailable() == ("podman needs runc here, which is not installed "
                                    "(apt-get install runc)")
    installed.discard("podman")
    assert Podman.unavailable() == "podman is not installed (apt-get install podman)"
    with pytest.raises(VmtaxError, match=r"^podman is not installed \(apt-get install podman\)$"):
        Podman.locate()


def test_processes_with():
    marker = "vmtax-podman-test-marker"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", marker])
    try:
        # Until the child has exec'd, its command line is still the test's own.
        deadline = time.monotonic() + 10
        while not podman.processes_with(marker.encode()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert podman.processes_with(marker.encode()) == [child.pid]
    finally:
        child.kill()
        child.wait()
    assert podman.processes_with(marker.encode()) == []


def fake_runc_list(home):
    """`runc list` output: a container of this podman's storage that podman lost, and one
    of someone else."""
    return json.dumps([
        {"id": "a" * 64, "bundle": f"{home}/storage/vfs-containers/{'a' * 64}/userdata"},
        {"id": "b" * 64, "bundle": f"{home}/storage-of-another/{'b' * 64}/userdata"}])


def test_finish_removes_waits_and_unlinks(home, monkeypatch):
    rt = Podman("/usr/bin/podman", home)
    launch = rt.launch(Job(["true"]))
    ran = []

    def run(argv, **kwargs):
        ran.append(argv)
        out = fake_runc_list(home) if argv[1:2] == ["list"] else ""
        return subprocess.CompletedProcess(argv, 0, stdout=out)
    monkeypatch.setattr(podman.subprocess, "run", run)
    left = [[42], []]                            # conmon exits a moment after the container
    monkeypatch.setattr(podman, "processes_with", lambda marker: left.pop(0))
    assert rt.finish(launch)
    assert ran == [launch.undo, ["/usr/bin/runc", "list", "--format=json"],
                   ["/usr/bin/runc", "delete", "--force", "a" * 64]]
    assert left == [] and not rt.runroot.is_symlink()
    assert rt.finish(launch) and len(ran) == 3   # a second call starts no podman


@pytest.mark.parametrize("exit_code, processes", [(0, [42]), (125, [])])
def test_finish_keeps_the_link_for_the_journal(home, monkeypatch, exit_code, processes):
    """conmon outlived its container, or podman could not remove it: the journaled undo
    (`podman rm` through the link) will try again."""
    rt = Podman("/usr/bin/podman", home)
    launch = rt.launch(Job(["true"]))
    monkeypatch.setattr(podman.subprocess, "run",
                        lambda argv, **kw: subprocess.CompletedProcess(argv, exit_code, "[]"))
    monkeypatch.setattr(podman, "processes_with", lambda marker: processes)
    monkeypatch.setattr(podman, "SETTLE_SECONDS", 0.0)
    assert not rt.finish(launch)
    assert rt.runroot.is_symlink()
    # A later job that finishes leaves the link for the one that did not.
    later = rt.launch(Job(["true"]))
    monkeypatch.setattr(podman.subprocess, "run",
                        lambda argv, **kw: subprocess.CompletedProcess(argv, 0, "[]"))
    monkeypatch.setattr(podman, "processes_with", lambda marker: [])
    assert rt.finish(later) and rt.runroot.is_symlink()
    assert rt.finish(launch) and not rt.runroot.is_symlink()


def test_a_secret_reaches_the_container_through_podmans_environment_not_its_argv(home):
    rt = Podman("/usr/bin/podman", home)
    launch = rt.launch(Job(["mariadb-bootstrap"], env={"VMTAX_DB_PASSWORD": "s3cret", "A": "b"},
                           secrets=("s3cret",)))
    assert not any("s3cret" in a for a in launch.argv)
    assert "--env=VMTAX_DB_PASSWORD" in launch.argv and "--env=A=b" in launch.argv
    assert launch.env is not None and launch.env["VMTAX_DB_PASSWORD"] == "s3cret"
    assert launch.env["PATH"] == os.environ["PATH"]   # podman itself is found as before
