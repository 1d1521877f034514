import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vmtax.core import plugin
from vmtax.core.errors import ParseError, VmtaxError
from vmtax.core.workload import check_manifest, get
from vmtax.workloads.cyclictest import Cyclictest

FIXTURES = Path(__file__).parent / "fixtures" / "cyclictest"

# Each fixture and the parameters it was made with (see the fixtures' README).
CASES: dict[str, dict[str, Any]] = {
    "t1.txt": {"loops": 20, "interval": 1000},
    "t1-container.txt": {"loops": 20, "interval": 1000},
    "t2.txt": {"threads": 2, "loops": 20, "interval": 1000},
    "t1-histogram.txt": {"loops": 20, "interval": 1000, "histogram": 40, "mlockall": True},
    "t2-histogram.txt": {"threads": 2, "loops": 30, "interval": 1000, "histogram": 40},
    "t1-histogram-overflow.txt": {"loops": 20, "interval": 1000, "histogram": 5},
}


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def parsed(name: str, **changes: Any) -> dict[str, float]:
    workload = Cyclictest.make({**CASES[name], **changes})
    return {m.key: m.value for m in workload.parse(fixture(name))}


# -- declarations and options --------------------------------------------------------------

def test_registered_with_a_complete_manifest():
    assert get("cyclictest") is Cyclictest
    check_manifest(Cyclictest)
    assert Cyclictest.primary_metric() == "latency avg"
    assert Cyclictest.time_option == "duration"
    assert "cyclictest" in Cyclictest.binaries and "rt-tests" in Cyclictest.packages


def test_defaults_run_e2():
    job = Cyclictest.make({}).run_job()
    assert job.argv == ["cyclictest", "-q", "-t1", "-p", "99", "-i", "10000", "-l", "1000"]
    assert job.capabilities == ("CAP_SYS_NICE",)
    assert job.timeout > 10
    assert Cyclictest.make({}).run_seconds() == 10.0


def test_every_option_reaches_the_argv():
    job = Cyclictest.make({"threads": 2, "priority": 80, "policy": "rr", "interval": 1000,
                           "loops": 50, "histogram": 100, "mlockall": True}).run_job()
    assert job.argv == ["cyclictest", "-q", "-t2", "-p", "80", "-i", "1000", "-l", "50",
                        "--policy=rr", "-h", "100", "-m"]
    assert job.capabilities == ("CAP_SYS_NICE", "CAP_IPC_LOCK")


@pytest.mark.parametrize("params, fragments", [
    ({"priority": 120}, ["priority: expected a whole number from 1 to 99", "120"]),
    ({"priority": 0}, ["priority: expected a whole number from 1 to 99", "0"]),
    ({"priorty": 50}, ["priorty", "did you mean", "priority"]),
    ({"threads": 0}, ["threads: expected a whole number from 1 to 1000000000"]),
    ({"policy": "other"}, ['policy: expected one of "fifo", "rr"']),
    ({"histogram": -1}, ["histogram: expected a whole number from 0 to 10000"]),
    ({"mlockall": "yes"}, ["mlockall: expected true or false"]),
])
def test_bad_options_are_named(params, fragments):
    with pytest.raises(VmtaxError, match="^cyclictest: ") as exc:
        Cyclictest.make(params)
    for fragment in fragments:
        assert fragment in str(exc.value)


def test_the_plans_time_sets_the_loop_count():
    assert Cyclictest.make({}, time=2).params["loops"] == 200
    assert Cyclictest.make({}, time=10).params["loops"] == 1000
    workload = Cyclictest.make({"interval": 3000}, time=1)
    assert workload.params["loops"] == 333 and workload.params["duration"] == 1
    assert workload.run_job().argv[-2:] == ["-l", "333"]


def test_explicit_loops_win_over_the_plans_time():
    workload = Cyclictest.make({"loops": 50}, time=10)
    assert workload.params["loops"] == 50 and "duration" not in workload.params


def test_duration_and_loops_must_agree():
    assert Cyclictest.make({"duration": 2, "loops": 200}).params["loops"] == 200
    with pytest.raises(VmtaxError, match="loops: expected 200 .*or no duration, got 5"):
        Cyclictest.make({"duration": 2, "loops": 5})


def test_stored_params_rebuild_the_same_run():
    for time in (None, 3):
        workload = Cyclictest.make({"interval": 2000, "threads": 2}, time=time)
        again = Cyclictest.make(workload.params, time=7)
        assert again.params == workload.params
        assert again.run_job().argv == workload.run_job().argv


def test_run_seconds_count_the_slowest_thread():
    # Thread 1 wakes every 10500 µs without a histogram, every 10000 µs with one.
    assert Cyclictest.make({"threads": 2}).run_seconds() == pytest.approx(10.5)
    assert Cyclictest.make({"threads": 2, "histogram": 50}).run_seconds() == 10.0


def test_options_carry_units_and_docs():
    infos = plugin.option_infos(Cyclictest.Options)
    assert infos["interval"].unit == "µs" and infos["duration"].unit == "s"
    assert infos["histogram"].unit == "µs"
    assert all(info.doc for info in infos.values())


# -- parsing the fixtures ------------------------------------------------------------------

def test_one_thread_has_dimensionless_keys():
    assert parsed("t1.txt") == {"latency min": 20, "latency avg": 26, "latency max": 31}


def test_a_container_without_cpu_dma_latency():
    assert parsed("t1-container.txt") == {"latency min": 19, "latency avg": 30,
                                          "latency max": 60}


def test_two_threads_are_told_apart():
    assert parsed("t2.txt") == {
        "latency min[thread=0]": 19, "latency avg[thread=0]": 29, "latency max[thread=0]": 53,
        "latency min[thread=1]": 17, "latency avg[thread=1]": 33, "latency max[thread=1]": 54}


def test_histogram_one_thread():
    values = parsed("t1-histogram.txt")
    assert {k: v for k, v in values.items() if not k.startswith("histogram[")} == {
        "latency min": 18, "latency avg": 27, "latency max": 39, "histogram overflows": 0}
    buckets = {k: v for k, v in values.items() if k.startswith("histogram[")}
    assert len(buckets) == 40 and sum(buckets.values()) == 20
    assert values["histogram[us=18]"] == 1 and values["histogram[us=0]"] == 0


def test_histogram_two_threads():
    values = parsed("t2-histogram.txt")
    assert values["latency max[thread=0]"] == 86 and values["latency max[thread=1]"] == 40
    assert values["histogram overflows[thread=0]"] == 5
    assert values["histogram overflows[thread=1]"] == 1
    for thread, total in ((0, 25), (1, 29)):
        assert sum(v for k, v in values.items()
                   if k.startswith("histogram[") and f"thread={thread}" in k) == total
    assert len(values) == 2 * (3 + 1 + 40)


def test_histogram_with_more_overflows_than_it_lists():
    values = parsed("t1-histogram-overflow.txt")
    assert values["histogram overflows"] == 20
    assert sum(v for k, v in values.items() if k.startswith("histogram[")) == 0


def test_metrics_follow_the_manifest():
    workload = Cyclictest.make(CASES["t2-histogram.txt"])
    for metric in workload.parse(fixture("t2-histogram.txt")):
        spec = Cyclictest.metric_spec(metric.name)
        assert metric.unit == spec.unit and not metric.higher_is_better
        assert set(metric.dimensions) <= set(spec.dimensions)


# -- what must not parse -------------------------------------------------------------------

@pytest.mark.parametrize("name, changes, message", [
    ("t1.txt", {"loops": 1000}, "counted 20 of 1000 wake-ups: the run was cut short"),
    ("t1.txt", {"loops": 10}, "more than the 10 asked for"),
    ("t1.txt", {"threads": 2}, "no summary line for thread 1"),
    ("t2.txt", {"threads": 1}, "unexpected or repeated summary of thread 1"),
    ("t1.txt", {"priority": 50}, "ran at priority 99, not 50"),
    ("t1.txt", {"interval": 2000, "loops": 20}, "woke every 1000 µs, not every 2000 µs"),
    ("t2-histogram.txt", {"loops": 40}, "counted 30 of 40 wake-ups"),
    ("t1-histogram.txt", {"histogram": 50}, "40 histogram buckets, expected 50"),
    ("t2-histogram.txt", {"threads": 1}, "values for 1 threads"),
    ("t1.txt", {"histogram": 40}, "unexpected line in cyclictest's histogram"),
    ("t1-histogram.txt", {"histogram": 0}, "unexpected line in cyclictest's summary"),
])
def test_output_that_does_not_fit_the_run(name, changes, message):
    with pytest.raises(ParseError, match=message):
        parsed(name, **changes)


@pytest.mark.parametrize("stdout, message", [
    ("", "ends mid-line"),
    ("# /dev/cpu_dma_latency set to 0us\n", "no summary line for thread 0"),
    ("T: 0 ( 6813) P:99 I:1000 C:     20 Min:     23 Act:", "ends mid-line"),
    ("T: 0 ( 6813) P:99 I:1000 C:     20 Min:     23 Act:\n", "unexpected line"),
    ("T: 0 ( 6813) P:99 I:1000 C:     20 Min:     23 Act:   36 Avg:   32 Max:      5\n",
     "not in order"),
    ("T: 0 ( 6813) P:99 I:1000 C:     20 Min:     23 Act:   36 Avg:   32 Max:      58\n" * 2,
     "repeated summary of thread 0"),
    ("Unable to change scheduling policy!\n", "unexpected line"),
    (f"T: 0 ( 6813) P:99 I:1000 C:     20 Min: {'9' * 5000} Act: 1 Avg: 1 Max: 1\n",
     "unexpected line"),
])
def test_garbled_summaries(stdout, message):
    with pytest.raises(ParseError, match=message):
        Cyclictest.make({"loops": 20, "interval": 1000}).parse(stdout)


def _histogram_edit(old: str, new: str) -> str:
    text = fixture("t1-histogram.txt")
    assert old in text
    return text.replace(old, new)


@pytest.mark.parametrize("stdout, message", [
    (_histogram_edit("# Max Latencies: 00039\n", ""), "no '# Max Latencies:' line"),
    (_histogram_edit("000018 000001\n", ""), "bucket 19 where 18 was due"),
    (_histogram_edit("000018 000001\n", "000018 000002\n"), "add up to 21"),
    (_histogram_edit("# Total:", "# Total: 000000020\n# Total:"), "two '# Total:' lines"),
    (_histogram_edit("# Min Latencies: 00018", "# Min Latencies: 00030"), "not in order"),
    (_histogram_edit("000018 000001", "000018 000001\t000000"), "one count per thread"),
    (_histogram_edit("000018 000001", "000018 0000x1"), "unexpected line"),
])
def test_garbled_histograms(stdout, message):
    with pytest.raises(ParseError, match=message):
        Cyclictest.make(CASES["t1-histogram.txt"]).parse(stdout)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_cut_of_a_fixture_fails_or_reads_the_same(name):
    # Output cut anywhere must never yield other numbers than the whole output.
    workload = Cyclictest.make(CASES[name])
    text = fixture(name)
    whole = workload.parse(text)
    for end in range(len(text)):
        try:
            assert workload.parse(text[:end]) == whole
        except ParseError:
            pass


@settings(deadline=None, max_examples=200, derandomize=True)
@given(st.text(alphabet=st.sampled_from("T:0123456789 ()PICMinActAvgMax#\t\nHistogramTotal"),
               max_size=300),
       st.sampled_from(sorted(CASES)))
def test_arbitrary_output_raises_only_parse_error(stdout, name):
    try:
        Cyclictest.make(CASES[name]).parse(stdout)
    except ParseError:
        pass


# -- the real thing ------------------------------------------------------------------------

@pytest.mark.live
@pytest.mark.parametrize("params", [
    {"loops": 50, "interval": 1000},
    {"threads": 2, "loops": 50, "interval": 1000, "histogram": 200, "mlockall": True},
])
def test_live_native_run(params):
    if shutil.which("cyclictest") is None:
        pytest.skip("cyclictest is not installed (apt-get install rt-tests)")
    if os.geteuid() != 0:
        pytest.skip("SCHED_FIFO priority 99 needs root")
    workload = Cyclictest.make(params)
    job = workload.run_job()
    done = subprocess.run(job.argv, capture_output=True, text=True, timeout=job.timeout)
    assert done.returncode == 0, done.stderr
    metrics = {m.key: m.value for m in workload.parse(done.stdout)}
    suffix = "[thread=1]" if params.get("threads") else ""
    assert 0 <= metrics["latency min" + suffix] <= metrics["latency max" + suffix]


def test_priority_none_runs_with_normal_scheduling_and_may_still_switch_to_fifo():
    # rt-tests exits at start unless it may use SCHED_FIFO, whatever -p says (runc without
    # CAP_SYS_NICE: "Unable to change scheduling policy!").
    w = Cyclictest.make({"priority": "none"})
    job = w.run_job()
    assert "-p" not in job.argv and job.capabilities == ("CAP_SYS_NICE",)
    line = "T: 0 (23210) P: 0 I:10000 C:   1000 Min:     75 Act:   83 Avg:  178 Max:     846\n"
    assert {m.name: m.value for m in w.parse(line)} == {
        "latency min": 75, "latency avg": 178, "latency max": 846}
    with pytest.raises(VmtaxError, match='policy: expected "fifo"'):
        Cyclictest.make({"priority": "none", "policy": "rr"})
