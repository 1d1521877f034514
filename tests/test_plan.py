import pytest

from vmtax.core import target as targets
from vmtax.core.errors import VmtaxError
from vmtax.studies import plan


def classic(target_names=None, workload_names=None, options=None, **settings):
    names = plan.classic_names()
    return plan.from_names(target_names or names[0], workload_names or names[1], options,
                           **settings)


def test_classic_defaults_are_e1():
    p = classic()
    assert [t.name for t in p.targets] == ["native", "container", "vm"]
    assert [w.name for w in p.workloads] == ["cpu", "threads", "memory", "fileio", "mutex"]
    assert (p.runs, p.warmup, p.baseline, p.interleave) == (5, 1, "native", True)
    assert p.time == plan.DEFAULT_TIME


def test_time_goes_to_time_bounded_workloads_only():
    p = classic(time=5)
    cpu = p.workloads[0].make(p.time)
    mutex = p.workloads[4].make(p.time)
    assert cpu.params["time"] == 5 and cpu.params["cpu-max-prime"] == 2000
    assert "time" not in mutex.params


def test_target_variants_and_command_line_options_set_options():
    p = classic(target_names=["native", "container:runc", "vm:tcg"], options={"vcpus": ["1"]})
    # "1" from the command line is stored as the plugin reads it.
    assert [(t.kind, t.options) for t in p.targets] == [
        ("native", {}), ("container", {"runtime": "runc"}), ("vm", {"accel": "tcg", "vcpus": 1})]


@pytest.mark.plugin_lists
@pytest.mark.parametrize("kwargs, message", [
    (dict(target_names=["native", "xen"]),
     "unknown target 'xen'; known targets: " + ", ".join(targets.known_names())),
    (dict(target_names=["container:lxc"]), "unknown target 'container:lxc'"),
    (dict(workload_names=["cpu", "tpcc"]), "unknown workload 'tpcc'; known workloads: "),
    (dict(target_names=["native", "native"]), "target names must be unique"),
    (dict(runs=0), "--runs must be from 1 to 1000000000"),
    (dict(time=-1), "--time must be a whole number of seconds"),
    (dict(time=1.5), "--time must be a whole number of seconds"),
    (dict(baseline="vm", target_names=["native"]), "baseline 'vm' is not one of the targets"),
    (dict(target_names=["vm"], options={"vcpus": ["0"]}),
     "vm: vcpus: expected a whole number from 1 to 1000000000, got '0'"),
    (dict(target_names=["vm"], options={"machine": ["pc"]}),
     'vm: machine: expected one of "microvm", "q35", got \'pc\''),
])
def test_bad_plans_say_what_is_wrong(kwargs, message):
    with pytest.raises(VmtaxError, match=message.replace("(", r"\(").replace(")", r"\)")):
        classic(**kwargs)


def test_round_trips_through_dict():
    p = classic(target_names=["native", "vm:tcg"], runs=5)
    assert plan.Plan.from_dict(p.to_dict()) == p


def test_an_option_given_several_times_makes_one_target_per_value():
    p = classic(target_names=["native", "vm:tcg"], options={
        "qemu": ["stock=/usr/bin/qemu-system-x86_64", "/usr/bin/qemu-system-x86_64"]})
    assert [(t.name, t.options) for t in p.targets] == [
        ("native", {}),
        ("vm:tcg@stock", {"accel": "tcg", "qemu": "/usr/bin/qemu-system-x86_64"}),
        ("vm:tcg@2", {"accel": "tcg", "qemu": "/usr/bin/qemu-system-x86_64"})]
    single = classic(target_names=["vm"], options={"qemu": ["/usr/bin/qemu-system-x86_64"],
                                                   "kernel_args": ["tsc_early_khz=5"]})
    assert [(t.name, t.options) for t in single.targets] == [
        ("vm", {"qemu": "/usr/bin/qemu-system-x86_64", "kernel_args": "tsc_early_khz=5"})]
    with pytest.raises(VmtaxError, match="--qemu labels must be unique, got a, a"):
        classic(target_names=["vm"], options={"qemu": ["a=/x", "a=/y"]})
    with pytest.raises(VmtaxError, match="qemu: expected an executable program"):
        classic(target_names=["vm"], options={"qemu": ["/opt/q/bin/qemu"]})


def test_command_line_workloads_meet_the_same_host_check_as_plan_files(monkeypatch):
    """`run --workloads compile --dry-run` without a Linux source is refused before
    anything runs, in the words a plan file's check uses (it said nothing)."""
    from vmtax.helpers import kernel_tree

    def no_source() -> None:
        raise VmtaxError("VMTAX_LINUX_SOURCE=9.9: linux-source-9.9 is not installed")
    monkeypatch.setattr(kernel_tree, "tarball", no_source)
    with pytest.raises(VmtaxError, match=r"^--workloads compile: this host cannot run it: "
                       r"objects: expected a Linux source tarball .*linux-source-9\.9"):
        classic(target_names=["native"], workload_names=["compile"])


@pytest.mark.parametrize("name, kind, options, why", [
    ("vm", "vm", {"network": "none"}, 'network = "none"'),
    ("libvirt:dom", "libvirt", {"domain": "dom"}, "an existing domain"),
])
def test_a_target_that_cannot_serve_host_clients_is_refused_at_the_plan_check(name, kind,
                                                                              options, why):
    """A client-server workload on a target whose options give its server no way to a
    client on the host: refused before anything runs, not when the server starts."""
    with pytest.raises(VmtaxError, match=f"iperf3: {name} refuses serving host clients "
                                         rf"\({why}"):
        plan.Plan(targets=[plan.TargetSpec("native", "native", {}),
                           plan.TargetSpec(name, kind, options)],
                  workloads=[plan.WorkloadSpec("iperf3", {})])
    # A one-role workload runs there.
    plan.Plan(targets=[plan.TargetSpec(name, kind, options)],
              workloads=[plan.WorkloadSpec("cpu", {})])
