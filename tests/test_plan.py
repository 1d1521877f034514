import pytest

from vmtax import plan
from vmtax.errors import VmtaxError


def test_classic_defaults_are_e1():
    p = plan.classic()
    assert [t.name for t in p.targets] == ["native", "container", "vm"]
    assert [w.name for w in p.workloads] == ["cpu", "threads", "memory", "fileio", "mutex"]
    assert (p.runs, p.warmup, p.baseline, p.interleave) == (5, 1, "native", True)
    assert p.time == plan.DEFAULT_TIME


def test_time_goes_to_time_bounded_workloads_only():
    p = plan.classic(time=5)
    cpu = p.workloads[0].make(p.time)
    mutex = p.workloads[4].make(p.time)
    assert cpu.params["time"] == 5 and cpu.params["cpu-max-prime"] == 2000
    assert "time" not in mutex.params


def test_target_variants_set_options():
    p = plan.classic(target_names=["native", "container:runc", "vm:tcg"],
                     options={"vm": {"vcpus": 1}})
    assert [(t.kind, t.options) for t in p.targets] == [
        ("native", {}), ("container", {"runtime": "runc"}), ("vm", {"vcpus": 1, "accel": "tcg"})]


@pytest.mark.parametrize("kwargs, message", [
    (dict(target_names=["native", "xen"]), "unknown target 'xen'; known targets: native, container"),
    (dict(target_names=["container:lxc"]), "unknown target 'container:lxc'"),
    (dict(workload_names=["cpu", "oltp"]), "unknown workload 'oltp'; known workloads: cpu, threads"),
    (dict(target_names=["native", "native"]), "target names must be unique"),
    (dict(runs=0), "--runs must be at least 1"),
    (dict(time=-1), "--time must be a whole number of seconds"),
    (dict(time=1.5), "--time must be a whole number of seconds"),
    (dict(baseline="vm", target_names=["native"]), "baseline 'vm' is not one of the targets"),
])
def test_bad_plans_say_what_is_wrong(kwargs, message):
    with pytest.raises(VmtaxError, match=message.replace("(", r"\(")):
        plan.classic(**kwargs)


def test_round_trips_through_dict():
    p = plan.classic(target_names=["native", "vm:tcg"], runs=5)
    assert plan.Plan.from_dict(p.to_dict()) == p


def test_several_qemu_builds_become_one_vm_target_each():
    p = plan.classic(target_names=["native", "vm:tcg"],
                     qemus=["stock=/usr/bin/qemu-system-x86_64", "/opt/q/bin/qemu-system-x86_64"])
    assert [(t.name, t.options) for t in p.targets] == [
        ("native", {}),
        ("vm:tcg@stock", {"accel": "tcg", "qemu": "/usr/bin/qemu-system-x86_64"}),
        ("vm:tcg@2", {"accel": "tcg", "qemu": "/opt/q/bin/qemu-system-x86_64"})]
    single = plan.classic(target_names=["vm"], qemus=["/opt/q/bin/qemu"])
    assert [(t.name, t.options) for t in single.targets] == [("vm", {"qemu": "/opt/q/bin/qemu"})]
    with pytest.raises(VmtaxError, match="--qemu labels must be unique, got a, a"):
        plan.classic(target_names=["vm"], qemus=["a=/x", "a=/y"])
