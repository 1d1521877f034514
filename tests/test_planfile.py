import dataclasses
import json
import os
import re
import resource
import shutil
import textwrap

import pytest
from click.testing import CliRunner
from conftest import ROOT, known, vmtax

from vmtax.cli import plan as cli_plan
from vmtax.core import option_types
from vmtax.core.errors import VmtaxError
from vmtax.core.runtime import runtimes
from vmtax.core import workload as workloads
from vmtax.host import hugepages
from vmtax.studies import estimate, plan, plan_bounds, planfile
from vmtax.studies.plan import TargetSpec, WorkloadSpec
from vmtax.studies.planfile import PlanError
from vmtax.studies.toml_lines import Locator

# A guest's options every VMM shares (vmtax.targets.vmm_target), then QEMU's own.
VM_OPTIONS = ('vcpus, memory, kernel, disk_size, boot_timeout, binaries, hugepages, '
              'guest_hugepages, pin, kernel_args, network, qemu, accel, machine, cpu, icount, '
              'vhost, disk_cache, disk_aio, iothread, disk_bus, tcg_thread, tb_size')

PLANS = sorted((ROOT / "plans").glob("*.toml"))
CPUS = os.sched_getaffinity(0)
needs_sysbench = pytest.mark.skipif(shutil.which("sysbench") is None,
                                    reason="param names are checked against the host's sysbench")


def load(text: str):
    return planfile.loads(textwrap.dedent(text), "x.toml")


def problems(text: str) -> list[str]:
    with pytest.raises(PlanError) as exc:
        load(text)
    return exc.value.lines


TWO_TARGETS = """
    [targets.native]
    [targets.vm]
"""


# -- shipped plans -----------------------------------------------------------------------

@pytest.fixture
def host_has_huge_pages(monkeypatch):
    """The shipped plans are checked as plans, not against this host, where reserving huge
    pages needs root and free memory (the host check has tests of its own)."""
    monkeypatch.setattr(hugepages, "capacity_problem", lambda wanted: None)


@pytest.mark.parametrize("path", PLANS, ids=[p.name for p in PLANS])
def test_every_shipped_plan_loads(path, host_has_huge_pages, vmms_built):
    if path.name == "pinning.toml" and 1 not in CPUS:
        pytest.skip("pins a vCPU to host CPU 1")
    if path.name == "density.toml":   # read by `vmtax density`, not `vmtax run`
        from vmtax.cli.density import load_plan
        settings, targets = load_plan(str(path))
        assert settings and targets
        return
    if path.name == "tune.toml":      # read by `vmtax tune`, its [tune] table too
        from vmtax.studies import tune
        search = tune.load(str(path))
        assert search.knobs and search.plan.workloads
        return
    p = planfile.load(path)
    assert p.targets and p.workloads


def test_shipped_plans_are_found():
    assert {p.name for p in PLANS} >= {"classic.toml", "hugepages.toml", "pinning.toml"}


def classic() -> plan.Plan:
    return plan.from_names(*plan.classic_names())


def test_classic_plan_file_is_the_classic_plan():
    assert planfile.load(ROOT / "plans" / "classic.toml") == classic()
    assert plan.classic_names() == (["native", "container", "vm"],
                                    ["cpu", "threads", "memory", "fileio", "mutex"])


def test_hugepages_plan_is_the_e5_matrix(host_has_huge_pages):
    p = planfile.load(ROOT / "plans" / "hugepages.toml")
    assert [(t.name, t.options["hugepages"]) for t in p.targets] == [
        ("vm[hugepages=2M]", "2M"), ("vm[hugepages=none]", None)]
    assert all(t.options["guest_hugepages"] == 48 for t in p.targets)
    assert p.baseline == "vm[hugepages=none]"
    points = {(w.params["threads"], w.params["memory-access-mode"],
               w.params["memory-block-size"], w.params["memory-hugetlb"]) for w in p.workloads}
    assert len(p.workloads) == len(points) == 3 * 2 * 3 * 2
    assert {pt[0] for pt in points} == {1, 2, 4} and {pt[1] for pt in points} == {"seq", "rnd"}
    assert {pt[3] for pt in points} == {"on", "off"}
    quick = planfile.load(ROOT / "plans" / "hugepages.toml", quick=True)
    assert (quick.runs, quick.warmup, quick.time) == (1, 0, 1)
    assert quick.targets == p.targets and quick.workloads == p.workloads


@pytest.mark.skipif(1 not in CPUS, reason="pins a vCPU to host CPU 1")
def test_pinning_plan_sweeps_pin_on_and_off():
    p = planfile.load(ROOT / "plans" / "pinning.toml")
    assert [(t.name, t.options.get("pin")) for t in p.targets] == [
        ("native", None), ("vm[pin=1]", [1]), ("vm[pin=none]", None)]
    assert "pin" not in p.targets[0].options


def test_the_format_in_the_module_docstring_is_a_valid_plan():
    example = planfile.__doc__.split("\n\n", 1)[1].split("\nLists sweep")[0]
    p = load(example)
    assert [t.name for t in p.targets] == [
        "native", "tcg[vcpus=1]", "tcg[vcpus=2]", "big[vcpus=2,memory=2G]",
        "big[vcpus=4,memory=4G]"]
    assert len(p.workloads) == 3 * 2 * 2


# -- expansion ---------------------------------------------------------------------------

def test_settings_and_defaults():
    p = load(TWO_TARGETS + """
        [[workloads]]
        name = "cpu"
    """)
    assert (p.runs, p.warmup, p.time, p.baseline, p.interleave) == (5, 1, 2, "native", True)
    p = load("""
        runs = 5
        warmup = 0
        time = false
        baseline = "vm"
        interleave = false
        max_runs = 9
        ci_target = 0.05
    """ + TWO_TARGETS + """
        [[workloads]]
        name = "cpu"
    """)
    assert (p.runs, p.warmup, p.time, p.baseline, p.interleave, p.max_runs, p.ci_target) == (
        5, 0, None, "vm", False, 9, 0.05)


def test_kind_defaults_to_the_table_name_and_options_pass_through():
    p = load("""
        [targets.vm]
        vcpus = 4
        memory = "2G"
        [targets.runc]
        kind = "container"
        runtime = "runc"
        [[workloads]]
        name = "cpu"
    """)
    assert p.targets == [TargetSpec("vm", "vm", {"vcpus": 4, "memory": "2G"}),
                         TargetSpec("runc", "container", {"runtime": "runc"})]


def test_target_option_lists_multiply_in_the_order_written():
    p = load("""
        [targets.vm]
        accel = "tcg"
        vcpus = [1, 2]
        memory = ["1G", "2G"]
        [[workloads]]
        name = "cpu"
    """)
    assert [t.name for t in p.targets] == [
        "vm[vcpus=1,memory=1G]", "vm[vcpus=1,memory=2G]",
        "vm[vcpus=2,memory=1G]", "vm[vcpus=2,memory=2G]"]
    assert p.targets[1].options == {"accel": "tcg", "vcpus": 1, "memory": "2G"}


def test_target_zip_steps_options_together():
    p = load("""
        [targets.vm]
        zip = { vcpus = [1, 2, 4], memory = ["1G", "2G", "4G"] }
        [[workloads]]
        name = "cpu"
    """)
    assert [(t.name, t.options) for t in p.targets] == [
        ("vm[vcpus=1,memory=1G]", {"vcpus": 1, "memory": "1G"}),
        ("vm[vcpus=2,memory=2G]", {"vcpus": 2, "memory": "2G"}),
        ("vm[vcpus=4,memory=4G]", {"vcpus": 4, "memory": "4G"})]


def test_a_list_valued_option_sweeps_only_with_a_list_of_lists():
    cpu = min(CPUS)
    p = load(f"""
        [targets.a]
        kind = "vm"
        vcpus = 1
        pin = [{cpu}]
        [targets.b]
        kind = "vm"
        vcpus = 1
        pin = [[{cpu}], "none"]
        hugepages = "none"
        [[workloads]]
        name = "cpu"
    """)
    assert [(t.name, t.options["pin"]) for t in p.targets] == [
        ("a", [cpu]), (f"b[pin={cpu}]", [cpu]), ("b[pin=none]", None)]
    assert p.targets[1].options["hugepages"] is None


def test_workload_params_multiply_and_zip_adds_one_dimension():
    p = load(TWO_TARGETS + """
        [[workloads]]
        name = "memory"
        params = { threads = [1, 2], memory-access-mode = ["seq", "rnd"], memory-oper = "read" }
        zip = { memory-block-size = ["16K", "1M", "1G"], memory-total-size = ["1G", "8G", "64G"] }
        [[workloads]]
        name = "cpu"
    """)
    memory = [w.params for w in p.workloads if w.name == "memory"]
    assert len(memory) == 2 * 2 * 3 and len(p.workloads) == 13
    assert memory[:4] == [
        {"threads": 1, "memory-access-mode": "seq", "memory-oper": "read",
         "memory-block-size": size, "memory-total-size": total}
        for size, total in [("16K", "1G"), ("1M", "8G"), ("1G", "64G")]] + [
        {"threads": 1, "memory-access-mode": "rnd", "memory-oper": "read",
         "memory-block-size": "16K", "memory-total-size": "1G"}]
    assert p.workloads[-1] == WorkloadSpec("cpu", {})


def test_params_in_a_subtable():
    p = load(TWO_TARGETS + """
        [[workloads]]
        name = "threads"
        [workloads.params]
        threads = [8, 64]
    """)
    assert [w.params for w in p.workloads] == [{"threads": 8}, {"threads": 64}]


def test_a_misspelt_param_is_caught_by_the_option_model_with_a_hint():
    [line] = problems(TWO_TARGETS + """
        [[workloads]]
        name = "memory"
        params = { memory-blocksize = "8k" }
    """)
    assert line.endswith('got "memory-blocksize" (did you mean "memory-block-size"?)')


# -- validation: one line per problem, with file, line and key ---------------------------

ERRORS = [
    # the issue's own example, line for line
    ("""
        runs = 3
        warmup = 1

        [targets.native]

        [targets.container]
        runtime = "runc"

        [targets.vm]
        accel = "tcg"
        memory = "lots"

        [[workloads]]
        name = "cpu"
     """, 'x.toml:12: targets.vm.memory: expected a size like "2G", got "lots"'),
    ("rnus = 3\n" + TWO_TARGETS + "[[workloads]]\nname = 'cpu'",
     'x.toml:1: top level: expected one of runs, warmup, time, baseline, interleave, '
     'drop_caches, max_runs, ci_target, collect, timeout, name, targets, workloads, quick, '
     'density, boot, got "rnus" (did you mean "runs"?)'),
    ("runs = 0\n" + TWO_TARGETS + "[[workloads]]\nname = 'cpu'",
     "x.toml:1: runs: expected a whole number from 1 to 1000000000, got 0"),
    ("warmup = -1\n" + TWO_TARGETS + "[[workloads]]\nname = 'cpu'",
     "x.toml:1: warmup: expected a whole number from 0 to 1000000000, got -1"),
    ("runs = true\n" + TWO_TARGETS + "[[workloads]]\nname = 'cpu'",
     "x.toml:1: runs: expected a whole number from 1 to 1000000000, got true"),
    ("time = 1.5\n" + TWO_TARGETS + "[[workloads]]\nname = 'cpu'",
     "x.toml:1: time: expected a whole number of seconds from 1 to 86400, or false for no limit, "
     "got 1.5"),
    ('time = "2"\n' + TWO_TARGETS + "[[workloads]]\nname = 'cpu'",
     'x.toml:1: time: expected a whole number of seconds from 1 to 86400, or false for no limit, '
     'got "2"'),
    ('interleave = "yes"\n' + TWO_TARGETS + "[[workloads]]\nname = 'cpu'",
     'x.toml:1: interleave: expected true or false, got "yes"'),
    ("ci_target = 2\n" + TWO_TARGETS + "[[workloads]]\nname = 'cpu'",
     "x.toml:1: ci_target: expected a fraction between 0 and 1, like 0.02 for 2%, got 2"),
    ("runs = 5\nmax_runs = 4\n" + TWO_TARGETS + "[[workloads]]\nname = 'cpu'",
     "x.toml:2: max_runs: expected at least runs (5), got 4"),
    ('baseline = "xen"\n' + TWO_TARGETS + "[[workloads]]\nname = 'cpu'",
     'x.toml:1: baseline: expected one of the targets (native, vm), got "xen"'),
    ('baseline = "vm"\n[targets.vm]\nvcpus = [1, 2]\n[[workloads]]\nname = "cpu"',
     'x.toml:1: baseline: expected one of the targets (vm[vcpus=1], vm[vcpus=2]), got "vm"'),
    ("[targets.xen]\n[[workloads]]\nname = 'cpu'",
     f"x.toml:1: targets.xen.kind: expected a target kind ({known('target')}), "
     "got nothing (the table name is not a kind)"),
    ("[targets.box]\nkind = 'lxc'\n[[workloads]]\nname = 'cpu'",
     f'x.toml:2: targets.box.kind: expected a target kind ({known("target")}), got "lxc"'),
    ("[targets.vm]\nvcpu = 2\n[[workloads]]\nname = 'cpu'",
     'x.toml:2: targets.vm: expected a vm option (' + VM_OPTIONS + '), '
     'got "vcpu" (did you mean "vcpus"?)'),
    ("[targets.native]\nvcpus = 2\n[[workloads]]\nname = 'cpu'",
     'x.toml:2: targets.native: expected no options (native takes none), got "vcpus"'),
    ("[targets.container]\nruntime = 'lxc'\n[[workloads]]\nname = 'cpu'",
     'x.toml:2: targets.container.runtime: expected one of "auto", '
     + ", ".join(f'"{r}"' for r in runtimes()) + ', got "lxc"'),
    ("[targets.vm]\naccel = 'xen'\n[[workloads]]\nname = 'cpu'",
     'x.toml:2: targets.vm.accel: expected one of "auto", "kvm", "tcg", got "xen"'),
    ("[targets.vm]\nvcpus = [\n  1,\n  0,\n]\n[[workloads]]\nname = 'cpu'",
     "x.toml:4: targets.vm.vcpus[1]: expected a whole number from 1 to 1000000000, got 0"),
    ("[targets.vm]\nvcpus = '2'\n[[workloads]]\nname = 'cpu'",
     'x.toml:2: targets.vm.vcpus: expected a whole number from 1 to 1000000000, got "2"'),
    ("[targets.vm]\nmemory = 2048\n[[workloads]]\nname = 'cpu'",
     'x.toml:2: targets.vm.memory: expected a size like "2G", got 2048'),
    ("[targets.vm]\nboot_timeout = 0\n[[workloads]]\nname = 'cpu'",
     "x.toml:2: targets.vm.boot_timeout: expected a positive number of seconds, at most "
     "86400 (a day), got 0"),
    ("[targets.vm]\nhugepages = '4M'\n[[workloads]]\nname = 'cpu'",
     'x.toml:2: targets.vm.hugepages: expected one of "2M", "1G", "none", got "4M"'),
    ("[targets.vm]\nguest_hugepages = -1\n[[workloads]]\nname = 'cpu'",
     "x.toml:2: targets.vm.guest_hugepages: expected a whole number from 0 to 1000000000, got -1"),
    ("[targets.vm]\npin = [0, 4096]\n[[workloads]]\nname = 'cpu'",
     "x.toml:2: targets.vm.pin: expected distinct host CPUs vmtax may use, as a list or a "
     f'cpuset like "0-1" (usable here: {option_types.cpulist(CPUS)}), or "none", got [0, 4096]'),
    ("[targets.vm]\nqemu = '/no/such/qemu'\n[[workloads]]\nname = 'cpu'",
     'x.toml:2: targets.vm.qemu: expected an executable program (a path, or a name found on '
     'PATH), got "/no/such/qemu"'),
    ("[targets.vm]\nkernel = '/no/such/vmlinux'\n[[workloads]]\nname = 'cpu'",
     'x.toml:2: targets.vm.kernel: expected "debian" (Debian\'s kernel), "debian-rt" (its '
     'PREEMPT_RT kernel), "minimal" (built by vmtax) or the path of a vmlinux or bzImage '
     'file, got "/no/such/vmlinux"'),
    ("[targets.vm]\nmachine = 'pc'\n[[workloads]]\nname = 'cpu'",
     'x.toml:2: targets.vm.machine: expected one of "microvm", "q35", got "pc"'),
    ("targets.vm.memory = 'lots'\n[[workloads]]\nname = 'cpu'",
     'x.toml:1: targets.vm.memory: expected a size like "2G", got "lots"'),
    ("[targets.vm]\nzip = { vcpus = [1, 2], memory = ['1G'] }\n[[workloads]]\nname = 'cpu'",
     "x.toml:2: targets.vm.zip.memory: expected 2 values, as many as vcpus has, got 1"),
    ("targets = 3\n[[workloads]]\nname = 'cpu'",
     "x.toml:1: targets: expected [targets.NAME] tables, got 3"),
    ("targets.vm = 3\n[[workloads]]\nname = 'cpu'",
     "x.toml:1: targets.vm: expected a table of target options, got 3"),
    (TWO_TARGETS + "[[workloads]]\nname = 'tpcc'",
     'x.toml:5: workloads[0].name: expected a workload ('
     + ", ".join(workloads.registered()) + '), got "tpcc"'),
    (TWO_TARGETS + "[[workloads]]\nname = 'cpu'\n[[workloads]]\nparams = {}",
     "x.toml:6: workloads[1].name: expected a workload (" + ", ".join(workloads.registered())
     + "), got nothing"),
    ("workloads = ['cpu']\n" + TWO_TARGETS,
     'x.toml:1: workloads: expected [[workloads]] tables, got ["cpu"]'),
    (TWO_TARGETS + "[[workloads]]\nname = 'cpu'\nparam = { threads = 2 }",
     'x.toml:6: workloads[0]: expected one of name, params, zip, got "param" (did you mean '
     '"params"?)'),
    (TWO_TARGETS + "[[workloads]]\nname = 'cpu'\nparams = 3",
     "x.toml:6: workloads[0].params: expected a table of parameters, like { threads = 4 }, "
     "got 3"),
    (TWO_TARGETS + "[[workloads]]\nname = 'memory'\nparams = { threads = [] }",
     "x.toml:6: workloads[0].params.threads: expected a value or a non-empty list of values "
     "to sweep, got []"),
    (TWO_TARGETS + "[[workloads]]\nname = 'memory'\n"
     "zip = { memory-block-size = ['1K', '2K'], memory-total-size = ['1G', '2G', '4G'] }",
     "x.toml:6: workloads[0].zip.memory-total-size: expected 2 values, as many as "
     "memory-block-size has, got 3"),
    (TWO_TARGETS + "[[workloads]]\nname = 'memory'\n"
     "params = { memory-block-size = '1K' }\nzip = { memory-block-size = ['1K', '2K'] }",
     "x.toml:7: workloads[0].zip.memory-block-size: expected each key either swept in zip or "
     "set outside it, got both"),
    (TWO_TARGETS + "[[workloads]]\nname = 'memory'\nzip = { memory-block-size = '1K' }",
     'x.toml:6: workloads[0].zip.memory-block-size: expected a non-empty list of values, '
     'got "1K"'),
    (TWO_TARGETS + "[[workloads]]\nname = 'memory'\nzip = ['1K']",
     'x.toml:6: workloads[0].zip: expected a table of equally long lists, like '
     '{ a = [1, 2], b = ["x", "y"] }, got ["1K"]'),
    (TWO_TARGETS + "[[workloads]]\nname = 'cpu'\nparams = { threads = [1, 2] }\n"
     "[[workloads]]\nname = 'cpu'\nparams = { threads = 2 }",
     'x.toml:7: workloads[1]: expected workload configurations that are not already in the '
     'plan, got cpu { threads = 2 } again'),
]


@pytest.mark.plugin_lists
@pytest.mark.parametrize("text, message", ERRORS)
def test_each_problem_is_one_line_naming_file_line_and_key(text, message):
    assert problems(text) == [message]


@needs_sysbench
@pytest.mark.parametrize("params, message", [
    ("{ memory-blocksize = '8k' }",
     'x.toml:6: workloads[0].params: expected a memory option (threads, time, events, rate, '
     'percentile, rand-type, rand-seed, thread-stack-size, memory-block-size, '
     'memory-total-size, memory-scope, memory-hugetlb, memory-oper, memory-access-mode), '
     'got "memory-blocksize" (did you mean "memory-block-size"?)'),
    ("{ memory-access-mode = 'random' }",
     'x.toml:6: workloads[0].params.memory-access-mode: expected one of "seq", "rnd", '
     '"none", got "random"'),
    ("{ memory-block-size = 'big' }",
     'x.toml:6: workloads[0].params.memory-block-size: expected a size like "8K" or "1G", '
     'or a number of bytes, got "big"'),
    ("{ threads = 1.5 }",
     "x.toml:6: workloads[0].params.threads: expected a whole number from 1 to 1000000000, "
     "got 1.5"),
    ("{ memory-hugetlb = 'yes' }",
     'x.toml:6: workloads[0].params.memory-hugetlb: expected "on", "off", true or false, '
     'got "yes"'),
    ("{ threads = [1, 'two'] }",
     'x.toml:6: workloads[0].params.threads[1]: expected a whole number from 1 to 1000000000, '
     'got "two"'),
])
def test_workload_params_are_checked_against_sysbench(params, message):
    assert problems(TWO_TARGETS + f"[[workloads]]\nname = 'memory'\nparams = {params}") == [
        message]


def test_a_problem_the_workload_finds_is_placed_at_its_param():
    [line] = problems(TWO_TARGETS + "[[workloads]]\nname = 'cpu'\nparams = { time = 0 }")
    assert line == ("x.toml:6: workloads[0].params.time: expected a whole number from 1 to "
                    "86400, got 0")


def test_toml_syntax_errors_keep_line_and_column():
    assert problems("runs = 3\nwarmup = = 1\n") == [
        "x.toml:2: invalid TOML: Invalid value (column 10)"]
    assert problems("runs = 3\nwarmup =") == [
        "x.toml:2: invalid TOML: Invalid value (at the end)"]


def test_an_empty_plan_says_what_is_missing():
    assert problems("") == [
        "x.toml:1: targets: expected at least one [targets.NAME] table, got none",
        "x.toml:1: workloads: expected at least one [[workloads]] table, got none"]


def test_every_problem_is_reported_in_line_order():
    with pytest.raises(PlanError) as exc:
        load("""
            [[workloads]]
            name = "cpu"
            extra = 1
            [targets.vm]
            memory = "lots"
            runs = 0
        """)
    assert str(exc.value).splitlines() == [
        "x.toml: 3 problems",
        'x.toml:4: workloads[0]: expected one of name, params, zip, got "extra"',
        'x.toml:6: targets.vm.memory: expected a size like "2G", got "lots"',
        'x.toml:7: targets.vm: expected a vm option (' + VM_OPTIONS + '), '
        'got "runs"']


def test_an_unreadable_file_is_one_line(tmp_path):
    with pytest.raises(VmtaxError, match=r"^.*missing\.toml: cannot read the plan file"):
        planfile.load(tmp_path / "missing.toml")


# -- the locator -------------------------------------------------------------------------

def test_locator_follows_tables_arrays_dotted_keys_and_inline_tables():
    text = textwrap.dedent('''\
        title = "a # not a comment [x] = 1"
        notes = """
        key = "inside a string"
        """
        [targets."vm:tcg"]   # a comment
        memory . size = '2G'
        [[workloads]]
        name = "cpu"
        [[workloads]]
        params = { threads = [1,
          2], nested = { deep = 1 } }
        [workloads.extra]
        x = [[1, 2], [3]]
        ''')
    where = Locator(text)
    assert where.line(("notes",)) == 2
    assert where.line(("key",)) == 1                    # not found: the first line
    assert where.line(("targets", "vm:tcg")) == 5
    assert where.line(("targets", "vm:tcg", "memory", "size")) == 6
    assert where.line(("workloads", 0, "name")) == 8
    assert where.line(("workloads", 1)) == 9
    assert where.line(("workloads", 1, "params", "threads", 1)) == 11
    assert where.line(("workloads", 1, "params", "nested", "deep")) == 11
    assert where.line(("workloads", 1, "extra", "x", 1, 0)) == 13
    assert where.line(("workloads", 1, "params", "unknown")) == 10


# -- estimate and the plan command ----------------------------------------------------------

def test_estimate_of_the_classic_plan():
    e = estimate.estimate(classic())
    reps = 1 + plan.DEFAULT_RUNS
    from vmtax.core import plugin as plugins
    from vmtax.targets.container import ContainerTarget
    from vmtax.targets.native import NativeTarget
    from vmtax.targets.vm import VmTarget
    from vmtax.workloads.sysbench import PREPARE_MIB_S, Mutex
    vm_slowdown = VmTarget.slowdown(plugins.build(VmTarget.Options, {}, "vm"))
    mutex = Mutex.make({}).run_seconds()
    expected = (VmTarget.startup_seconds + ContainerTarget.startup_seconds
                + sum((4 * (2 + kind.job_seconds) + mutex * slowdown + kind.job_seconds) * reps
                      for kind, slowdown in ((NativeTarget, 1), (ContainerTarget, 1),
                                             (VmTarget, vm_slowdown)))
                + 2048 / PREPARE_MIB_S * 3)                        # fileio prepare
    assert e.seconds == pytest.approx(expected)
    assert any("vm target starts" in a for a in e.assumptions)
    assert any("mutex" in a for a in e.assumptions)


def test_an_estimate_stretches_fixed_work_in_a_tcg_guest_and_learns_from_stored_runs(
        tmp_path):
    """Issue 48.14: plans/hypervisors.toml --quick was estimated at native speed inside
    TCG (4 min 42 s; README: under 20 min), and serving's estimate left out what no step's
    time bounds. Fixed work now takes the target's slowdown, serving counts its curl
    checks and workers, and a target that ran a workload before is estimated as it ran."""
    from vmtax.results.store import Store
    from vmtax.workloads.sysbench import Mutex

    tcg = plan.from_names(["vm:tcg"], ["mutex"], runs=2, warmup=0)
    kvm_like = plan.from_names(["native"], ["mutex"], runs=2, warmup=0)
    work = Mutex.make({}).run_seconds()
    assert estimate.estimate(tcg).seconds == pytest.approx(5 + 2 * (10 * work + 0.4))
    assert estimate.estimate(kvm_like).seconds == pytest.approx(2 * (work + 0.05))
    store = Store(tmp_path)
    run_id = store.new_run(tcg.to_dict(), {}, "0")
    for idx in range(3):
        store.add_rep(run_id, target="vm:tcg", workload="mutex",
                      params=tcg.workloads[0].make(tcg.time).params, phase="measure", idx=idx,
                      status="ok", argv=[], started=0.0, host_elapsed=[7.0, 8.0, 30.0][idx])
    store.set_target(run_id, "vm:tcg", "vm", {"accel": "tcg"})
    learned = estimate.estimate(tcg, store=store)
    assert learned.seconds == pytest.approx(5 + 2 * 8.0)
    assert "vm:tcg · mutex: as stored runs took it (median of 3)" in learned.assumptions
    serving = planfile.load(ROOT / "plans" / "serving.toml", quick=True)
    assert estimate.estimate(serving).seconds > 120


def test_plan_dry_run_prints_matrix_and_estimate(host_has_huge_pages):
    result = CliRunner().invoke(cli_plan.plan_command,
                                [str(ROOT / "plans" / "hugepages.toml"), "--dry-run"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "2 targets × 36 workload configurations × (1 warm-up + 3 measured) = 288" in out
    assert re.search(r"vm\[hugepages=2M\]\s+vm\s+guest_hugepages=48 memory=1G hugepages=2M", out)
    assert "memory: memory-total-size=100G time=2" in out
    assert "memory-access-mode=rnd memory-block-size=64M memory-hugetlb=off threads=4" in out
    assert "estimated run time: " in out and "each vm target starts in 5 s" in out


def test_plan_without_dry_run_prints_the_summary_only():
    result = CliRunner().invoke(cli_plan.plan_command, [str(ROOT / "plans" / "classic.toml")])
    assert result.exit_code == 0
    assert result.output.startswith(str(ROOT / "plans" / "classic.toml") + ": 3 targets × 5")
    expected = estimate.duration(estimate.estimate(classic()).seconds)
    assert f"estimated run time: {expected}" in result.output
    assert "workload configurations (" not in result.output


def test_plan_json():
    result = CliRunner().invoke(cli_plan.plan_command,
                                [str(ROOT / "plans" / "classic.toml"), "--json"])
    data = json.loads(result.output)
    assert plan.Plan.from_dict(data["plan"]) == classic()
    assert data["configurations"][0] == {"workload": "cpu",
                                         "params": {"cpu-max-prime": 2000, "time": 2}}
    assert data["repetitions"] == 90
    assert data["estimate"]["seconds"] == round(estimate.estimate(classic()).seconds)
    assert data["estimate"]["assumptions"]


def test_plan_command_reports_problems_as_lines(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[targets.vm]\nmemory = "lots"\n[[workloads]]\nname = "cpu"\n')
    result = vmtax("plan", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f'vmtax: error: {bad}:2: targets.vm.memory: expected a size like "2G", got "lots"')


# -- the tables stay in step with the code they check -------------------------------------

@pytest.mark.plugin_lists
def test_every_plugin_declares_its_options_and_metrics_completely():
    from vmtax.core import plugin
    from vmtax.core import target as targets
    from vmtax.core.workload import check_manifest
    for cls in [*targets.kinds().values(), *workloads.registered().values()]:
        for info in plugin.option_infos(cls.Options).values():
            assert info.doc and info.expected(), f"{cls.name}.{info.key}"
        assert cls.description, cls.name
    for cls in workloads.registered().values():
        check_manifest(cls)


def test_every_plan_setting_has_a_check():
    fields = {f.name for f in dataclasses.fields(plan.Plan)} - {"targets", "workloads"}
    assert set(planfile.SETTINGS) == fields


# -- what only several values or the host can tell -------------------------------------------

ONE_CPU = min(CPUS)


@pytest.mark.parametrize("text,message", [
    (f"[targets.vm]\nvcpus = 2\npin = [{ONE_CPU}]\n[[workloads]]\nname = 'cpu'",
     f"x.toml:3: targets.vm.pin: expected one host CPU per vCPU (vcpus = 2), got [{ONE_CPU}]"),
    # Not written down: the default vcpus (2) is what pin is held against, at the table's line.
    (f"[targets.vm]\npin = [[{ONE_CPU}], 'none']\n[[workloads]]\nname = 'cpu'",
     f"x.toml:2: targets.vm.pin: expected one host CPU per vCPU (vcpus = 2), got [{ONE_CPU}] "
     f"(in vm[pin={ONE_CPU}])"),
    ("[targets.vm]\nhugepages = '1G'\nmemory = '1536M'\n[[workloads]]\nname = 'cpu'",
     'x.toml:3: targets.vm.memory: expected a whole number of 1 GiB huge pages '
     '(hugepages = "1G"), got "1536M"'),
    ("[targets.vm]\nguest_hugepages = 200\nzip = { memory = ['512M', '1G'] }\n"
     "[[workloads]]\nname = 'cpu'",
     "x.toml:2: targets.vm.guest_hugepages: expected at most 128 2 MiB pages, which leaves "
     "the guest 256 MiB of its memory (512M); or more memory, got 200 (in vm[memory=512M])"),
])
def test_options_that_do_not_fit_together(text, message):
    assert problems(text) == [message]


def test_host_huge_pages_of_all_vms_together(monkeypatch):
    asked = []

    def capacity(wanted):
        asked.append(wanted)
        return "too many"
    monkeypatch.setattr(hugepages, "capacity_problem", capacity)
    assert problems("""
        [targets.vm]
        hugepages = ["2M", "1G", "none"]
        memory = "2G"
        [[workloads]]
        name = "cpu"
    """) == ["x.toml:3: targets.vm.hugepages: too many (for vm[hugepages=2M], "
             "vm[hugepages=1G], up together)"]
    assert asked == [{"2M": 1024, "1G": 2}]


def test_host_huge_pages_that_fit_are_not_a_problem(monkeypatch):
    monkeypatch.setattr(hugepages, "capacity_problem", lambda wanted: None)
    p = load('[targets.vm]\nhugepages = "2M"\n[[workloads]]\nname = "cpu"')
    assert p.targets[0].options["hugepages"] == "2M"


@needs_sysbench
def test_a_hugetlb_block_must_fit_in_each_targets_huge_pages(monkeypatch):
    monkeypatch.setattr(hugepages, "host_free", lambda: 2)
    assert problems("""
        [targets.native]
        [targets.vm]
        guest_hugepages = 34
        [[workloads]]
        name = "memory"
        params = { memory-hugetlb = "on", memory-block-size = ["16K", "64M", "65M"] }
    """) == [
        'x.toml:5: workloads[0]: memory-hugetlb = "on" with a buffer of "16K" takes 3 2 MiB '
        "huge pages (sysbench rounds each up by up to 4 MiB), but native runs on the host, "
        "which has 2 free",
        'x.toml:5: workloads[0]: memory-hugetlb = "on" with a buffer of "64M" takes 32 2 MiB '
        "huge pages (sysbench rounds each up by up to 4 MiB), but native runs on the host, "
        "which has 2 free",
        'x.toml:5: workloads[0]: memory-hugetlb = "on" with a buffer of "65M" takes 35 2 MiB '
        "huge pages (sysbench rounds each up by up to 4 MiB), but native runs on the host, "
        "which has 2 free",
        'x.toml:5: workloads[0]: memory-hugetlb = "on" with a buffer of "65M" takes 35 2 MiB '
        "huge pages (sysbench rounds each up by up to 4 MiB), but vm reserves 34 "
        "for its workloads"]


@needs_sysbench
def test_a_local_scope_takes_a_buffer_per_thread():
    assert problems("""
        [targets.vm]
        guest_hugepages = 31
        [[workloads]]
        name = "memory"
        zip = { threads = [1, 4], memory-block-size = ["16M", "16M"] }
        params = { memory-hugetlb = true, memory-scope = "local" }
    """) == [
        "x.toml:4: workloads[0]: memory-hugetlb = \"on\" with 4 threads' buffers of \"16M\" "
        "takes 32 2 MiB huge pages (sysbench rounds each up by up to 4 MiB), but vm reserves "
        "31 for its workloads"]


def test_hugetlb_off_needs_no_huge_pages():
    p = load("""
        [targets.native]
        [[workloads]]
        name = "memory"
        params = { memory-hugetlb = "off", memory-block-size = "1G" }
    """)
    assert p.workloads[0].params["memory-hugetlb"] == "off"


def test_a_sysbench_without_hugetlb_is_named_as_such(monkeypatch):
    from vmtax.workloads import sysbench
    monkeypatch.setattr(sysbench, "_host_options", lambda test: frozenset({"memory-oper"}))
    assert problems("""
        [targets.vm]
        [[workloads]]
        name = "memory"
        params = { memory-hugetlb = "on" }
    """) == [
        "x.toml:5: workloads[0].params.memory-hugetlb: expected an option the host's sysbench "
        "has (its `sysbench memory help` has no --memory-hugetlb: it was built without "
        "large-page support (HAVE_LARGE_PAGES, Linux only); Debian's 1.0.20 has it), "
        'got "on"']


def test_container_cpus_and_vm_icount_are_options():
    p = load(f"""
        [targets.container]
        cpus = [[{ONE_CPU}], "none"]
        [targets.vm]
        icount = "shift=0,sleep=off"
        [[workloads]]
        name = "cpu"
    """)
    assert [(t.name, t.options.get("cpus")) for t in p.targets[:2]] == [
        (f"container[cpus={ONE_CPU}]", [ONE_CPU]), ("container[cpus=none]", None)]
    assert p.targets[2].options["icount"] == "shift=0,sleep=off"


# -- [quick] ---------------------------------------------------------------------------------

QUICK = """
    runs = 5
    time = 4
    [targets.vm]
    vcpus = [1, 2]
    memory = "2G"
    [[workloads]]
    name = "memory"
    params = { threads = [1, 2, 4], memory-access-mode = ["seq", "rnd"] }
    zip = { memory-block-size = ["16K", "1M"], memory-total-size = ["1G", "8G"] }
    [[workloads]]
    name = "cpu"
    [quick]
    runs = 1
    warmup = 0
    params = { threads = 1, memory-block-size = "4K" }
    [quick.targets.vm]
    vcpus = 1
"""


@needs_sysbench
def test_quick_replaces_settings_options_and_params_where_taken_even_swept_ones():
    full = load(QUICK)
    assert (full.runs, full.warmup, len(full.targets), len(full.workloads)) == (5, 1, 2, 13)
    quick = planfile.loads(textwrap.dedent(QUICK), "x.toml", quick=True)
    assert (quick.runs, quick.warmup, quick.time) == (1, 0, 4)
    assert [(t.name, t.options) for t in quick.targets] == [
        ("vm", {"vcpus": 1, "memory": "2G"})]
    # threads and the zipped block size are single values now; the rest of the zip stays.
    assert [w.params for w in quick.workloads] == [
        {"threads": 1, "memory-access-mode": mode, "memory-block-size": "4K",
         "memory-total-size": total}
        for mode in ("seq", "rnd") for total in ("1G", "8G")] + [{"threads": 1}]


@needs_sysbench
def test_quick_problems_are_named_and_placed_at_the_quick_table():
    text = (QUICK.replace("runs = 1", "runs = 0").replace("vcpus = 1", "vcpu = 1")
            .replace("warmup = 0", "warmup = 0\n    extra = true")
            .replace('"4K" }', '"4K", cpu-max-time = 1 }')
            + "    [quick.targets.nope]\n")
    assert problems(text) == [
        "x.toml:14: quick.runs: expected a whole number from 1 to 1000000000, got 0",
        'x.toml:16: quick: expected one of runs, warmup, time, baseline, interleave, '
        'drop_caches, max_runs, ci_target, collect, timeout, name, targets, params, got "extra"',
        'x.toml:17: quick.params: expected a param of a workload of the plan (cpu, memory), '
        'got "cpu-max-time"',
        'x.toml:19: quick.targets.vm: expected a vm option (' + VM_OPTIONS + '), got "vcpu" '
        '(did you mean "vcpus"?)',
        'x.toml:20: quick.targets.nope: expected a target table of the plan (vm), got "nope"']


def test_both_forms_are_checked_and_a_shared_problem_is_reported_once():
    text = QUICK.replace('memory = "2G"', 'memory = "lots"')
    assert problems(text) == ['x.toml:6: targets.vm.memory: expected a size like "2G", '
                              'got "lots"']
    with pytest.raises(PlanError) as err:
        planfile.loads(textwrap.dedent(QUICK.replace("runs = 1", "runs = 0")), "x.toml")
    assert err.value.lines == ["x.toml:14: quick.runs: expected a whole number from 1 to "
                               "1000000000, "
                               "got 0"]


def test_quick_without_a_quick_table():
    with pytest.raises(PlanError) as err:
        planfile.loads(textwrap.dedent(TWO_TARGETS + '[[workloads]]\nname = "cpu"'), "x.toml",
                       quick=True)
    assert err.value.lines == ["x.toml: --quick: the plan has no [quick] table"]


def test_plan_command_quick(host_has_huge_pages):
    result = CliRunner().invoke(cli_plan.plan_command,
                                [str(ROOT / "plans" / "hugepages.toml"), "--quick"])
    assert result.exit_code == 0, result.output
    assert ("2 targets × 36 workload configurations × (0 warm-up + 1 measured) = 72"
            in result.output)


def test_run_quick_needs_a_plan_file():
    result = vmtax("run", "--quick")
    assert result.returncode == 2
    assert result.stderr.strip() == ("vmtax: error: --quick would do nothing here: it takes a "
                                     "plan file (PLAN.toml)")


def test_classic_quick_is_one_short_run_with_tiny_fileio():
    quick = planfile.load(ROOT / "plans" / "classic.toml", quick=True)
    assert (quick.runs, quick.warmup, quick.time) == (1, 0, 1)
    assert quick.targets == classic().targets
    assert [(w.name, w.params) for w in quick.workloads] == [
        (w.name, {"file-total-size": "16M"} if w.name == "fileio" else w.params)
        for w in classic().workloads]


def test_what_a_target_refuses_is_refused_when_the_plan_is_checked():
    # gVisor runs no real-time thread, and rt-tests' cyclictest checks at start that it may
    # (whatever its priority): refused before anything runs, not after three repetitions
    # that fail with "run as root".
    why = ("refuses real-time scheduling (gVisor), which cyclictest needs at any priority: "
           "rt-tests checks that it may use SCHED_FIFO before it measures")
    with pytest.raises(VmtaxError) as err:
        plan.from_names(["native", "container:runsc"], ["cyclictest"])
    assert str(err.value) == f"cyclictest: container:runsc {why}"
    result = vmtax("run", "--targets", "container:runsc-ptrace", "--workloads", "cyclictest")
    assert result.returncode == 2
    assert result.stderr.strip() == f"vmtax: error: cyclictest: container:runsc-ptrace {why}"
    text = textwrap.dedent("""
        [targets.gvisor]
        kind = "container"
        runtime = "runsc"

        [[workloads]]
        name = "cpu"

        [[workloads]]
        name = "cyclictest"
        params = { priority = [50, "none"] }
        """)
    with pytest.raises(PlanError) as err:
        planfile.loads(text, "x.toml")
    assert err.value.lines == [f"x.toml:9: workloads[1]: gvisor {why}"]
    # Runtimes that schedule with the host's kernel refuse nothing.
    plan.from_names(["container:runc", "container"], ["cyclictest"])


def test_a_tuning_plan_given_to_run_says_which_command_reads_it(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text("[targets.native]\n[[workloads]]\nname = 'cpu'\n[tune]\nbaseline = 'native'\n")
    with pytest.raises(PlanError, match=r't\.toml:4: top level: .*got "tune" \(a \[tune\] '
                                        r'table is read by `vmtax tune PLAN`\)'):
        planfile.load(path)


# -- a plan's size, counted before it is expanded (issue 45.7) -----------------------------

def _one_gib_of_memory():
    # Expanding 10^10 points took 3.9 GB before the MemoryError: here it fails in seconds.
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def test_a_sweep_too_large_to_run_is_refused_in_one_line_before_it_is_expanded(tmp_path):
    numbers = "[" + ", ".join(str(i) for i in range(1, 101)) + "]"
    names = "[" + ", ".join(f'"{i}"' for i in range(1, 101)) + "]"
    path = tmp_path / "big.toml"
    path.write_text('[targets.vm]\nkind = "vm"\nboot_timeout = ' + numbers + "\ntb_size = "
                    + numbers + "\ncpu = " + names + "\nicount = " + names + "\nkernel_args = "
                    + names + '\n[[workloads]]\nname = "cpu"\n')
    result = vmtax("plan", str(path), timeout=120, preexec_fn=_one_gib_of_memory)
    assert (result.returncode, result.stderr) == (2, (
        f"vmtax: error: {path}:1: targets.vm: expected a plan of at most 10000 cells (target "
        "× workload configurations), got 10000000000 target configurations (100 × 100 × 100 "
        "× 100 × 100)\n"))


@pytest.fixture
def ten_cells(monkeypatch):
    monkeypatch.setattr(plan_bounds, "MAX_CELLS", 10)


def test_a_plans_cells_are_counted_over_its_tables(ten_cells):
    expected = "expected a plan of at most 10 cells (target × workload configurations), got"
    workload = '[[workloads]]\nname = "cpu"\n'
    assert problems('[targets.a]\nkind = "vm"\ncpu = ["a", "b", "c"]\n'
                    'icount = ["1", "2", "3", "4"]\n' + workload) == [
        f"x.toml:1: targets.a: {expected} 12 target configurations (3 × 4)"]
    assert problems('[targets.a]\nkind = "vm"\ncpu = ["a", "b", "c"]\n'
                    '[targets.b]\nkind = "vm"\nicount = ["1", "2", "3"]\n'
                    '[targets.c]\nkind = "vm"\nzip = { cpu = ["a", "b", "c", "d", "e"], '
                    'icount = ["1", "2", "3", "4", "5"] }\n' + workload) == [
        f"x.toml:7: targets.c: {expected} 11 target configurations (5 in this table)"]
    assert problems("[targets.native]\n[targets.vm]\n" + workload
                    + "params = { threads = [1, 2, 3] }\n" + workload
                    + "params = { threads = [1, 2], events = [1, 2] }\n") == [
        f"x.toml:6: workloads[1]: {expected} 2 target × 7 workload configurations = 14 cells "
        "(4 = 2 × 2 in this table)"]
    at_the_cap = load("[targets.native]\n[targets.vm]\n" + workload
                      + "params = { threads = [1, 2, 3, 4, 5] }\n")
    assert (len(at_the_cap.targets), len(at_the_cap.workloads)) == (2, 5)


def test_the_cap_on_a_plans_cells_is_the_documented_one():
    assert plan_bounds.MAX_CELLS == 10_000
    assert "at most 10,000 cells" in (ROOT / "README.md").read_text()
