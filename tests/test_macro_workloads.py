"""E3's file workloads (dd, bzip2, rsync, dbench): parsers on real output, the jobs they
build, and a live run of their real programs natively."""

import base64
import gzip
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from vmtax.core import workload as workloads
from vmtax.core.errors import ParseError, VmtaxError
from vmtax.core.workload import check_manifest
from vmtax.helpers import macro_data as macro_util
from vmtax.workloads import dbench
from vmtax.workloads.bzip2 import Bzip2
from vmtax.workloads.compile import Compile
from vmtax.workloads.dbench import Dbench
from vmtax.workloads.dd import Dd
from vmtax.workloads.rsync import Rsync

FIXTURES = Path(__file__).parent / "fixtures" / "macro"
NAMES = ("dd", "bzip2", "rsync", "dbench", "compile")


def fixture(name: str) -> str:
    return (FIXTURES / f"{name}.txt").read_text()


def values(metrics) -> dict[str, float]:
    return {m.key: m.value for m in metrics}


@pytest.mark.parametrize("name", NAMES)
def test_registered_with_a_complete_manifest(name):
    cls = workloads.get(name)
    check_manifest(cls)
    assert cls.binaries and cls.packages
    # The class the report files it under (CPU, disk I/O): its primary metric's group.
    assert cls.metric_spec(cls.primary_metric()).group in ("CPU", "disk I/O")
    assert cls.run_seconds(cls.make({})) > 0 and cls.prepare_seconds(cls.make({})) > 0


# -- dd ------------------------------------------------------------------------------------

def test_dd_parses_both_copies_from_bytes_and_seconds():
    got = values(Dd.make({"size": "8M"}).parse(fixture("dd")))
    assert got == pytest.approx({"throughput[mode=buffered]": 8388608 / 0.0226413 / 1e6,
                                 "throughput[mode=direct]": 8388608 / 0.171947 / 1e6})


def test_dd_rejects_missing_short_and_zero_time_copies():
    w = Dd.make({"size": "8M"})
    text = fixture("dd")
    with pytest.raises(ParseError, match="no dd summary for the direct copy"):
        w.parse(text.split("vmtax-mode direct")[0])
    with pytest.raises(ParseError, match="copied 8388608 bytes, expected 16777216"):
        Dd.make({"size": "16M"}).parse(text)
    with pytest.raises(ParseError, match="too short"):
        w.parse(text.replace("0.171947 s", "0 s"))
    with pytest.raises(ParseError, match="outside a copy"):
        w.parse(text.replace("vmtax-mode direct\n", ""))


def test_dd_jobs_pass_sizes_as_arguments_and_use_debian_dd():
    w = Dd.make({"size": "8M", "block_size": "1M"})
    run = w.run_job()
    assert run.argv[:3] == ["busybox", "sh", "-c"] and run.argv[4:] == ["vmtax", "1048576"]
    assert run.in_scratch and run.env["LC_ALL"] == "C"
    assert run.env["DD_BIN"] == shutil.which("dd")
    assert w.prepare_jobs()[0].argv[4:] == ["vmtax", "1048576", "8"]


def test_dd_size_must_be_a_multiple_of_the_block_size():
    with pytest.raises(VmtaxError, match="size"):
        Dd.make({"size": "3M", "block_size": "2M"})


# -- bzip2 and rsync -----------------------------------------------------------------------

def test_bzip2_times_rates_and_ratios():
    got = values(Bzip2.make({"size": "16M", "files": 2000}).parse(fixture("bzip2")))
    assert got == pytest.approx({
        "time[input=file]": 7.45, "time[input=tree]": 4.93,
        "throughput[input=file]": 16 / 7.45, "throughput[input=tree]": 10014720 / 2**20 / 4.93,
        "compression ratio[input=file]": 16777216 / 4544092,
        "compression ratio[input=tree]": 10014720 / 2009691})


def test_bzip2_needs_both_phases_and_sizes():
    w = Bzip2.make({})
    text = fixture("bzip2")
    with pytest.raises(ParseError, match="no time for phase tree"):
        w.parse("\n".join(line for line in text.splitlines() if "time tree" not in line))
    with pytest.raises(ParseError, match="no sizes for the tree input"):
        w.parse("\n".join(line for line in text.splitlines() if "tree.tar" not in line))


def test_rsync_times_each_part():
    got = values(Rsync.make({"size": "16M", "files": 2000}).parse(fixture("rsync")))
    assert got == pytest.approx({"time[part=tree]": 4.48, "time[part=file]": 0.2})


def test_times_refuses_what_it_cannot_measure():
    with pytest.raises(ParseError, match="less than 10 ms"):
        macro_util.times("vmtax-time a 5.00 5.00\n", ("a",))
    with pytest.raises(ParseError, match="timed twice"):
        macro_util.times("vmtax-time a 5.00 6.00\nvmtax-time a 6.00 7.00\n", ("a",))
    with pytest.raises(ParseError, match="ended before it began"):
        macro_util.times("vmtax-time a 6.00 5.00\n", ("a",))


def test_bad_options_are_one_line_errors():
    with pytest.raises(VmtaxError, match="files"):
        Rsync.make({"files": 0})
    with pytest.raises(VmtaxError, match="size"):
        Bzip2.make({"size": "256"})


# -- compile -------------------------------------------------------------------------------

def test_compile_times_the_build():
    assert values(Compile.make({}).parse(fixture("compile"))) == {"time": 53.79}
    with pytest.raises(ParseError, match="no time for phase build"):
        Compile.make({}).parse("make: *** [Makefile:3: f0000.o] Error 1\n")


# -- dbench --------------------------------------------------------------------------------

def test_dbench_reads_its_closing_line():
    got = values(Dbench.make({"clients": 2}).parse(fixture("dbench")))
    assert got == {"throughput": 67.3894, "max latency": 212.443}


def test_dbench_rejects_other_client_counts_and_missing_or_zero_results():
    text = fixture("dbench")
    with pytest.raises(ParseError, match="ran 2 clients, expected 8"):
        Dbench.make({}).parse(text)
    with pytest.raises(ParseError, match="0 dbench result lines"):
        Dbench.make({"clients": 2}).parse(text.replace("Throughput", "Thr"))
    with pytest.raises(ParseError, match="no data"):
        Dbench.make({"clients": 2}).parse(text.replace("Throughput 67.3894", "Throughput 0"))


def test_dbench_time_below_two_seconds_is_refused():
    with pytest.raises(VmtaxError, match="time"):
        Dbench.make({}, time=1)


def test_dbench_carries_its_loadfile_in_pieces_that_fit_an_argument(tmp_path, monkeypatch):
    loadfile = tmp_path / "client.txt"
    # incompressible: 1.3 MB in base64, 21 pieces, two jobs' worth
    loadfile.write_bytes(os.urandom(1_000_000))
    monkeypatch.setattr(dbench, "LOADFILE", loadfile)
    jobs = Dbench.make({}).prepare_jobs()
    assert len(jobs) == 1 + 2 + 1
    assert [job.argv[5] for job in jobs] == ["client.txt"] * 4
    pieces = [piece for job in jobs[1:-1] for piece in job.argv[6:]]
    assert len(pieces) == 21 and len(jobs[1].argv[6:]) == macro_util.PIECES_PER_JOB
    assert all(len(piece) <= macro_util.PIECE_CHARS for piece in pieces)
    assert gzip.decompress(base64.b64decode("".join(pieces))) == loadfile.read_bytes()
    assert jobs[-1].argv[-1] == hashlib.sha256(loadfile.read_bytes()).hexdigest()


def test_dbench_without_its_loadfile_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(dbench, "LOADFILE", tmp_path / "none.txt")
    assert "apt-get install dbench" in Dbench.make({}).host_problems()[0][1]
    with pytest.raises(VmtaxError, match="none.txt cannot be read"):
        Dbench.make({}).prepare_jobs()


# -- live ----------------------------------------------------------------------------------

def _run(job, cwd):
    done = subprocess.run(job.argv, cwd=cwd, capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], **job.env}, timeout=job.timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.live
@pytest.mark.skipif(shutil.which("busybox") is None, reason="busybox is not installed")
def test_live_native_prepare_run_cleanup_leaves_nothing(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    workload = Dd.make({"size": "4M"})
    for job in workload.prepare_jobs():
        _run(job, scratch)
    metrics = workload.parse(_run(workload.run_job(), scratch))
    assert [m.dimensions["mode"] for m in metrics] == ["buffered", "direct"]
    assert all(m.value > 0 for m in metrics)
    for job in workload.cleanup_jobs():
        _run(job, scratch)
    assert list(scratch.iterdir()) == []
