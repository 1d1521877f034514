"""Collectors against a fake /proc and cgroup tree: the contract, host-cpu's and host-mem's
values, and processes or cgroups that vanish while a cell runs."""

import os
import re
import threading
import time

import pytest
from conftest import known

from vmtax.collectors.host_cpu import HostCpu
from vmtax.collectors.host_mem import HostMem
from vmtax.core import collector as collectors
from vmtax.core import plugin
from vmtax.core.collector import Collector, CollectorError, Subject, proc_stat
from vmtax.core.errors import VmtaxError
from vmtax.host.journal import Journal

TICKS = os.sysconf("SC_CLK_TCK")


def write(path, text):
    """Atomically, as the kernel's files read: host-mem's sampler may be reading it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def set_stat(proc, pid, utime=0, stime=0, start=1000, state="S", comm="qemu-system-x86"):
    # proc(5) fields 3..52; a command name with ") " in it, as a process may choose.
    fields = [state, "1"] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 6 + [str(start)]
    fields += ["0"] * (50 - len(fields))
    write(proc / str(pid) / "stat", f"{pid} ({comm}) {' '.join(fields)}\n")


def set_rollup(proc, pid, rss_kib, pss_kib):
    write(proc / str(pid) / "smaps_rollup",
          f"00400000-7ffd0000 ---p 00000000 00:00 0    [rollup]\nRss:  {rss_kib} kB\n"
          f"Pss:  {pss_kib} kB\nPss_Anon:  {pss_kib} kB\nShared_Clean:  0 kB\n")


def gone(proc, pid):
    for f in (proc / str(pid)).iterdir():
        f.unlink()
    (proc / str(pid)).rmdir()


@pytest.fixture
def proc(tmp_path, monkeypatch):
    root = tmp_path / "proc"
    root.mkdir()
    monkeypatch.setattr(Collector, "proc_root", root)
    return root


@pytest.fixture
def cgroups(tmp_path, monkeypatch):
    root = tmp_path / "cgroup"
    root.mkdir()
    monkeypatch.setattr(Collector, "cgroup_root", root)
    return root


@pytest.fixture
def make(tmp_path):
    journal = Journal(tmp_path / "journal")
    journal.dir.mkdir(exist_ok=True)

    def make(cls, **params):
        scratch = tmp_path / f"scratch-{cls.name}"
        scratch.mkdir(exist_ok=True)
        return cls(plugin.build(cls.Options, params, cls.name), journal=journal,
                   scratch=scratch)
    return make


def subject(pids=(), cgroup=None, vcpu_threads=()):
    return Subject(kind="vm", name="vm:tcg", pids=list(pids), cgroup=cgroup,
                   vcpu_threads=list(vcpu_threads))


def values(metrics):
    return {m.key: m.value for m in metrics}


# -- the contract and the registry ------------------------------------------------------------

@pytest.mark.plugin_lists
def test_the_registry_finds_the_collectors():
    found = plugin.plugins("collector")
    assert found["host-cpu"] is HostCpu and found["host-mem"] is HostMem
    assert collectors.registered() == found
    assert collectors.get("host-mem") is HostMem
    with pytest.raises(VmtaxError, match=re.escape(f"known collectors: {known('collector')}")):
        collectors.get("host-cpus")


@pytest.mark.parametrize("cls", [HostCpu, HostMem])
def test_manifests_and_descriptions(cls):
    assert cls.group == "collector" and cls.description and cls.packages == ()
    described = cls.describe()
    assert described["name"] == cls.name
    assert all(not s.higher_is_better and s.unit in ("s", "MiB") for s in cls.metrics)
    assert [m["name"] for m in described["metrics"]] == [s.name for s in cls.metrics]


def test_options_are_checked_like_any_plugin_s():
    with pytest.raises(VmtaxError, match="host-mem: interval: expected a number from 0.05"):
        plugin.build(HostMem.Options, {"interval": 0.001}, "host-mem")
    with pytest.raises(VmtaxError, match="no options"):
        plugin.build(HostCpu.Options, {"interval": 1.0}, "host-cpu")


def test_a_collector_must_define_every_hook(tmp_path):
    class Half(Collector):
        def start(self, subject):
            pass

    with pytest.raises(TypeError, match="abort"):
        Half(plugin.Options(), journal=Journal(tmp_path), scratch=tmp_path)


def test_metric_outside_the_manifest_is_an_error(make):
    with pytest.raises(CollectorError, match="not in its metric manifest"):
        make(HostCpu).metric("host cpu idle", 1.0)
    m = make(HostMem).metric("host rss", 3, part="vcpu")
    assert (m.unit, m.higher_is_better, m.key) == ("MiB", False, "host rss[part=vcpu]")


def test_proc_stat_reads_past_a_command_name_with_parentheses(proc):
    set_stat(proc, 7, utime=5, stime=6, start=99, comm="a) b (c")
    fields = proc_stat(7, proc)
    assert (fields[0], fields[11], fields[12], fields[19]) == ("S", "5", "6", "99")
    assert proc_stat(8, proc) is None


# -- host-cpu ---------------------------------------------------------------------------------

def test_host_cpu_sums_user_and_system_deltas_over_the_processes(proc, make):
    set_stat(proc, 10, utime=100, stime=50)
    set_stat(proc, 11, utime=200, stime=10, start=2000)
    c = make(HostCpu)
    c.start(subject([10, 11]))
    set_stat(proc, 10, utime=350, stime=80)
    set_stat(proc, 11, utime=260, stime=10, start=2000)
    got = values(c.stop())
    assert got["host cpu user"] == pytest.approx(310 / TICKS)
    assert got["host cpu system"] == pytest.approx(30 / TICKS)
    assert got["host cpu"] == pytest.approx(340 / TICKS)
    assert c.warnings == []


def test_host_cpu_counts_only_its_own_repetitions_not_the_pauses_between(proc, make):
    """A B B A: what the subject burns while the other target runs is not its figure."""
    set_stat(proc, 10, utime=100, stime=10)
    c = make(HostCpu)
    c.start(subject([10]))
    set_stat(proc, 10, utime=130, stime=12)     # its first repetition: 30 + 2 ticks
    c.pause()
    set_stat(proc, 10, utime=1130, stime=512)   # the other target's repetitions
    c.resume()
    set_stat(proc, 10, utime=1150, stime=513)   # its second repetition: 20 + 1 ticks
    c.pause()
    set_stat(proc, 10, utime=5000, stime=900)   # after its last one, before stop
    got = values(c.stop())
    assert got["host cpu user"] == pytest.approx(50 / TICKS)
    assert got["host cpu system"] == pytest.approx(3 / TICKS)


@pytest.mark.parametrize("ending", ["exited", "reused", "zombie"])
def test_host_cpu_counts_a_process_up_to_its_last_reading(proc, make, ending):
    set_stat(proc, 10, utime=100, stime=0)
    set_stat(proc, 11, utime=500, stime=5)
    c = make(HostCpu)
    c.start(subject([10, 11]))
    set_stat(proc, 10, utime=150, stime=0)
    if ending == "exited":
        gone(proc, 11)
    elif ending == "reused":        # another process got pid 11: none of its time counts
        set_stat(proc, 11, utime=9000, stime=900, start=5000)
    else:                            # exited, not reaped yet: its final times are readable
        set_stat(proc, 11, utime=520, stime=5, state="Z")
    got = values(c.stop())
    if ending == "zombie":
        assert got["host cpu user"] == pytest.approx(70 / TICKS) and c.warnings == []
    else:
        assert got["host cpu user"] == pytest.approx(50 / TICKS)
        assert c.warnings == ["host-cpu: process 11 exited before the end of the cell; its "
                              "CPU time after its last reading is not counted"]


def test_host_cpu_skips_a_process_gone_before_start_and_refuses_when_all_are(proc, make):
    set_stat(proc, 10, utime=1)
    set_stat(proc, 12, state="Z")
    c = make(HostCpu)
    c.start(subject([10, 11, 12]))
    assert [w.split(" of ")[0] for w in c.warnings] == ["host-cpu: process 11",
                                                         "host-cpu: process 12"]
    assert values(c.stop())["host cpu"] == 0
    gone(proc, 10)
    assert HostCpu.unavailable(subject([10, 11])) == \
        "none of vm:tcg's processes (10, 11) is running"
    with pytest.raises(CollectorError, match="none of vm:tcg's processes"):
        make(HostCpu).start(subject([10, 11]))


def test_host_cpu_needs_processes_or_a_cgroup(make):
    assert HostCpu.unavailable(subject()) == \
        "vm:tcg has no host process or cgroup that lasts the cell"


def set_cpuacct(group, usage, user, system):
    for name, ns in (("usage", usage), ("usage_user", user), ("usage_sys", system)):
        write(group / f"cpuacct.{name}", f"{ns}\n")


def test_host_cpu_reads_a_v1_cpuacct_cgroup_rather_than_the_processes(proc, cgroups, make):
    group = cgroups / "cpuacct" / "vmtax-0123"
    set_cpuacct(group, 4_000_000_000, 5_000_000_000, 1_000_000_000)
    set_stat(proc, 10, utime=100)
    c = make(HostCpu)
    c.start(subject([10], cgroup="/vmtax-0123"))
    # The exact runtime grew by 3 s; the tick samples say 3.5 s, 6:1 user to system.
    set_cpuacct(group, 7_000_000_000, 8_000_000_000, 1_500_000_000)
    set_stat(proc, 10, utime=101)   # a process that came and went did the rest
    got = values(c.stop())
    assert got == pytest.approx({"host cpu": 3.0, "host cpu user": 3.0 * 6 / 7,
                                 "host cpu system": 3.0 / 7})


def test_host_cpu_calls_runtime_between_ticks_user_time(cgroups, make):
    group = cgroups / "cpuacct" / "vmtax-0123"
    set_cpuacct(group, 10, 0, 0)
    c = make(HostCpu)
    c.start(subject(cgroup="/vmtax-0123"))
    set_cpuacct(group, 2_000_010, 0, 0)
    assert values(c.stop()) == pytest.approx({"host cpu": 0.002, "host cpu user": 0.002,
                                              "host cpu system": 0})


@pytest.mark.parametrize("where", ["", "unified"])
def test_host_cpu_reads_a_v2_cgroup_in_either_layout(cgroups, make, where):
    stat = cgroups / where / "vmtax-0123" / "cpu.stat"
    write(stat, "usage_usec 3000000\nuser_usec 2000000\nsystem_usec 1000000\n")
    c = make(HostCpu)
    c.start(subject(cgroup="/vmtax-0123"))
    write(stat, "usage_usec 4500000\nuser_usec 3000000\nsystem_usec 1500000\n"
                "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n")
    assert values(c.stop()) == pytest.approx({"host cpu": 1.5, "host cpu user": 1.0,
                                              "host cpu system": 0.5})


def test_host_cpu_names_the_counters_it_looked_for(cgroups, make):
    why = HostCpu.unavailable(subject([1], cgroup="/vmtax-gone"))
    assert why.startswith("no CPU accounting for cgroup /vmtax-gone: none of ")
    assert str(cgroups / "cpuacct/vmtax-gone/cpuacct.usage_user") in why
    assert str(cgroups / "unified/vmtax-gone/cpu.stat") in why


def test_host_cpu_says_so_when_the_cgroup_vanishes_before_stop(cgroups, make):
    set_cpuacct(cgroups / "cpuacct" / "vmtax-0123", 1, 1, 1)
    c = make(HostCpu)
    c.start(subject(cgroup="/vmtax-0123"))
    gone(cgroups / "cpuacct", "vmtax-0123")
    with pytest.raises(CollectorError, match="host-cpu: cannot read .*cpuacct.usage_user"):
        c.stop()


# -- host-mem ---------------------------------------------------------------------------------

def sampler_threads():
    return [t for t in threading.enumerate() if t.name == "vmtax host-mem"]


def test_host_mem_sums_rss_and_pss_and_samples_the_peak(proc, make):
    set_stat(proc, 10)
    set_rollup(proc, 10, rss_kib=200 * 1024, pss_kib=150 * 1024)
    set_stat(proc, 11, start=2000)
    set_rollup(proc, 11, rss_kib=100 * 1024, pss_kib=50 * 1024)
    c = make(HostMem, interval=0.05)
    c.start(subject([10, 11]))
    assert len(sampler_threads()) == 1
    set_rollup(proc, 10, rss_kib=900 * 1024, pss_kib=800 * 1024)
    time.sleep(0.5)   # ten intervals: the sampler sees it
    set_rollup(proc, 10, rss_kib=300 * 1024, pss_kib=250 * 1024)
    got = values(c.stop())
    assert sampler_threads() == []
    assert got == pytest.approx({"host rss": 400, "host pss": 300, "host pss peak": 850})
    assert c.warnings == []


def test_host_mem_counts_an_exited_process_in_the_peak_only(proc, make):
    set_stat(proc, 10)
    set_rollup(proc, 10, rss_kib=1024, pss_kib=1024)
    set_stat(proc, 11)
    set_rollup(proc, 11, rss_kib=4096, pss_kib=4096)
    set_stat(proc, 12, state="Z")    # exited before start: no memory to read
    c = make(HostMem, interval=0.05)
    c.start(subject([10, 11, 12]))
    gone(proc, 11)
    got = values(c.stop())
    assert got == pytest.approx({"host rss": 1, "host pss": 1, "host pss peak": 5})
    assert c.warnings == [
        "host-mem: process 12 of vm:tcg had exited before start; not counted",
        "host-mem: process 11 exited before the end of the cell; counted in the peak up to "
        "its last sample only"]


def test_host_mem_reports_only_the_peak_when_every_process_is_gone(proc, make):
    set_stat(proc, 10)
    set_rollup(proc, 10, rss_kib=2048, pss_kib=2048)
    c = make(HostMem)
    c.start(subject([10]))
    set_stat(proc, 10, start=7777)   # the pid now belongs to another process
    assert values(c.stop()) == {"host pss peak": 2.0}
    assert "process 10 exited" in c.warnings[0]


def test_host_mem_abort_stops_the_sampler_at_any_point(proc, make):
    make(HostMem).abort()            # before start: nothing to stop
    set_stat(proc, 10)
    set_rollup(proc, 10, rss_kib=1, pss_kib=1)
    c = make(HostMem, interval=10.0)
    c.start(subject([10]))
    started = time.monotonic()
    c.abort()
    c.abort()
    assert sampler_threads() == [] and time.monotonic() - started < 1


def test_host_mem_reports_a_failing_sampler(proc, make):
    set_stat(proc, 10)
    set_rollup(proc, 10, rss_kib=1, pss_kib=1)
    c = make(HostMem, interval=0.05)
    c.start(subject([10]))
    write(proc / "10" / "smaps_rollup", "Rss: many kB\nPss: 1 kB\n")
    time.sleep(0.3)
    with pytest.raises(CollectorError, match="host-mem: unexpected line in "
                       ".*/10/smaps_rollup: 'Rss: many kB'"):
        c.stop()
    assert sampler_threads() == []
    with pytest.raises(CollectorError, match="unexpected line"):
        make(HostMem).start(subject([10]))


def test_host_mem_unavailable(proc, make):
    assert HostMem.unavailable(subject()) == "vm:tcg has no host processes to observe"
    assert HostMem.unavailable(subject([10])) == "none of vm:tcg's processes (10) is running"
    set_stat(proc, 10)
    assert HostMem.unavailable(subject([9, 10])) == \
        f"needs {proc}/10/smaps_rollup (Linux 4.14 or later)"
    set_rollup(proc, 10, 1, 1)
    assert HostMem.unavailable(subject([9, 10])) is None
    with pytest.raises(CollectorError, match="host-mem: none of"):
        make(HostMem).start(subject([9]))
