import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from vmtax.core import workload as workloads
from vmtax.core.errors import ParseError, VmtaxError
from vmtax.core.workload import check_manifest
from vmtax.workloads import fio
from vmtax.workloads.fio import Fio

FIXTURES = Path(__file__).parent / "fixtures" / "fio"

UNITS = {  # metric -> (unit, higher_is_better)
    "IOPS": ("ops/s", True), "bandwidth": ("MiB/s", True),
    "completion latency": ("µs", False), "mean completion latency": ("µs", False),
}
GLOBALS = ["fio", "--output-format=json", "--eta=never", "--group_reporting",
           "--percentile_list=50:99:99.9", "--size=256M", "--ioengine=libaio", "--iodepth=32",
           "--direct=1", "--numjobs=1", "--overwrite=1"]
SECTIONS = ["--name=randread", "--stonewall", "--rw=randread", "--bs=4K",
            "--name=randwrite", "--stonewall", "--rw=randwrite", "--bs=4K",
            "--name=read", "--stonewall", "--rw=read", "--bs=1M",
            "--name=write", "--stonewall", "--rw=write", "--bs=1M"]


def fixture(name: str, version: str = "3.33") -> str:
    return (FIXTURES / version / f"{name}.txt").read_text()


def as_dict(metrics) -> dict[str, float]:
    keys = [m.key for m in metrics]
    assert len(keys) == len(set(keys)), keys
    for m in metrics:
        assert (m.unit, m.higher_is_better) == UNITS[m.name], m
    return {m.key: m.value for m in metrics}


def keys_of(job: str) -> set[str]:
    return {f"IOPS[job={job}]", f"bandwidth[job={job}]", f"mean completion latency[job={job}]",
            *(f"completion latency[job={job},percentile={p}]" for p in ("50", "99", "99.9"))}


def report_json(name: str = "default") -> dict:
    return json.loads(fixture(name))


# -- the plugin and its options ------------------------------------------------------------

def test_registered_and_manifest_complete():
    assert workloads.get("fio") is Fio
    check_manifest(Fio)
    assert Fio.primary_metric() == "IOPS"
    assert Fio.time_option == "runtime" and Fio.binaries == ("fio",)


def test_defaults_and_plan_time():
    assert Fio.make({}).params == {
        "jobs": ["randread", "randwrite", "read", "write"], "size": "256M", "runtime": 10,
        "iodepth": 32, "ioengine": "libaio", "direct": True, "block_size_random": "4K",
        "block_size_seq": "1M", "numjobs": 1}
    timed = Fio.make({}, time=3)
    assert timed.params["runtime"] == 3
    assert timed.run_seconds() == 12            # four jobs of 3 s each
    assert Fio.make({"runtime": 5}, time=3).params["runtime"] == 5


@pytest.mark.parametrize("params, words", [
    ({"iodepth": 0}, "fio: iodepth: expected a whole number from 1 to 1024, got 0"),
    ({"iodepth": 1025}, "fio: iodepth: expected a whole number from 1 to 1024, got 1025"),
    ({"iodepth": "32"}, "fio: iodepth:"),
    ({"ioengine": "aio"}, 'fio: ioengine: expected one of "libaio", "io_uring"'),
    ({"jobs": []}, "fio: jobs: expected a non-empty list"),
    ({"jobs": ["read", "read"]}, "fio: jobs: expected a non-empty list of distinct jobs"),
    ({"jobs": ["randrw"]}, "fio: jobs:"),
    ({"size": "256"}, 'fio: size: expected a size like "2G"'),
    ({"runtime": 0}, "fio: runtime: expected a whole number from 1 to 86400"),
    ({"numjobs": 0}, "fio: numjobs:"),
    ({"direct": "yes"}, "fio: direct: expected true or false"),
    ({"block_size_seq": "1G"}, "fio: block_size_seq: expected a block size no larger than "
                               "size (256M), got '1G'"),
])
def test_bad_options_name_the_option(params, words):
    with pytest.raises(VmtaxError) as err:
        Fio.make(params)
    assert str(err.value).startswith(words), str(err.value)


def test_misspelt_option_is_named_with_the_real_one():
    with pytest.raises(VmtaxError) as err:
        Fio.make({"iodepht": 8})
    message = str(err.value)
    assert message.startswith("fio: ") and "'iodepht'" in message
    assert re.search(r"did you mean .iodepth.", message), message


def test_block_size_checked_only_for_the_jobs_that_use_it():
    Fio.make({"jobs": ["randread"], "size": "4K", "block_size_seq": "1M"})
    with pytest.raises(VmtaxError, match="block_size_random"):
        Fio.make({"jobs": ["randread"], "size": "4K", "block_size_random": "8K"})


def test_host_problems_name_a_missing_engine(monkeypatch):
    monkeypatch.setattr(fio, "_host_engines", lambda: frozenset({"libaio", "psync", "sync"}))
    assert Fio.make({}).host_problems() == []
    [(key, why)] = Fio.make({"ioengine": "io_uring"}).host_problems()
    assert key == "ioengine" and "libaio, psync, sync" in why


# -- the commands --------------------------------------------------------------------------

def test_run_argv_for_defaults():
    job = Fio.make({}).run_job()
    assert job.argv == [*GLOBALS, "--runtime=10", "--time_based", *SECTIONS]
    assert job.in_scratch
    assert job.timeout == 40 * 3 + 60


def test_prepare_and_cleanup_name_the_same_files():
    w = Fio.make({})
    [prepare] = w.prepare_jobs()
    [cleanup] = w.cleanup_jobs()
    assert prepare.argv == [*GLOBALS, "--create_only=1", *SECTIONS]
    assert cleanup.argv == [*GLOBALS, "--create_only=1", "--unlink=1",
                            "--allow_file_create=0", *SECTIONS]
    assert prepare.in_scratch and cleanup.in_scratch
    assert prepare.timeout == 4 * 256 + 60       # 1 MiB/s for the 1 GiB of files


def test_argv_follows_options():
    argv = Fio.make({"jobs": ["write", "randread"], "ioengine": "psync", "direct": False,
                     "numjobs": 2, "size": "1G", "block_size_random": "8K",
                     "block_size_seq": "128K", "runtime": 2}).run_job().argv
    # Synchronous engines get no --iodepth: fio would cap it at 1 with a note per clone.
    assert not any(a.startswith("--iodepth") for a in argv)
    assert argv[argv.index("--name=write"):] == [
        "--name=write", "--stonewall", "--rw=write", "--bs=128K",
        "--name=randread", "--stonewall", "--rw=randread", "--bs=8K"]
    assert {"--ioengine=psync", "--direct=0", "--numjobs=2", "--size=1G",
            "--runtime=2"} <= set(argv)


# -- parsing -------------------------------------------------------------------------------

def test_parse_default_fixture():
    metrics = Fio.make({}).parse(fixture("default"))
    values = as_dict(metrics)
    assert set(values) == set().union(*map(keys_of, ("randread", "randwrite", "read", "write")))
    # Read off the fixture: randread's read side, write's write side; ns -> µs.
    assert values["IOPS[job=randread]"] == 41648.351648
    assert values["bandwidth[job=randread]"] == 170591648 / 2**20
    assert values["mean completion latency[job=randread]"] == pytest.approx(756.278012593)
    assert values["completion latency[job=randread,percentile=50]"] == 473.088
    assert values["completion latency[job=randread,percentile=99]"] == 5406.72
    assert values["completion latency[job=randread,percentile=99.9]"] == 11075.584
    assert values["IOPS[job=randwrite]"] == 38687.312687
    assert values["bandwidth[job=write]"] == 1428951774 / 2**20
    assert values["completion latency[job=write,percentile=99]"] == 56885.248
    # Metrics come in the jobs' order, each job's IOPS first.
    assert [m.key for m in metrics if m.name == "IOPS"] == [
        "IOPS[job=randread]", "IOPS[job=randwrite]", "IOPS[job=read]", "IOPS[job=write]"]


def test_parse_skips_notes_before_the_report():
    text = fixture("psync-numjobs2-notes")
    assert text.startswith("note: both iodepth >= 1")
    values = as_dict(Fio.make({"jobs": ["randread", "write"], "numjobs": 2}).parse(text))
    assert set(values) == keys_of("randread") | keys_of("write")
    assert values["IOPS[job=randread]"] == 11891.108891
    assert values["completion latency[job=write,percentile=50]"] == 518.144


def test_parse_reads_bw_in_kib_when_fio_lacks_bw_bytes():
    # fio 3.0 and 3.1 report bandwidth only as "bw" in KiB/s.
    report = report_json()
    for job in report["jobs"]:
        for side in ("read", "write"):
            del job[side]["bw_bytes"]
    values = as_dict(Fio.make({}).parse(json.dumps(report)))
    assert values["bandwidth[job=randread]"] == 166593 / 1024


def test_direct_io_failure_is_explained():
    with pytest.raises(ParseError) as err:
        Fio.make({}).parse(fixture("odirect-unsupported"))
    message = str(err.value)
    assert message.startswith("randread: fio failed with error 22 (Invalid argument)")
    assert "O_DIRECT" in message and "direct = false" in message
    with pytest.raises(ParseError) as err:
        Fio.make({"direct": False}).parse(fixture("odirect-unsupported"))
    assert "O_DIRECT" not in str(err.value)


def test_trailing_text_after_the_report_is_ignored():
    values = as_dict(Fio.make({}).parse(fixture("default") + "fio: file hash not empty\n"))
    assert values["IOPS[job=read]"] == 752.120641


def test_truncated_output_is_a_parse_error():
    text = fixture("default")
    for end in range(0, len(text) - 2, 97):
        with pytest.raises(ParseError):
            Fio.make({}).parse(text[:end])


@pytest.mark.parametrize("text", [
    "", "\n", "fio: engine libaio not loadable\n", "{", "{}", "[]", '{"jobs": 3}',
    '{"jobs": [1]}', '{"jobs": [{"jobname": ["x"]}]}', "{" * 100000, "{\n" + "[" * 100000,
    '{"jobs": [{"jobname": "randread", "error": 0, "read": {"iops": 1e999}}]}',
    "\x00\xff garbage }{",
])
def test_garbled_output_is_a_parse_error(text):
    with pytest.raises(ParseError):
        Fio.make({"jobs": ["randread"]}).parse(text)


def _broken(edit) -> str:
    report = report_json()
    edit(report["jobs"])
    return json.dumps(report)


def _set(*path: str, to):
    """An edit setting one value of the first job (randread)."""
    def edit(jobs):
        *keys, last = path
        obj = jobs[0]
        for key in keys:
            obj = obj[key]
        obj[last] = to
    return edit


@pytest.mark.parametrize("edit, words", [
    (lambda jobs: jobs.pop(), r"fio reported jobs \['randread', 'randwrite', 'read'\]"),
    (lambda jobs: jobs.append(dict(jobs[0])), "reported job 'randread' twice"),
    (lambda jobs: jobs[3].update(jobname="trim"), "expected"),
    (_set("error", to=5), r"randread: fio failed with error 5 \(Input/output error\)$"),
    (_set("error", to="x"), "fio reported error 'x'"),
    (_set("read", "iops", to=0), "randread read: fio completed no I/O"),
    (_set("read", "iops", to=-1.0), "iops is -1.0"),
    (_set("read", "iops", to="41648"), "iops is '41648'"),
    (_set("read", "iops", to=True), "iops is True"),
    (_set("read", "iops", to=math.nan), "iops is nan"),
    (_set("read", "bw_bytes", to=math.inf), "bw_bytes is inf"),
    (_set("read", "clat_ns", "mean", to=None), "mean is None"),
    (_set("read", "clat_ns", to={"mean": 1.0}), "no 'percentile'"),
    (_set("read", "clat_ns", "percentile", to={"50.000000": 1, "99.000000": 2}),
     "no 99.9th percentile"),
    (_set("read", "clat_ns", "percentile", to={"p50": 1}), "not a number"),
    (_set("read", "clat_ns", "percentile", to=[1, 2]), "not an object"),
    (_set("read", "clat_ns", "percentile", "99.000000", to=math.inf), "is inf"),
    (lambda jobs: jobs[0].pop("read"), "randread: fio's report has no 'read'"),
])
def test_bad_values_are_parse_errors(edit, words):
    text = _broken(edit)      # json.dumps writes nan and inf as NaN and Infinity
    with pytest.raises(ParseError, match=words):
        Fio.make({}).parse(text)


# -- live ----------------------------------------------------------------------------------

@pytest.mark.live
@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_live_native_run(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    w = Fio.make({"size": "8M"}, time=1)
    for job in w.prepare_jobs():
        subprocess.run(job.argv, cwd=scratch, check=True, capture_output=True,
                       timeout=job.timeout)
    assert len(list(scratch.iterdir())) == 4          # one laid-out file per job
    run = w.run_job()
    done = subprocess.run(run.argv, cwd=scratch, capture_output=True, text=True,
                          timeout=run.timeout)
    assert done.returncode == 0, done.stderr
    values = as_dict(w.parse(done.stdout))
    assert set(values) == set().union(*map(keys_of, ("randread", "randwrite", "read", "write")))
    assert all(v > 0 for v in values.values())
    for job in w.cleanup_jobs():
        subprocess.run(job.argv, cwd=scratch, check=True, capture_output=True,
                       timeout=job.timeout)
    assert list(scratch.iterdir()) == []


def test_a_read_beating_native_is_explained_by_the_host_page_cache():
    """runsc's sequential read at 9.77× native: O_DIRECT stops at gVisor's gofer."""
    read = workloads.Outcome("IOPS", {"job": "read"}, 9.77, True)
    write = workloads.Outcome("IOPS", {"job": "write"}, 0.8, False)
    why = Fio.explain_win(read, [write, workloads.Outcome("IOPS", {"job": "randread"}, 5.0,
                                                          True)], "native")
    assert why is not None and why.startswith("likely the host's page cache")
    assert "gVisor" in why and "O_DIRECT" in why and why.endswith("(write ×0.8)")
    # a write's win is the generic disk explanation's
    assert Fio.explain_win(workloads.Outcome("IOPS", {"job": "randwrite"}, 2.0, True), [],
                           "native") is None
