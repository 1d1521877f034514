"""Unit tests of the container target: generated configs and argv, runtime choice, errors."""

import json
import os
import shutil
from pathlib import Path

import pytest

from vmtax.core import target as targets
from vmtax.core.errors import TargetError, VmtaxError
from vmtax.core.runtime import DEFAULT_PATH, Runtime
from vmtax.core.target import TargetContext
from vmtax.core.types import Job
from vmtax.host import proc
from vmtax.host.journal import Journal
from vmtax.helpers import oci_runtime
from vmtax.helpers.oci_runtime import oci_config
from vmtax.helpers.runtime_cgroup import TargetCgroup
from vmtax.targets import container
from vmtax.targets.container import ContainerTarget, Crun, Runc, Unshare


@pytest.fixture(autouse=True)
def no_target_cgroup(monkeypatch):
    """A host without a cgroup for a target's jobs, so that no unit test makes one (it has
    tests of its own: test_runtime_cgroup.py)."""
    monkeypatch.setattr(oci_runtime, "TargetCgroup",
                        lambda: TargetCgroup(mountinfo="/nonexistent"))


@pytest.fixture
def ctx(tmp_path):
    (tmp_path / "journal").mkdir()
    return TargetContext(work_dir=tmp_path / "work", journal=Journal(tmp_path / "journal"))


@pytest.fixture
def fake_rootfs(tmp_path, monkeypatch):
    source = tmp_path / "cache" / "0123456789abcdef"
    (source / "work").mkdir(parents=True)
    (source / "bin").mkdir()
    monkeypatch.setattr(container.rootfs, "build", lambda binaries: source)
    return source


def fake_which(*installed):
    return lambda name: f"/usr/bin/{name}" if name in installed else None


def test_oci_config_process_is_the_job_exactly():
    job = Job(["sysbench", "cpu", "--threads=2", "a b; $(x)"], env={"LANG": "C"})
    cfg = oci_config(job, Path("/w/rootfs"))
    assert cfg["process"]["args"] == ["sysbench", "cpu", "--threads=2", "a b; $(x)"]
    assert cfg["process"]["env"] == [f"PATH={DEFAULT_PATH}", "LANG=C"]
    assert cfg["process"]["cwd"] == "/"
    assert cfg["process"]["terminal"] is False
    assert cfg["root"] == {"path": "/w/rootfs", "readonly": False}
    json.dumps(cfg)


def test_oci_config_scratch_cwd_and_path_override():
    cfg = oci_config(Job(["ls"], env={"PATH": "/bin"}, in_scratch=True), Path("/r"))
    assert cfg["process"]["cwd"] == "/work"
    assert cfg["process"]["env"] == ["PATH=/bin"]


def test_oci_config_namespaces_and_mounts():
    cfg = oci_config(Job(["true"]), Path("/r"))
    types = [ns["type"] for ns in cfg["linux"]["namespaces"]]
    assert sorted(types) == ["ipc", "mount", "network", "pid", "uts"]
    # A network namespace without a path is a fresh one: nothing but loopback.
    assert all("path" not in ns for ns in cfg["linux"]["namespaces"])
    mounts = {m["destination"]: m for m in cfg["mounts"]}
    assert mounts["/proc"]["type"] == "proc"
    assert mounts["/dev"]["type"] == "tmpfs"
    assert mounts["/sys"]["type"] == "sysfs" and "ro" in mounts["/sys"]["options"]
    assert mounts["/tmp"]["type"] == "tmpfs"


def test_unshare_argv():
    rt = Unshare("/usr/bin/unshare", Path("/w/c"))
    assert rt.command(Job(["sysbench", "fileio", "x y"], in_scratch=True)) == [
        "/usr/bin/unshare", "--fork", "--kill-child", "--pid", "--mount", "--net", "--uts",
        "--ipc", "--mount-proc=/proc", "--root=/w/c/rootfs", "--wd=/work",
        "--", "sysbench", "fileio", "x y"]
    launch = rt.launch(Job(["true"], env={"A": "1"}))
    assert "--wd=/" in launch.argv
    assert launch.env == {"PATH": DEFAULT_PATH, "A": "1"}
    assert launch.undo is None


def test_oci_launch_writes_bundle_and_journals_delete(tmp_path, monkeypatch):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
    monkeypatch.setattr(oci_runtime, "TargetCgroup",
                        lambda: TargetCgroup(mountinfo=str(mountinfo)))
    rt = Runc("/usr/sbin/runc", tmp_path)
    launch = rt.launch(Job(["echo", "hi"]))
    base = ["/usr/sbin/runc", "--root", str(tmp_path / "state")]
    assert launch.argv == [*base, "run", "--bundle", str(tmp_path / "bundle"), launch.container]
    assert launch.undo == [*base, "delete", "-f", launch.container]
    assert launch.cgroups == [f"/sys/fs/cgroup/cpuset/{launch.container}",
                              f"/sys/fs/cgroup/unified/{launch.container}"]
    assert launch.preexec is None and launch.env is None
    cfg = json.loads((tmp_path / "bundle" / "config.json").read_text())
    assert cfg["process"]["args"] == ["echo", "hi"]
    assert rt.launch(Job(["true"])).container != launch.container


def test_crun_workaround_only_after_hybrid_refusal(tmp_path):
    rt = Crun("/usr/bin/crun", tmp_path)
    assert not rt.adapt("some other failure")
    assert "--cgroup-manager=disabled" not in rt.launch(Job(["true"])).argv
    assert rt.adapt("cgroups in hybrid mode not supported, drop all controllers from cgroupv2")
    assert rt.cgroup_workaround
    launch = rt.launch(Job(["true"]))
    assert launch.argv[1:4] == ["--root", str(tmp_path / "state"), "--cgroup-manager=disabled"]
    assert launch.undo[3] == "--cgroup-manager=disabled"
    assert launch.preexec is container._hide_cgroup2
    assert not rt.adapt("cgroups in hybrid mode not supported")   # no second retry


def test_defaults(ctx):
    options = targets.create("container", "container", {}, ctx).options
    assert options.model_dump() == {"runtime": "auto", "binaries": [], "cpus": None,
                                    "network": None, "storage": None, "seccomp": None,
                                    "cpu_limit": None, "memory_limit": None}


def test_auto_candidates_follow_which(ctx, monkeypatch):
    monkeypatch.setattr(shutil, "which", fake_which("crun", "unshare"))
    candidates = targets.create("container", "container", {}, ctx).candidates()
    assert [(cls.name, binary) for cls, binary in candidates] == [
        ("crun", "/usr/bin/crun"), ("unshare", "/usr/bin/unshare")]
    monkeypatch.setattr(shutil, "which", fake_which())
    with pytest.raises(VmtaxError, match="none of runc, crun, unshare is installed"):
        targets.create("container", "container", {}, ctx).candidates()


def test_missing_runtime_is_one_line(ctx, monkeypatch, fake_rootfs):
    monkeypatch.setattr(shutil, "which", fake_which("runc", "unshare"))
    with pytest.raises(VmtaxError) as err:
        targets.create("container:crun", "container", {"runtime": "crun"}, ctx).prepare()
    assert str(err.value) == "container:crun: crun is not installed (apt-get install crun)"
    with pytest.raises(VmtaxError, match='runtime: expected one of "auto", '):
        targets.create("container:lxc", "container", {"runtime": "lxc"}, ctx).prepare()
    assert not ctx.work_dir.exists()


@pytest.mark.parametrize("installed, broken, chosen", [
    (("runc", "crun", "unshare"), (), "runc"),
    (("runc", "crun", "unshare"), ("runc",), "crun"),
    (("crun", "unshare"), ("crun",), "unshare"),
    (("unshare",), (), "unshare"),
])
def test_auto_picks_first_usable(ctx, monkeypatch, fake_rootfs, installed, broken, chosen):
    monkeypatch.setattr(shutil, "which", fake_which(*installed))
    probed = []

    def probe(self, runtime):
        probed.append(runtime.name)
        return "broken" if runtime.name in broken else None
    monkeypatch.setattr(ContainerTarget, "probe", probe)
    monkeypatch.setattr(Runtime, "version", lambda self: f"{self.name} 1.0")
    target = targets.create("container", "container", {}, ctx)
    target.prepare()
    assert target.runtime.name == chosen
    assert probed == [*broken, chosen]
    fp = target.fingerprint()
    assert fp["runtime"] == chosen and fp["runtime_version"] == f"{chosen} 1.0"
    assert fp["rootfs"] == fake_rootfs.name and fp["cgroup_workaround"] is False
    assert fp["namespaces"] == ["pid", "mount", "net", "uts", "ipc"]
    copy = target.dir / "rootfs"
    assert (copy / "work").is_dir() and copy != fake_rootfs
    assert [e["type"] for e in ctx.journal.entries.values()] == ["rmtree"]
    target.cleanup()
    target.cleanup()
    assert not target.dir.exists() and fake_rootfs.exists()
    assert ctx.journal.entries == {}
    assert target.fingerprint() == fp     # still describes what ran


def test_no_usable_runtime_cleans_up(ctx, monkeypatch, fake_rootfs):
    monkeypatch.setattr(shutil, "which", fake_which("runc", "unshare"))
    monkeypatch.setattr(ContainerTarget, "probe", lambda self, rt: f"{rt.name} failed")
    with pytest.raises(VmtaxError) as err:
        targets.create("container", "container", {}, ctx).prepare()
    assert str(err.value) == ("container: no usable container runtime "
                              "(runc: runc failed; unshare: unshare failed)")
    assert list(ctx.work_dir.iterdir()) == [] and ctx.journal.entries == {}


def test_fingerprint_and_run_need_prepare(ctx):
    target = targets.create("container:runc", "container", {"runtime": "runc"}, ctx)
    with pytest.raises(TargetError):
        target.fingerprint()
    with pytest.raises(TargetError):
        target.run(Job(["true"]))


# --- cpus: a cpuset where the runtime has a cgroup, CPU affinity where it has none ---------

def test_oci_config_cpuset():
    assert "cpu" not in oci_config(Job(["true"]), Path("/r"))["linux"]["resources"]
    resources = oci_config(Job(["true"]), Path("/r"), [3, 1])["linux"]["resources"]
    assert resources["cpu"] == {"cpus": "1,3"}
    assert resources["devices"] == [{"allow": False, "access": "rwm"}]


def test_runc_puts_cpus_in_the_cpuset(tmp_path):
    rt = Runc("/usr/sbin/runc", tmp_path, [1])
    launch = rt.launch(Job(["true"]))
    assert rt.placement() == "cpuset" and launch.preexec is None
    cfg = json.loads((tmp_path / "bundle" / "config.json").read_text())
    assert cfg["linux"]["resources"]["cpu"] == {"cpus": "1"}


def test_crun_without_cgroups_pins_by_affinity(tmp_path):
    rt = Crun("/usr/bin/crun", tmp_path, [1])
    assert rt.placement() == "cpuset"
    rt.adapt("cgroups in hybrid mode not supported")
    launch = rt.launch(Job(["true"]))
    assert rt.placement() == "affinity"
    cfg = json.loads((tmp_path / "bundle" / "config.json").read_text())
    assert "cpu" not in cfg["linux"]["resources"]
    assert launch.preexec is not None and launch.preexec is not container._hide_cgroup2


def test_no_cpus_no_placement(tmp_path):
    for rt in (Unshare("/usr/bin/unshare", tmp_path), Runc("/usr/sbin/runc", tmp_path)):
        assert rt.placement() is None and rt.launch(Job(["true"])).preexec is None


def test_unshare_affinity_is_inherited_by_what_it_starts(tmp_path):
    cpu = max(os.sched_getaffinity(0))
    launch = Unshare("/usr/bin/unshare", tmp_path, [cpu]).launch(Job(["true"]))
    assert Unshare("/usr/bin/unshare", tmp_path, [cpu]).placement() == "affinity"
    # The preexec runs in the child before exec, as proc.spawn does for a real container.
    done = proc.run(["sh", "-c", "grep Cpus_allowed_list /proc/self/status"],
                    preexec=launch.preexec, timeout=30)
    assert done.stdout.split() == ["Cpus_allowed_list:", str(cpu)]


@pytest.mark.parametrize("cpus", [[], [4096], [0, 4096]])
def test_cpus_vmtax_may_not_use_are_refused(ctx, cpus):
    with pytest.raises(VmtaxError) as err:
        targets.create("c", "container", {"cpus": cpus}, ctx)
    assert str(err.value).startswith("c: cpus: expected distinct host CPUs vmtax may use")


def test_fingerprint_records_cpus_and_placement(ctx, monkeypatch, fake_rootfs):
    monkeypatch.setattr(shutil, "which", fake_which("runc"))
    monkeypatch.setattr(ContainerTarget, "probe", lambda self, runtime: None)
    monkeypatch.setattr(Runc, "version", lambda self: "runc version 1.1.5")
    target = targets.create("c", "container", {"runtime": "runc", "cpus": [0]}, ctx)
    target.prepare()
    try:
        fp = target.fingerprint()
        assert (fp["cpus"], fp["cpu_placement"]) == ([0], "cpuset")
    finally:
        target.cleanup()


def test_a_job_asking_for_real_time_gets_a_budget_where_cgroups_ration_it(tmp_path, monkeypatch):
    job = Job(["cyclictest"], capabilities=("CAP_SYS_NICE",))
    monkeypatch.setattr(oci_runtime, "RT_GROUP_FILE", str(tmp_path / "cpu.rt_runtime_us"))
    assert "cpu" not in oci_config(job, tmp_path)["linux"]["resources"]
    (tmp_path / "cpu.rt_runtime_us").write_text("950000\n")
    config = oci_config(job, tmp_path, [0])
    assert config["linux"]["resources"]["cpu"] == {
        "cpus": "0", "realtimeRuntime": 500_000, "realtimePeriod": 1_000_000}
    assert "CAP_SYS_NICE" in config["process"]["capabilities"]["effective"]
    plain = oci_config(Job(["true"]), tmp_path)
    assert "CAP_SYS_NICE" not in plain["process"]["capabilities"]["bounding"]


def test_confined_cpus_keep_a_host_side_client_off_them(ctx):
    # The runner pins a client to the host CPUs the target does not take.
    assert targets.create("container", "container", {}, ctx).cpus() is None
    assert targets.create("container", "container", {"cpus": [1]}, ctx).cpus() == {1}


def test_a_non_root_user_is_refused_in_one_line_before_anything_runs(ctx, monkeypatch,
                                                                     fake_rootfs):
    """As non-root, container:unshare ended in a PermissionError traceback from os.mknod."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for name, runtime in (("container:unshare", "unshare"), ("container", "auto")):
        with pytest.raises(VmtaxError, match=r"runtime: expected vmtax run as root \(sudo\)"):
            targets.create(name, "container", {"runtime": runtime}, ctx)
    assert not ctx.work_dir.exists()


def test_a_refused_mknod_passes_the_runtime_over_in_one_line(ctx, monkeypatch, fake_rootfs):
    """Root in a user namespace may not mknod: the probe says so, no traceback."""
    monkeypatch.setattr(shutil, "which", fake_which("unshare"))

    def refused(*args):
        raise PermissionError(1, "Operation not permitted", args[0])
    monkeypatch.setattr(os, "mknod", refused)
    with pytest.raises(VmtaxError) as err:
        targets.create("container:unshare", "container", {"runtime": "unshare"}, ctx).prepare()
    assert str(err.value).startswith("container:unshare: no usable container runtime "
                                     "(unshare: [Errno 1] Operation not permitted")
    assert "\n" not in str(err.value)
