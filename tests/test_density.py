"""The density study's arithmetic and input: steps, settling, memory per instance, ratios,
the plan file (live: tests/test_density_live.py)."""

import dataclasses
import json

import pytest

from vmtax.cli import density as cli_density
from vmtax.core import plugin
from vmtax.core.errors import VmtaxError
from vmtax.studies import density
from vmtax.studies import density_results
from vmtax.studies.plan import TargetSpec


def settings(**values):
    return plugin.build(density.Settings, values, "density")


def test_singles_then_batches_up_to_max():
    assert settings(max=25, singles=3, batch=10).sizes() == [1, 1, 1, 10, 10, 2]
    assert settings(max=2).sizes() == [1, 1]
    assert settings(max=12).sizes() == [1] * 10 + [2]


def test_budget_as_share_or_size():
    assert settings(budget="50%").budget_bytes(8 << 30) == 4 << 30
    assert settings(budget="2G").budget_bytes(8 << 30) == 2 << 30


@pytest.mark.parametrize("key,value", [("budget", "75"), ("budget", "120%"), ("max", 0),
                                       ("ksm", [True, True])])
def test_bad_settings_are_one_line(key, value):
    with pytest.raises(VmtaxError, match=f"density: {key}: expected"):
        settings(**{key: value})


def meminfo(used_mib):
    return {"MemTotal": 8 << 20, "MemAvailable": (8 << 20) - used_mib * 1024}


def test_memory_settles_when_it_stops_moving():
    now = [0.0]
    readings = iter([100, 200, 300, 400, 410, 405, 408, 409, 407, 406, 408] + [408] * 50)

    def sleep(seconds):
        now[0] += 1.0

    settled, waited, info = density.settle(16, 3.0, 60, read=lambda: meminfo(next(readings)),
                                           clock=lambda: now[0], sleep=sleep)
    assert settled and 6 <= waited <= 8
    assert density.used_kib(info) >= 400 * 1024


def test_memory_that_keeps_moving_times_out():
    now = [0.0]
    used = iter(range(0, 10**6, 100))

    def sleep(seconds):
        now[0] += 1.0

    settled, waited, _ = density.settle(16, 3.0, 20, read=lambda: meminfo(next(used)),
                                        clock=lambda: now[0], sleep=sleep)
    assert not settled and waited >= 20


def step(n, added, used, kernel=(0, 0, 0), pss=0.0, answering=None):
    return density.Step(instances=n, added=added, start_seconds=1.0, used_delta=used,
                        kernel_delta=dict(zip(density.KERNEL_LINES, kernel)), pss=pss,
                        rss=pss * 2, answering=n if answering is None else answering,
                        settled=True, settle_seconds=1.0, available=1000.0)


def test_memory_per_instance_raw_adjusted_marginal():
    outcome = density.Outcome("vm", False, [step(1, 1, 200), step(10, 9, 2000),
                                            step(20, 10, 4100, (60, 30, 10), 3900)],
                              "max", 500.0)
    s = density_results.summarize(outcome)
    assert (s.instances, s.raw, s.adjusted, s.pss, s.marginal) == (20, 205, 200, 195, 210)
    assert s.all_answered


def test_a_negative_memory_per_instance_is_no_result_and_says_why(capsys):
    """Other processes freed memory while the instances started: the host's used memory
    fell, and raw −98.8 MiB per instance was printed as a result."""
    from vmtax.cli import density as density_cli
    outcome = density.Outcome("container", False, [step(5, 5, 100, pss=40),
                                                   step(10, 5, -988, pss=80)], "max", 0.0)
    s = density_results.summarize(outcome)
    assert (s.raw, s.adjusted, s.marginal, s.pss) == (None, None, None, 8)
    assert s.not_results.startswith("raw -98.8 and adjusted -98.8 and marginal -217.6 MiB "
                                    "per instance: no instance costs that")
    assert all(m.value > 0 for m in density_results.summary_metrics(s, None)
               if m.name != "instances")
    density_cli.print_summaries([s])
    out = capsys.readouterr().out
    assert "-98.8" not in out.split("not a result")[0] and "not a result: container" in out


def test_an_instance_not_answering_is_reported():
    outcome = density.Outcome("c", True, [step(1, 1, 5), step(2, 1, 10, answering=1)],
                              "budget", 0.0)
    assert not density_results.summarize(outcome).all_answered


def test_density_ratio_per_ksm_setting():
    def summary(target, with_ksm, adjusted):
        return density_results.Summary(target, with_ksm, 10, "max", adjusted, adjusted, None, None,
                               True)
    ratios = density_results.ratios([summary("container", False, 10), summary("vm", False, 200),
                             summary("container", True, 10), summary("vm", True, 100)])
    assert ratios == {("container", False): 1, ("vm", False): 20, ("container", True): 1,
                      ("vm", True): 10}


def test_no_step_no_numbers():
    s = density_results.summarize(density.Outcome("vm", False, [], "a start failed: boom", 0.0))
    assert s.instances == 0 and s.raw is None and not s.all_answered


def test_steps_round_trip_through_the_store_format():
    original = step(5, 4, 100.5, (1, 2, 3), 80.0)
    stored = density.Step(**__import__("json").loads(density_results.json_step(original)))
    assert stored == original
    keys = {m.key for m in density_results.step_metrics(original)}
    assert "used delta[instances=5]" in keys and "answering[instances=5]" in keys
    # The merge curve and the idle instances' CPU go with it, and come back as lists.
    measured = dataclasses.replace(original, ksm_curve=[[0.5, 10], [1.5, 900]],
                                   host_busy=42.0, instances_cpu=0.16)
    assert density.Step(**json.loads(density_results.json_step(measured))) == measured
    keys = {m.key for m in density_results.step_metrics(measured)}
    assert {"host cpu busy[instances=5]", "instances cpu[instances=5]"} <= keys
    # A step stored before they were measured still loads, without them.
    old = json.loads(density_results.json_step(original))
    for key in ("ksm_curve", "host_busy", "instances_cpu"):
        del old[key]
    assert density.Step(**old) == original


def test_the_site_is_written_by_the_instance_itself():
    job = density.serve_job()
    assert job.argv[:2] == ["/bin/sh", "-c"]
    script = job.argv[2]
    assert "listen 80;" in script and density.MARKER in script
    assert "exec nginx" in script and "daemon off;" in script


def write(tmp_path, text):
    path = tmp_path / "density.toml"
    path.write_text(text)
    return str(path)


TARGETS = '[targets.c]\nkind = "container"\nruntime = "runc"\n'


def test_plan_file_with_quick_form(tmp_path):
    values, specs = cli_density.load_plan(
        write(tmp_path, f"max = 50\nksm = [false, true]\n{TARGETS}[quick]\nmax = 4\n"),
        quick=True)
    assert values == {"max": 4, "ksm": [False, True]}
    assert specs == {"c": TargetSpec("c", "container", {"runtime": "runc"})}


@pytest.mark.parametrize("text,message", [
    ("max = 5\n", r"targets: expected \[targets.NAME\] tables"),
    (f"maxx = 5\n{TARGETS}", "expected a density option .* got 'maxx'"),
    (f"max = -1\n{TARGETS}", "max: expected"),
    ('[targets.c]\nkind = "nope"\n', "targets.c.kind: expected one of"),
    ('[targets.v]\nkind = "vm"\nvcpus = 0\n', "targets.v: vcpus: expected"),
    ("max = \n", "invalid TOML"),
    ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "nested more than 32 levels"),
    ('[targets."c\\u001b]0;x"]\nkind = "container"\n',
     r"targets: 'c\\x1b\]0;x' holds control characters"),
])
def test_plan_file_mistakes_are_one_line(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(VmtaxError, match=message) as info:
        cli_density.load_plan(path)
    assert "\n" not in str(info.value) and path in str(info.value)


def test_the_shipped_plan_loads():
    values, specs = cli_density.load_plan("plans/density.toml")
    assert set(specs) == {"container", "tcg"} and values["ksm"] == [False, True]
    quick, _ = cli_density.load_plan("plans/density.toml", quick=True)
    assert quick["max"] < values["max"]


class FakeInstance:
    guest_memory = None   # a container's: no guest RAM (vmtax.core.instance.Instance)

    def __init__(self, name):
        self.name, self.address, self.boot_seconds = name, f"10.0.0.{name}", 0.5
        self.client_preexec = None
        self.stopped = False

    def stop(self):
        self.stopped = True

    def host_pids(self):
        return []


class FakeTarget:
    """Instances that each take 100 MiB of host memory; the `fail_at`-th start fails."""
    name = "fake"

    def __init__(self, used, fail_at=None):
        self.used, self.fail_at, self.made = used, fail_at, []

    def make_instance(self, index, network, job=None):
        if index == self.fail_at:
            raise VmtaxError("boom")
        self.used[0] += 100
        self.made.append(FakeInstance(str(index)))
        return self.made[-1]


@pytest.fixture
def host(monkeypatch):
    used = [1000]      # MiB
    info = lambda: {"MemTotal": 4096 * 1024, "MemAvailable": (4096 - used[0]) * 1024,  # noqa: E731
                    "Slab": 0, "PageTables": 0, "KernelStack": 0}
    monkeypatch.setattr(density.hugepages, "meminfo", info)
    monkeypatch.setattr(density, "settle", lambda *a, **k: (True, 0.0, info()))
    monkeypatch.setattr(density, "probe_http",
                        lambda instances, timeout: {i.address: 1.0 for i in instances})
    monkeypatch.setattr(density.ksm, "counters", lambda: {})
    return used


def test_the_budget_stops_before_a_step_would_exceed_it(host):
    target = FakeTarget(host)
    outcome = density.study(target, "net", settings(max=50, singles=2, batch=3,
                                                   budget="1G"), False, None)
    # 100 MiB each: 1, 2, 5, 8 instances fit in 1 GiB, the next step of 3 would not.
    assert [s.instances for s in outcome.steps] == [1, 2, 5, 8]
    assert outcome.stopped == "budget"
    assert all(i.stopped for i in target.made)
    assert density_results.summarize(outcome).raw == 100


def test_one_noisy_single_start_does_not_end_it_early(host):
    """Another process takes 400 MiB while the first instance starts: the budget is then
    judged by what the instances hold on average, not by that one start (which would
    have ended it at 7 instances)."""
    target = FakeTarget(host)
    original = target.make_instance

    def make_instance(index, *args, **kwargs):
        host[0] += 400 if index == 0 else 0
        return original(index, *args, **kwargs)
    target.make_instance = make_instance
    outcome = density.study(target, "net", settings(max=50, singles=1, batch=2,
                                                   budget="2G"), False, None)
    # 15 instances hold 1900 MiB, 127 each: two more would pass 2 GiB.
    assert [s.instances for s in outcome.steps] == [1, *range(3, 16, 2)]
    assert outcome.stopped == "budget"


def test_a_noisy_first_step_is_judged_by_the_rss_of_one(host, monkeypatch):
    """900 MiB taken by another process as the first instance starts; each instance holds
    150 MiB RSS: the next step is estimated at 150 each, not 1000."""
    target = FakeTarget(host)
    original = target.make_instance
    monkeypatch.setattr(density, "memory_of", lambda pids: (150 * 1024 * len(target.made),
                                                            100 * 1024 * len(target.made)))

    def make_instance(index, *args, **kwargs):
        host[0] += 900 if index == 0 else 0
        return original(index, *args, **kwargs)
    target.make_instance = make_instance
    outcome = density.study(target, "net", settings(max=50, singles=1, batch=5,
                                                   budget="2G"), False, None)
    # 1: 1000 MiB used (+750 for 5 more fits in 2 GiB); 6: 1500 (+750 would not).
    assert [s.instances for s in outcome.steps] == [1, 6] and outcome.stopped == "budget"


def test_the_hosts_available_memory_stops_it(host):
    host[0] = 2900     # 1196 MiB available: less than a step and the host's reserve
    outcome = density.study(FakeTarget(host), "net", settings(max=50, singles=1, batch=5),
                            False, None)
    assert [s.instances for s in outcome.steps] == [1] and outcome.stopped == "memory"


def test_a_step_needs_room_for_its_instances_before_ksm_merges_them(host, monkeypatch):
    """Settled, each instance adds 100 MiB (KSM merged the rest), but holds 1500 MiB RSS
    as it starts: a step of 5 would leave the host less than its reserve meanwhile."""
    monkeypatch.setattr(density, "memory_of",
                        lambda pids: (1500 * 1024 * len(host_instances), 100 * 1024))
    host_instances: list = []
    target = FakeTarget(host)
    original = target.make_instance

    def make_instance(*args, **kwargs):
        host_instances.append(original(*args, **kwargs))
        return host_instances[-1]
    target.make_instance = make_instance
    outcome = density.study(target, "net", settings(max=50, singles=2, batch=5), False, None)
    assert [s.instances for s in outcome.steps] == [1, 2] and outcome.stopped == "memory"
    assert all(i.stopped for i in target.made)


def test_a_failed_start_ends_it_with_what_started_measured(host):
    target = FakeTarget(host, fail_at=3)
    outcome = density.study(target, "net", settings(max=20, singles=2, batch=4), False, None)
    assert [s.instances for s in outcome.steps] == [1, 2, 5]
    assert outcome.stopped == "a start failed: boom"
    assert all(i.stopped for i in target.made)


def test_figures_from_a_stored_density_and_boot_run():
    from vmtax.core.types import Metric
    from vmtax.report import plots
    from vmtax.results.store import Rep, Run

    def rep(i, target, workload, phase, metrics, params=None):
        return Rep(id=i, run_id="r", target=target, workload=workload, params=params or {},
                   phase=phase, idx=i, status="ok", error=None, exit_code=None,
                   host_elapsed=None, guest_elapsed=None, started=0.0, argv=[],
                   metrics=metrics)
    reps = [rep(i, t, "density", "step", density_results.step_metrics(step(n, 1, n * 10.0, pss=n)),
                density_results.params(k))
            for i, (t, k, n) in enumerate([("c", False, 1), ("c", False, 2), ("v", True, 1)])]
    reps += [rep(10 + i, "v", "boot", "measure", [Metric("ready", 1.0 + i, "s", False),
                                                   Metric("first http", 2.0 + i, "s", False)])
             for i in range(3)]
    run = Run(id="r", created=0.0, finished=None, status="done", plan={}, host={},
              version="0", targets={}, reps=reps)
    # The figures' contract: what the studies stored, read back as typed records.
    from vmtax.analysis.model import study_records
    from vmtax.results import study_records as records
    assert records.density_points(run, records.USED_DELTA) == [
        records.DensityPoint("c", "off", 1.0, 10.0), records.DensityPoint("c", "off", 2.0, 20.0),
        records.DensityPoint("v", "on", 1.0, 10.0)]
    assert [p.value for p in records.density_points(run, records.PSS_TOTAL)] == [1.0, 2.0, 1.0]
    assert records.boot_starts(run)[:2] == [records.BootStart("v", "ready", 1.0),
                                            records.BootStart("v", "first http", 2.0)]
    charts = plots.run_charts(run, {"c": "container"}, study_records(run))
    assert [c.slug for c in charts] == ["density-memory-used", "density-memory-per-instance",
                                        "boot-ecdf"]
    assert all(plots.render(c, "png").startswith(b"\x89PNG") for c in charts)
    empty = Run(id="r", created=0.0, finished=None, status="done", plan={}, host={},
                version="0", targets={}, reps=[])
    assert plots.run_charts(empty, {}, study_records(empty)) == []


def test_cpu_ticks_count_a_process_own_cpu_time():
    import os
    import time

    from vmtax.host import proc
    before = proc.cpu_ticks(os.getpid())
    start = time.process_time()
    while time.process_time() - start < 0.3:   # CPU time, however busy the host is
        pass
    # 0.3 s of CPU at USER_HZ (100 here): about 30 ticks; never fewer than half of that.
    assert proc.cpu_ticks(os.getpid()) - before >= 0.15 * os.sysconf("SC_CLK_TCK")
    assert proc.cpu_ticks(2 ** 22 + 1) == 0    # above pid_max: no such process


def test_a_plan_of_workloads_holds_its_density_study(tmp_path):
    """plans/microvms.toml: the serving plan's targets, its [density] table: those that
    start instances are filled (native serves the workloads only)."""
    path = write(tmp_path, '[targets.native]\n[targets.c]\nkind = "container"\n'
                           '[[workloads]]\nname = "cpu"\n'
                           '[density]\nmax = 8\n[density.quick]\nmax = 2\n')
    values, specs = cli_density.load_plan(path)
    assert values == {"max": 8} and set(specs) == {"c"}
    assert cli_density.load_plan(path, quick=True)[0] == {"max": 2}
    with pytest.raises(VmtaxError, match=r"without a \[density\] table: run it with"):
        cli_density.load_plan(write(tmp_path, '[targets.native]\n[[workloads]]\nname = "cpu"\n'))


def test_the_microvm_study_loads_for_each_of_its_commands(vmms_built):
    from vmtax.cli import boot
    values, specs = cli_density.load_plan("plans/microvms.toml")
    assert set(specs) == {"runc", "lxd", "qemu-microvm", "firecracker", "cloud-hypervisor"}
    assert values["ksm"] == [False, True]
    boot_specs, settings = boot.plan_settings("plans/microvms.toml")
    assert boot_specs == specs and settings == {"count": 10, "warmup": 1}


def test_a_plans_boot_table_is_checked(tmp_path):
    from vmtax.cli import boot
    plan = '[targets.c]\nkind = "container"\n[[workloads]]\nname = "cpu"\n[boot]\n'
    for table, message in (("cont = 3\n", r"boot.cont: expected one of count, warmup, "
                                         "http_timeout, got 'cont'"),
                           ("count = 0\n", "boot.count: ")):
        with pytest.raises(VmtaxError, match=message) as err:
            boot.plan_settings(write(tmp_path, plan + table))
        assert "\n" not in str(err.value)


def test_a_guests_pss_is_split_into_its_ram_and_its_vmms_own(tmp_path, monkeypatch):
    """E4 with microVMs: how much of a guest's PSS is the VMM beyond the RAM it gives."""
    from vmtax.host import proc
    from vmtax.studies import density_results
    smaps = tmp_path / "smaps"
    smaps.write_text(
        "7f0000000000-7f0010000000 rw-p 00000000 00:00 0 \nSize:             262144 kB\n"
        "Rss:              100000 kB\nPss:               90000 kB\n"
        "55d000000000-55d000400000 r-xp 00000000 08:01 42 /usr/bin/firecracker\n"
        "Size:               4096 kB\nPss:                2048 kB\n")
    assert proc.large_mappings_pss(smaps, 131072) == 90000

    class Guest(FakeInstance):
        guest_memory = 256 << 20

        def host_pids(self):
            return [4242]
    real = proc.large_mappings_pss
    monkeypatch.setattr(proc, "large_mappings_pss",
                        lambda path, at_least: real(smaps, at_least)
                        if str(path) == "/proc/4242/smaps" else None)
    assert density.guest_ram_pss([Guest("1"), Guest("2")]) == 180000
    assert density.guest_ram_pss([FakeInstance("3")]) is None   # a container: no guest
    step = density.Step(instances=2, added=2, start_seconds=1, used_delta=200,
                        kernel_delta={}, pss=190.0, rss=200, answering=2, settled=True,
                        settle_seconds=1, available=1000, guest_ram=175.8)
    summary = density_results.summarize(density.Outcome("firecracker", False, [step], "max",
                                                        0.0))
    assert summary.guest_ram == 87.9
    assert density_results.vmm_line(summary) == (
        "firecracker (KSM off): PSS 95.0 MiB per instance = guest RAM 87.9 MiB + the VMM's "
        "own process 7.1 MiB (its code, heap and devices)")
    metrics = {m.name: m.value for m in density_results.summary_metrics(summary, None)}
    assert metrics["vmm pss per instance beyond guest ram"] == 7.1
