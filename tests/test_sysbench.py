import re
import shutil
import subprocess
from pathlib import Path

import pytest

from vmtax.core import workload as workloads
from vmtax.core.errors import ParseError, VmtaxError
from vmtax.helpers.sysbench_report import hugetlb_pages
from vmtax.studies import planfile
from vmtax.workloads.sysbench import Cpu, Fileio, Memory, Mutex, Threads, _bytes

FIXTURES = Path(__file__).parent / "fixtures" / "sysbench"

UNITS = {  # metric -> (unit, higher_is_better)
    "events/s": ("events/s", True), "total events": ("events", True), "total time": ("s", False),
    "latency min": ("ms", False), "latency avg": ("ms", False), "latency max": ("ms", False),
    "latency p95": ("ms", False), "fairness events stddev": ("events", False),
    "fairness time stddev": ("s", False), "MiB/s": ("MiB/s", True), "ops/s": ("ops/s", True),
    "reads/s": ("reads/s", True), "writes/s": ("writes/s", True), "fsyncs/s": ("fsyncs/s", True),
    "read MiB/s": ("MiB/s", True), "written MiB/s": ("MiB/s", True),
    "prepare MiB/s": ("MiB/s", True),
}


def report(events, time, lat, fair):
    """The metrics every sysbench report carries: lat = (min, avg, max, p95 or None)."""
    out = {"total events": events, "total time": time,
           "latency min": lat[0], "latency avg": lat[1], "latency max": lat[2],
           "fairness events stddev": fair[0], "fairness time stddev": fair[1]}
    if lat[3] is not None:
        out["latency p95"] = lat[3]
    return out


# Read off each fixture by hand.
EXPECTED = {
    ("1.0.20", "cpu"): {"events/s": 48449.65,
                        **report(48510, 1.0002, (0.02, 0.02, 0.13, 0.02), (0.0, 0.0))},
    ("1.0.20", "threads"): {"events/s": 2979 / 1.0996,
                            **report(2979, 1.0996, (0.07, 176.86, 539.42, 331.91), (1.26, 0.03))},
    ("1.0.20", "memory"): {"MiB/s": 21252.31, "ops/s": 2720295.31,
                           **report(131072, 0.0473, (0.0, 0.0, 0.06, 0.0), (0.0, 0.0))},
    ("1.0.20", "fileio"): {"reads/s": 34114.18, "writes/s": 22742.79, "fsyncs/s": 75174.21,
                           "read MiB/s": 533.03, "written MiB/s": 355.36,
                           **report(133751, 1.0314, (0.0, 0.15, 1.42, 0.42), (314.28, 0.0))},
    ("1.0.20", "mutex"): report(4, 0.0265, (21.04, 24.75, 26.48, 26.68), (0.0, 0.0)),
    ("1.0.18", "cpu"): {"events/s": 35512.07,
                        **report(35516, 1.0001, (0.03, 0.03, 0.61, 0.03), (0.0, 0.0))},
    ("1.0.18", "threads"): {"events/s": 4410 / 1.0238,
                            **report(4410, 1.0238, (0.05, 115.20, 611.09, 404.61), (2.41, 0.01))},
    ("1.0.18", "memory"): {"MiB/s": 15010.99, "ops/s": 1921406.18,
                           **report(131072, 0.0682, (0.0, 0.0, 0.11, 0.0), (0.0, 0.0))},
    ("1.0.18", "fileio"): {"reads/s": 9630.45, "writes/s": 6420.30, "fsyncs/s": 20546.88,
                           "read MiB/s": 150.48, "written MiB/s": 100.32,
                           **report(37340, 1.0207, (0.0, 0.53, 41.26, 2.30), (98.66, 0.0))},
    ("1.0.18", "mutex"): report(4, 0.0631, (40.77, 52.13, 62.87, 63.32), (0.0, 0.01)),
    ("1.0.11", "cpu"): {"events/s": 21873.40,
                        **report(21876, 1.0001, (0.04, 0.05, 1.87, 0.05), (0.0, 0.0))},
    ("1.0.11", "threads"): {"events/s": 1874 / 1.0412,
                            **report(1874, 1.0412, (0.06, 268.31, 1432.77, 787.42), (1.92, 0.02))},
    ("1.0.11", "memory"): {"MiB/s": 8190.33, "ops/s": 1048361.77,
                           **report(131072, 0.1250, (0.0, 0.0, 0.92, 0.0), (0.0, 0.0))},
    ("1.0.11", "fileio"): {"reads/s": 1521.36, "writes/s": 1014.24, "fsyncs/s": 3289.77,
                           "read MiB/s": 23.77, "written MiB/s": 15.85,
                           **report(5838, 1.0573, (0.0, 3.41, 96.18, 14.21), (12.37, 0.01))},
    ("1.0.11", "mutex"): report(4, 0.0842, (55.13, 68.40, 84.02, 84.47), (0.0, 0.01)),
}
PREPARE = {"1.0.20": 480.88, "1.0.18": 420.53, "1.0.11": 147.13}


def fixture(version: str, name: str) -> str:
    return (FIXTURES / version / f"{name}.txt").read_text()


def as_dict(metrics) -> dict[str, float]:
    names = [m.name for m in metrics]
    assert len(names) == len(set(names)), names
    for m in metrics:
        assert (m.unit, m.higher_is_better) == UNITS[m.name], m
    return {m.name: m.value for m in metrics}


# -- parsing every fixture ----------------------------------------------------------------

@pytest.mark.parametrize("version, name", sorted(EXPECTED))
def test_fixture_parses_into_the_expected_metrics(version, name):
    got = as_dict(workloads.get(name).make({}).parse(fixture(version, name)))
    assert got == pytest.approx(EXPECTED[version, name], rel=1e-12, abs=0)


@pytest.mark.parametrize("version", sorted(PREPARE))
def test_fileio_prepare_reports_its_write_speed(version):
    metrics = Fileio.make({}).parse_prepare(fixture(version, "fileio-prepare"))
    assert as_dict(metrics) == {"prepare MiB/s": PREPARE[version]}


def test_disabled_percentile_gives_no_percentile_metric():
    got = as_dict(Cpu.make({"percentile": 0}).parse(fixture("1.0.20", "cpu-percentile0")))
    assert got == {"events/s": 49227.97,
                   **report(49288, 1.0001, (0.02, 0.02, 0.09, None), (0.0, 0.0))}


def test_only_the_declared_percentile_is_taken():
    # The manifest declares "latency p95": the option takes 95 or 0 (off), and a report
    # with another percentile is not silently stored under a metric nobody declared.
    with pytest.raises(VmtaxError, match="percentile: expected one of 0, 95"):
        Cpu.make({"percentile": 99})
    text = fixture("1.0.20", "cpu").replace("95th percentile:", "99th percentile:")
    with pytest.raises(ParseError, match="'latency p99' is not in its metric manifest"):
        Cpu.make({}).parse(text)


def test_pre_1_0_spellings_carry_the_same_numbers():
    """0.4.12's memory report: MB meaning MiB, ms-suffixed latencies, 'approx. 95 percentile'."""
    text = """\
sysbench 0.4.12:  multi-threaded system evaluation benchmark

Operations performed: 131072 (412345.67 ops/sec)

1024.00 MB transferred (3221.45 MB/sec)

Test execution summary:
    total time:                          0.3179s
    total number of events:              131072
    total time taken by event execution: 0.2011
    per-request statistics:
         min:                                  0.00ms
         avg:                                  0.00ms
         max:                                  1.35ms
         approx.  95 percentile:               0.01ms

Threads fairness:
    events (avg/stddev):           131072.0000/0.00
    execution time (avg/stddev):   0.2011/0.00
"""
    assert as_dict(Memory.make({}).parse(text)) == {
        "MiB/s": 3221.45, "ops/s": 412345.67,
        **report(131072, 0.3179, (0.0, 0.0, 1.35, 0.01), (0.0, 0.0))}


def test_space_before_units_is_accepted():
    text = (fixture("1.0.20", "mutex").replace("0.0265s", "0.0265 s")
            .replace("21.04\n", "21.04 ms\n"))
    got = as_dict(Mutex.make({}).parse(text))
    assert got["total time"] == 0.0265 and got["latency min"] == 21.04


def test_memory_without_data_movement_has_no_bandwidth():
    text = "\n".join(line for line in fixture("1.0.20", "memory").splitlines()
                     if "transferred" not in line)
    got = as_dict(Memory.make({"memory-oper": "none"}).parse(text))
    assert "MiB/s" not in got and got["ops/s"] == 2720295.31


def test_fileio_read_only_mode_may_write_nothing():
    text = re.sub(r"((?:writes/s|fsyncs/s|written, MiB/s):\s+)\S+", r"\g<1>0.00",
                  fixture("1.0.20", "fileio"))
    got = as_dict(Fileio.make({"file-test-mode": "rndrd"}).parse(text))
    assert (got["reads/s"], got["writes/s"], got["written MiB/s"]) == (34114.18, 0.0, 0.0)
    with pytest.raises(ParseError, match="writes/s is 0 in rndrw mode"):
        Fileio.make({}).parse(text)


# -- what must not parse ------------------------------------------------------------------

def _drop(text: str, needle: str) -> str:
    return "\n".join(line for line in text.splitlines() if needle not in line)


CPU = fixture("1.0.20", "cpu")
MEMORY = fixture("1.0.20", "memory")
FILEIO = fixture("1.0.20", "fileio")
THREADS = fixture("1.0.20", "threads")


@pytest.mark.parametrize("workload, text, message", [
    (Cpu.make({}), "", "no total time line"),
    (Cpu.make({}), "FATAL: invalid option: --cpu-max-primes=2000\n", "no total time line"),
    (Cpu.make({}), CPU[:CPU.index("Latency")], "no latency header line"),
    (Cpu.make({}), CPU[:CPU.index("Threads fairness")], r"no events \(avg/stddev\) line"),
    (Cpu.make({}), _drop(CPU, "events per second"), "no events per second line"),
    (Cpu.make({}), _drop(CPU, "max:"), "latency block lacks max"),
    (Cpu.make({}), CPU.replace("48449.65", "12abc"), "events per second: '12abc' is not a number"),
    (Cpu.make({}), CPU.replace("48449.65", "inf"), "events per second: 'inf' is not a number"),
    (Cpu.make({}), CPU.replace("48449.65", "0.00"), "events/s is 0"),
    (Cpu.make({}), CPU.replace("1.0002s", "1.0002x"), "total time: '1.0002x' is not a number"),
    (Cpu.make({}), CPU.replace("0.13", "n/a"), "latency max: 'n/a' is not a number"),
    (Cpu.make({}), CPU.replace("48510\n", "48510.5\n"), "'48510.5' is not a whole number"),
    (Cpu.make({}), CPU.replace("0.9950/0.00", "0.9950/"), r"no execution time \(avg/stddev\) line"),
    (Cpu.make({}), CPU.replace("sum:", "total:"), "unexpected line in the latency block"),
    (Cpu.make({}), CPU + CPU, "2 total time lines: more than one report"),
    (Threads.make({}), THREADS.replace("2979\n", "0\n"), "ran no events"),
    (Threads.make({}), THREADS.replace("1.0996s", "0.0000s"), "total time is 0 s"),
    (Memory.make({}), MEMORY.replace("131072 (2720295.31", "0 (    0.00")
     .replace("1024.00 MiB transferred (21252.31", "0.00 MiB transferred (0.00")
     .replace("131072\n", "0\n"), "ran no events"),
    (Memory.make({}), MEMORY.replace("2720295.31", "0.00"), "ops/s is 0"),
    (Memory.make({}), _drop(MEMORY, "transferred"), "no MiB transferred line"),
    (Memory.make({}), MEMORY.replace("MiB/sec", "GiB/sec"), "no MiB transferred line"),
    (Memory.make({}), _drop(MEMORY, "Total operations"), "no total operations line"),
    (Fileio.make({}), _drop(FILEIO, "fsyncs/s"), "no fsyncs/s line"),
    (Fileio.make({}), FILEIO.replace("34114.18", "0.00"), "reads/s is 0 in rndrw mode"),
    (Fileio.make({"file-test-mode": "seqwr"}), FILEIO.replace("22742.79", "0.00"),
     "writes/s is 0 in seqwr mode"),
    (Mutex.make({}), "Segmentation fault\n", "no total time line"),
])
def test_bad_output_raises_parse_error(workload, text, message):
    with pytest.raises(ParseError, match=message):
        workload.parse(text)


@pytest.mark.parametrize("text, message", [
    ("", "no bytes written line"),
    ("128 files, 16384Kb each, 2048Mb total\nCreating files for the test...\n"
     "Reusing existing file test_file.0\nNo bytes written.\n", "test files already existed"),
    (fixture("1.0.20", "fileio-prepare").replace("480.88", "inf"),
     "prepare MiB/sec: 'inf' is not a number"),
    (fixture("1.0.20", "fileio-prepare").replace("480.88", "0.00"), "prepare MiB/s is 0"),
])
def test_bad_prepare_output_raises_parse_error(text, message):
    with pytest.raises(ParseError, match=message):
        Fileio.make({}).parse_prepare(text)


def test_parse_errors_are_one_line():
    for text in ("", CPU.replace("sum:", "total:"), CPU.replace("48449.65", "4e4"),
                 CPU + CPU):
        with pytest.raises(ParseError) as err:
            Cpu.make({}).parse(text)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("block,pages", [
    (16 << 10, 3), (1 << 20, 3), (3 << 20, 4), (6 << 20, 3), (16 << 20, 8), (64 << 20, 32),
    (256 << 20, 128), (1 << 30, 512)])
def test_hugetlb_pages_follow_its_4_mib_rounding(block, pages):
    assert hugetlb_pages(block) == pages


def test_hugetlb_pages_per_thread_buffer():
    assert hugetlb_pages(16 << 20, buffers=4) == 32


# -- commands -----------------------------------------------------------------------------

def test_registry_holds_the_five_workloads():
    assert {n: c for n, c in workloads.registered().items()
            if c.__module__.endswith("sysbench")} == {
        "cpu": Cpu, "threads": Threads, "memory": Memory, "fileio": Fileio, "mutex": Mutex}
    for cls in (Cpu, Threads, Memory, Fileio, Mutex):
        assert cls.binaries == ("sysbench",) and cls.description


def test_defaults_are_e1():
    assert Cpu.make({}).params == {"cpu-max-prime": 2000}
    assert Threads.make({}).params == {"threads": 500, "thread-yields": 100, "thread-locks": 4}
    # E1 moved a fixed 1G; the default is time-bounded (see the memory test below).
    assert Memory.make({}).params == {"memory-block-size": "8k", "memory-total-size": "1T"}
    assert Fileio.make({}).params == {"file-total-size": "2G", "file-test-mode": "rndrw",
                                      "prepare-threads": 16, "threads": 20}
    assert Mutex.make({}).params == {"threads": 4, "mutex-num": 2000, "mutex-locks": 10000,
                                     "mutex-loops": 5000}
    assert [c.time_option for c in (Cpu, Threads, Memory, Fileio, Mutex)] == [
        "time", "time", "time", "time", None]


def test_every_metric_parsed_is_in_the_manifest_with_its_unit():
    for version, name in EXPECTED:
        cls = workloads.get(name)
        for m in cls.make({}).parse(fixture(version, name)):
            spec = cls.metric_spec(m.name)
            assert (spec.unit, spec.higher_is_better) == UNITS[m.name]


@pytest.mark.parametrize("workload, argv", [
    (Cpu.make({}), "sysbench cpu --cpu-max-prime=2000 run"),
    (Threads.make({}), "sysbench threads --thread-locks=4 --thread-yields=100 --threads=500 run"),
    (Memory.make({}), "sysbench memory --memory-block-size=8k --memory-total-size=1T run"),
    (Fileio.make({}),
     "sysbench fileio --file-test-mode=rndrw --file-total-size=2G --threads=20 run"),
    (Mutex.make({}), "sysbench mutex --mutex-locks=10000 --mutex-loops=5000 --mutex-num=2000 "
              "--threads=4 run"),
])
def test_default_commands(workload, argv):
    job = workload.run_job()
    assert job.argv == argv.split()
    assert job.timeout == (600 if workload.name == "mutex" else 10 * 3 + 60)
    assert job.in_scratch == (workload.name == "fileio")


@pytest.mark.parametrize("workload, argv, timeout", [
    (Cpu.make({"cpu-max-prime": 20000, "threads": 2, "time": 5}),
     "sysbench cpu --cpu-max-prime=20000 --threads=2 --time=5 run", 75),
    (Threads.make({"time": 2, "thread-locks": 8}),
     "sysbench threads --thread-locks=8 --thread-yields=100 --threads=500 --time=2 run", 66),
    (Memory.make({"memory-access-mode": "rnd", "memory-hugetlb": True, "threads": 4, "time": 30}),
     "sysbench memory --memory-access-mode=rnd --memory-block-size=8k --memory-hugetlb=on "
     "--memory-total-size=1T --threads=4 --time=30 run", 150),
    (Fileio.make({"file-rw-ratio": 1.5, "file-num": 64, "time": 1}),
     "sysbench fileio --file-num=64 --file-rw-ratio=1.5 --file-test-mode=rndrw "
     "--file-total-size=2G --threads=20 --time=1 run", 63),
    (Mutex.make({"mutex-locks": 500, "threads": 8}),
     "sysbench mutex --mutex-locks=500 --mutex-loops=5000 --mutex-num=2000 --threads=8 run", 600),
])
def test_overridden_commands(workload, argv, timeout):
    job = workload.run_job()
    assert job.argv == argv.split() and job.timeout == timeout


def test_option_order_does_not_depend_on_how_params_were_given():
    a = Memory.make({"threads": 2, "memory-oper": "read", "time": 3})
    b = Memory.make({"time": 3, "memory-oper": "read", "threads": 2})
    assert a.run_job().argv == b.run_job().argv


def test_fileio_phases_share_the_file_options_and_run_in_scratch():
    w = Fileio.make({"file-num": 32, "file-block-size": 4096, "time": 4, "threads": 8,
                "prepare-threads": 2, "file-total-size": "512M"})
    (prepare,), run, (cleanup,) = w.prepare_jobs(), w.run_job(), w.cleanup_jobs()
    files = ["--file-block-size=4096", "--file-num=32", "--file-test-mode=rndrw",
             "--file-total-size=512M"]
    assert prepare.argv == ["sysbench", "fileio", *files, "--threads=2", "prepare"]
    assert run.argv == ["sysbench", "fileio", *files, "--threads=8", "--time=4", "run"]
    assert cleanup.argv == ["sysbench", "fileio", *files, "--threads=2", "cleanup"]
    assert prepare.in_scratch and run.in_scratch and cleanup.in_scratch
    assert (prepare.timeout, run.timeout, cleanup.timeout) == (512 + 60, 4 * 3 + 60, 120)


def test_e1_fileio_prepare_uses_16_threads():
    (prepare,) = Fileio.make({}).prepare_jobs()
    assert prepare.argv == ("sysbench fileio --file-test-mode=rndrw --file-total-size=2G "
                            "--threads=16 prepare").split()
    assert prepare.timeout == 2048 + 60
    assert Fileio.make({}).cleanup_jobs()[0].argv[-1] == "cleanup"


def test_other_workloads_have_no_prepare_or_cleanup():
    for cls in (Cpu, Threads, Memory, Mutex):
        assert cls.make({}).prepare_jobs() == [] and cls.make({}).cleanup_jobs() == []


@pytest.mark.parametrize("cls, params, message", [
    (Cpu, {"time": 1.5}, "time: expected a whole number from 1 to 86400"),
    (Cpu, {"time": 0}, "time: expected a whole number from 1 to 86400"),
    (Threads, {"time": "10"}, "time: expected a whole number from 1 to 86400"),
    (Cpu, {"cpu-max-prime": [2000, 4000]}, "cpu-max-prime: expected a whole number"),
    (Cpu, {"cpu-max-prime": None}, "cpu-max-prime: expected a whole number"),
    (Memory, {"memory-oper": ""}, 'memory-oper: expected one of "read", "write", "none"'),
    (Cpu, {"--threads": 2}, "cpu: expected a cpu option"),
    (Cpu, {"threads=2 --debug": 1}, "expected a cpu option"),
    (Cpu, {"cpu-max-prim": 1}, 'got \'cpu-max-prim\' (did you mean "cpu-max-prime"?)'),
    (Fileio, {"file-total-size": "2 GB"}, 'file-total-size: expected a size like "8K"'),
])
def test_bad_params_are_rejected_when_the_workload_is_made(cls, params, message):
    with pytest.raises(VmtaxError, match=re.escape(message)):
        cls.make(params)


def test_memory_is_bounded_by_time_not_by_its_total():
    # issue 18: E1's fixed 1 GiB lasted 47 ms natively, too short to time.
    memory = Memory.make({}, time=2)
    assert {"--time=2", "--memory-total-size=1T"} <= set(memory.run_job().argv)
    total = _bytes(memory.params["memory-total-size"])
    assert total / (16 * 2**30) > 60   # more than a minute even at 16 GiB/s
    # ... and few enough operations for the int sysbench counts them in.
    assert total // _bytes(memory.params["memory-block-size"]) < 2**31
    # E1's fixed volume stays one parameter away.
    assert "--memory-total-size=1G" in Memory.make({"memory-total-size": "1G"}).run_job().argv


def test_the_classic_plan_file_measures_memory_for_its_time():
    classic = planfile.load(Path(__file__).parent.parent / "plans" / "classic.toml")
    [memory] = [w.make(classic.time) for w in classic.workloads if w.name == "memory"]
    assert (memory.params["time"], memory.params["memory-total-size"]) == (2, "1T")


# -- the real sysbench --------------------------------------------------------------------

@pytest.mark.live
@pytest.mark.parametrize("workload", [Cpu.make({"time": 1}), Memory.make({"time": 1})])
def test_real_sysbench_output_parses(workload):
    if shutil.which("sysbench") is None:
        pytest.skip("sysbench is not installed")
    job = workload.run_job()
    done = subprocess.run(job.argv, capture_output=True, text=True, timeout=job.timeout)
    assert done.returncode == 0, done.stderr
    got = as_dict(workload.parse(done.stdout))
    rate = "events/s" if workload.name == "cpu" else "MiB/s"
    assert got[rate] > 0 and got["total events"] > 0 and "latency p95" in got


@pytest.mark.live
def test_real_memory_run_lasts_its_time():
    # Time-bounded at E1's block size: a 2 s run lasts 2 s, not the ~50 ms of 1 GiB.
    if shutil.which("sysbench") is None:
        pytest.skip("sysbench is not installed")
    workload = Memory.make({"time": 2})
    done = subprocess.run(workload.run_job().argv, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert 1.9 < as_dict(workload.parse(done.stdout))["total time"] < 2.5
