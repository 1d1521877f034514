"""A container target's cgroup for all its jobs (vmtax.helpers.runtime_cgroup): where it is
made, what an OCI runtime's launch does with it, and that a collector's subject carries it
(host-cpu and host-mem read a container target's jobs there), against fake cgroup trees."""

import dataclasses
import shutil
import time

import pytest
from test_collectors import make, proc, set_rollup, set_stat, values  # noqa: F401 (fixtures)
from test_runner import echo_workload, make_plan  # noqa: F401 (fixture)

from vmtax.analysis import summary as analysis
from vmtax.collectors.host_cpu import HostCpu
from vmtax.collectors.host_mem import HostMem
from vmtax.core import plugin
from vmtax.core import target as targets
from vmtax.core.collector import Collector, Subject
from vmtax.core.types import Job, MetricSpec
from vmtax.helpers.oci_runtime import OciRuntime
from vmtax.helpers.runtime_cgroup import TargetCgroup
from vmtax.results.store import Store
from vmtax.studies import plan as plan_mod
from vmtax.studies.runner import Runner
from vmtax.targets.container import Crun

HYBRID = {"cpu": "cpu", "cpuacct": "cpuacct", "cpuset": "cpuset", "memory": "memory",
          "systemd": "name=systemd"}
SELF = ("4:memory:/process_api/abc\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n"
        "9:name=systemd:/\n0::/\n")


def fake_host(tmp_path, mounts, self_cgroup=SELF, v2=True):
    """A mountinfo with a cgroup v1 hierarchy per (dir, options) and the v2 one beside."""
    root = tmp_path / "cgroup"
    lines = [f"31 23 0:28 / {root} rw,relatime - tmpfs tmpfs rw,mode=755"]
    for i, (name, options) in enumerate(mounts.items()):
        (root / name).mkdir(parents=True)
        lines.append(f"{40 + i} 31 0:{40 + i} / {root}/{name} rw,relatime - cgroup cgroup "
                     f"rw,{options}")
    if v2:
        (root / "unified").mkdir(parents=True)
        lines.append(f"60 31 0:60 / {root}/unified rw,relatime - cgroup2 cgroup2 rw")
    (tmp_path / "mountinfo").write_text("\n".join(lines) + "\n")
    (tmp_path / "self-cgroup").write_text(self_cgroup)
    return root, dict(mountinfo=str(tmp_path / "mountinfo"),
                      self_cgroup=str(tmp_path / "self-cgroup"), root=str(root))


def test_the_target_cgroup_is_in_cpuacct_only_with_the_runtime_s_leaf(tmp_path):
    root, where = fake_host(tmp_path, HYBRID)
    group = TargetCgroup(**where)
    assert group.why_not is None and group.hierarchy == f"{root}/cpuacct"
    leaf = root / "cpuacct" / group.path.strip("/") / "runtime"
    assert group.dirs() == [str(leaf), str(leaf.parent)]
    group.make()
    group.make()
    assert leaf.is_dir() and [p.name for p in root.glob("*/vmtax-*")] == [leaf.parent.name]
    # runc makes the container's cgroup under its own, crun at each hierarchy's root
    assert group.container_dirs("c1") == [
        f"{root}/cpu/c1", f"{leaf}/c1", f"{root}/cpuacct/c1", f"{root}/cpuset/c1",
        f"{root}/memory/process_api/abc/c1", f"{root}/memory/c1", f"{root}/systemd/c1",
        f"{root}/unified/c1"]


def test_joining_writes_the_runtime_s_own_pid_into_the_leaf(tmp_path):
    _, where = fake_host(tmp_path, HYBRID)
    group = TargetCgroup(**where)
    group.make()
    join = group.join()
    assert join is not None
    join()
    assert (tmp_path / "cgroup/cpuacct" / group.path.strip("/") / "runtime/cgroup.procs"
            ).read_text() == "0"


@pytest.mark.parametrize("mounts, v2, why", [
    ({"cpu,cpuacct": "cpu,cpuacct", "memory": "memory"}, True,
     "cpuacct is mounted with cpu"),
    ({}, True, "no cgroup v1 cpuacct hierarchy"),
])
def test_no_target_cgroup_where_joining_would_change_scheduling(tmp_path, mounts, v2, why):
    _, where = fake_host(tmp_path, mounts, v2=v2)
    group = TargetCgroup(**where)
    assert why in group.why_not
    assert group.dirs() == [] and group.join() is None
    group.make()
    assert not list((tmp_path / "cgroup").glob("*/vmtax-*"))


class Fake(OciRuntime):
    name = "fake-oci"


def test_an_oci_launch_joins_the_target_cgroup_and_journals_its_container_under_it(
        tmp_path):
    _, where = fake_host(tmp_path, HYBRID)
    runtime = Fake("/bin/true", tmp_path / "home")
    runtime.target_cgroup = TargetCgroup(**where)
    runtime.setup_root()
    leaf = tmp_path / "cgroup/cpuacct" / runtime.cgroup().strip("/") / "runtime"
    assert runtime.cgroup_dirs() == [str(leaf), str(leaf.parent)] and leaf.is_dir()
    launch = runtime.launch(Job(["true"]))
    assert f"{leaf}/{launch.container}" in launch.cgroups
    launch.preexec()
    assert (leaf / "cgroup.procs").read_text() == "0"


def test_an_oci_runtime_has_no_cgroup_where_the_host_allows_none(tmp_path):
    _, where = fake_host(tmp_path, {"cpu,cpuacct": "cpu,cpuacct"})
    runtime = Fake("/bin/true", tmp_path / "home")
    runtime.target_cgroup = TargetCgroup(**where)
    assert runtime.cgroup() is None and runtime.cgroup_dirs() == []
    assert runtime.launch(Job(["true"])).preexec is None


def test_crun_has_a_target_cgroup_only_without_its_cgroup_manager(tmp_path):
    """crun's cgroup manager makes the container's cgroup at the root, out of the target's:
    its jobs would be missing from the figure."""
    _, where = fake_host(tmp_path, HYBRID)
    crun = Crun("/usr/bin/crun", tmp_path / "home")
    crun.target_cgroup = TargetCgroup(**where)
    assert crun.cgroup() is None
    crun.adapt("cgroups in hybrid mode not supported")
    assert crun.cgroup() == crun.target_cgroup.path


# -- collectors get it ------------------------------------------------------------------------

class NoOptions(plugin.Options):
    pass


def test_the_runner_gives_collectors_the_target_s_cgroup(tmp_path, monkeypatch):
    """A container target's jobs are in its cgroup: host-cpu said "no host process or
    cgroup" because the runner never passed it on."""
    seen: list[Subject] = []

    class Witness(Collector):
        name = "cgroup-witness-test"
        Options = NoOptions
        metrics = (MetricSpec("events", "n", False),)

        def start(self, subject):
            seen.append(subject)

        def stop(self):
            return [self.metric("events", 1)]

        def abort(self):
            pass

    monkeypatch.setitem(plugin.registry().setdefault("collector", {}), Witness.name, Witness)
    monkeypatch.setattr(targets.get("native"), "cgroup", lambda self: "/vmtax-witness",
                        raising=False)
    plan = dataclasses.replace(make_plan(), runs=1, warmup=0, collect=[Witness.name],
                               targets=[plan_mod.TargetSpec("native", "native", {})])
    Runner(plan, Store(tmp_path)).execute()
    assert [s.cgroup for s in seen] == ["/vmtax-witness"]


@pytest.fixture
def cgroup_tree(tmp_path, monkeypatch):
    root = tmp_path / "cgroup"
    monkeypatch.setattr(Collector, "cgroup_root", root)
    return root


def container(cgroup="/vmtax-t1"):
    return Subject(kind="container", name="container:runc", cgroup=cgroup)


def test_host_cpu_reads_a_container_target_s_cgroup(cgroup_tree, make):  # noqa: F811
    group = cgroup_tree / "cpuacct/vmtax-t1"
    group.mkdir(parents=True)

    def counters(user_ns, sys_ns):
        for name, ns in (("usage", user_ns + sys_ns), ("usage_user", user_ns),
                         ("usage_sys", sys_ns)):
            (group / f"cpuacct.{name}").write_text(f"{ns}\n")
    counters(0, 0)
    assert HostCpu.unavailable(container()) is None
    c = make(HostCpu)
    c.start(container())
    counters(int(1.5e9), int(0.5e9))
    c.pause()
    counters(int(9e9), int(0.5e9))    # the other targets' turn: not counted
    c.resume()
    counters(int(10e9), int(1e9))
    assert values(c.stop()) == pytest.approx(
        {"host cpu": 3.5, "host cpu user": 2.5, "host cpu system": 1.0})


def test_host_cpu_says_why_a_container_without_a_cgroup_is_not_recorded():
    why = HostCpu.unavailable(container(cgroup=None))
    assert why.startswith("container:runc has no host process or cgroup that lasts the cell: "
                          "its runtime puts its jobs in no cgroup of the target's")


def test_host_mem_samples_the_processes_a_container_target_s_cgroup_holds(
        cgroup_tree, proc, make):  # noqa: F811
    group = cgroup_tree / "cpuacct/vmtax-t1"
    (group / "runtime/c1").mkdir(parents=True)
    (group / "cgroup.procs").write_text("")
    (group / "runtime/cgroup.procs").write_text("10\n")     # the runtime
    (group / "runtime/c1/cgroup.procs").write_text("11\n")  # its container
    for pid, mib in ((10, 8), (11, 40)):
        set_stat(proc, pid)
        set_rollup(proc, pid, rss_kib=mib * 1024, pss_kib=mib * 1024)
    assert HostMem.unavailable(container()) is None
    assert "no cgroup /vmtax-gone" in HostMem.unavailable(container("/vmtax-gone"))
    c = make(HostMem, interval=0.05)
    c.start(container())
    time.sleep(0.3)
    for path in (group / "runtime/c1/cgroup.procs", group / "runtime/cgroup.procs"):
        path.write_text("")                     # the job ended: nothing left at stop
    shutil.rmtree(group / "runtime/c1")
    assert values(c.stop()) == pytest.approx({"host pss peak": 48})
    assert c.warnings == []


def test_host_mem_refuses_a_cgroup_it_never_saw_a_process_in(cgroup_tree, make):  # noqa: F811
    group = cgroup_tree / "cpuacct/vmtax-t1"
    group.mkdir(parents=True)
    (group / "cgroup.procs").write_text("")
    c = make(HostMem, interval=0.05)
    c.start(container())
    with pytest.raises(Exception, match="no process seen in cgroup"):
        c.stop()


def test_a_baseline_a_collector_could_not_record_is_not_called_failed(tmp_path):
    """host-cpu on native and a container: the container's figure had "no ratio: native
    failed" beside native's "not recorded: why"."""
    store = Store(tmp_path)
    run_id = store.new_run({"targets": [{"name": "native"}, {"name": "container"}],
                            "baseline": "native"}, {}, "0")
    why = "native has no host process or cgroup that lasts the cell"
    for target in ("native", "container"):
        store.set_target(run_id, target, target, {})
        recorded = target == "container"
        store.add_rep(run_id, target=target, workload="cpu", params={}, phase="collect",
                      idx=0, status="ok" if recorded else "unavailable", argv=["host-cpu"],
                      started=0.0, error=None if recorded else f"host-cpu: unavailable — {why}",
                      metrics=[analysis.Metric("host cpu", 1.5, "s", False)] if recorded
                      else [])
    cells = analysis.summarize_run(store.load_run(run_id)).rows[0].cells
    assert cells["native"].not_recorded == why
    assert cells["container"].no_ratio == "no ratio: not recorded on native"
