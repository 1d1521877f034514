"""oltp: MariaDB in the target, sysbench on the host: its jobs, the once-per-server table
preparation, the parser on real output, and a live run natively and in a container."""

import json
import re
import shutil
import subprocess

import pytest
from conftest import vmtax

from vmtax.core.errors import ParseError, VmtaxError
from vmtax.core.types import Endpoint
from vmtax.core.workload import check_manifest
from vmtax.helpers import macro_data as macro_util
from vmtax.results.store import Store
from vmtax.workloads.oltp import ERRMSG, PASSWORD_ENV, SYSTEM_SQL, Oltp

FIXTURE = "tests/fixtures/macro/oltp_read_write.txt"


def output() -> str:
    with open(FIXTURE) as f:
        return f.read()


def test_manifest_and_roles():
    check_manifest(Oltp)
    w = Oltp.make({}, time=5)
    server = w.server_job()
    assert server.argv[:3] == ["busybox", "sh", "-c"] and server.in_scratch
    assert server.argv[-2:] == ["128M", "3306"]
    assert server.env["MARIADBD_BIN"] == (shutil.which("mariadbd") or "/usr/bin/mariadbd")
    assert "--skip-grant-tables" not in server.argv[3]


def test_tables_are_prepared_by_the_first_run_against_each_server():
    w = Oltp.make({"test": "oltp_read_only", "tables": 2}, time=5)
    first, second = Endpoint("10.0.0.2", 3306), Endpoint("10.0.0.2", 3306)
    job = w.client_job(first)
    assert job.argv[:3] == ["busybox", "sh", "-c"] and "prepare" in job.argv[3]
    assert job.argv[5] == "oltp_read_only" and "--tables=2" in job.argv
    again = w.client_job(first)
    assert "prepare" not in again.argv[3] and again.argv[3].startswith("exec sysbench")
    assert "--mysql-host=10.0.0.2" in again.argv and "--time=5" in again.argv
    # A restarted target's new server has no tables yet, even at the same address.
    assert "prepare" in w.client_job(second).argv[3]


def test_parses_transactions_queries_and_latency():
    got = {m.key: m.value for m in Oltp.make({}).parse(output())}
    assert got["transactions"] == 337.40 and got["queries"] == 6747.92
    assert got["latency p95"] == 8.43 and got["latency max"] == 19.87


def test_rejects_errors_and_empty_runs():
    text = output()
    with pytest.raises(ParseError, match="ignored 3 errors"):
        Oltp.make({}).parse(text.replace("ignored errors:                      0 ",
                                         "ignored errors:                      3 "))
    with pytest.raises(ParseError, match="no transactions line"):
        Oltp.make({}).parse(text.replace("transactions:", "trans:"))
    with pytest.raises(ParseError, match="no 95th percentile"):
        Oltp.make({}).parse("\n".join(line for line in text.splitlines()
                                       if "95th percentile" not in line))


def test_bad_test_name_is_a_one_line_error():
    with pytest.raises(VmtaxError, match="test"):
        Oltp.make({"test": "oltp_insert"})


@pytest.mark.skipif(not ERRMSG.is_file(), reason="mariadb-server is not installed")
def test_prepare_carries_its_files_then_bootstraps_one_account_with_a_fresh_password():
    w = Oltp.make({})
    jobs = w.prepare_jobs()
    unpacked = [job.argv[-2:] for job in jobs if "gunzip" in job.argv[3]]
    assert unpacked == [["mariadb-messages/english/errmsg.sys", macro_util.pieces(ERRMSG)[0]],
                        *([f"mariadb-sql/{sql.name}", macro_util.pieces(sql)[0]]
                          for sql in SYSTEM_SQL)]
    bootstrap = jobs[-1]
    assert "--bootstrap" in bootstrap.argv[3] and bootstrap.argv[-1] == "128M"
    password = bootstrap.env[PASSWORD_ENV]
    assert len(password) == 32 and password != Oltp.make({}).prepare_jobs()[-1].env[PASSWORD_ENV]
    # In no command line (`ps` shows them, the store keeps them), and declared secret.
    assert bootstrap.secrets == (password,)
    first, again = (w.client_job(Endpoint("127.0.0.1", 3306)) for _ in range(2))
    for client in (first, again):
        assert not any(password in arg for arg in client.argv)
        assert client.env[PASSWORD_ENV] == password and client.secrets == (password,)
        assert "--mysql-user=sbtest" in client.argv


def test_the_client_reads_the_password_from_its_environment_through_a_pipe(tmp_path):
    """The client's script gives sysbench a config file on fd 3 that holds the password:
    a stand-in sysbench prints what it was given."""
    (tmp_path / "sysbench").write_text('#!/bin/sh\necho "$@"\ncat "${1#--config-file=}"\n')
    (tmp_path / "sysbench").chmod(0o755)
    client = Oltp.make({}).client_job(Endpoint("127.0.0.1", 3306))
    done = subprocess.run(client.argv, env={**client.env, "PATH": f"{tmp_path}:/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=30)
    password = client.env[PASSWORD_ENV]
    assert done.stdout.splitlines()[-1] == f"mysql-password={password}", done.stderr
    # cleanup and prepare print on stderr, run on stdout
    assert (done.stdout + done.stderr).count(f"mysql-password={password}") == 3


@pytest.mark.live
def test_live_mariadb_natively_and_in_a_container(tmp_path):
    missing = [b for b in ("mariadbd", "sysbench", "busybox", "bzip2") if not shutil.which(b)]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")
    plan = tmp_path / "oltp.toml"
    plan.write_text('runs = 2\nwarmup = 0\ntime = 1\n[targets.native]\n[targets.container]\n'
                    '[[workloads]]\nname = "oltp"\n'
                    'params = { table_size = 1000 }\n')
    run = vmtax("run", str(plan), "--results", str(tmp_path / "r"), "--json", timeout=600)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert [f["error"] for f in data["summary"]["failures"]] == []
    rows = [r for r in data["summary"]["rows"] if r["metric"] == "transactions"]
    assert len(rows) == 1
    for row in rows:
        for target in ("native", "container"):
            # the second run found the tables the first one prepared
            assert row["cells"][target]["n"] == 2
            assert row["cells"][target]["summary"]["median"] > 0
    # The run's password is in no stored command line (nor was it in any: `ps`).
    stored = Store(tmp_path / "r", readonly=True).load_run("last")
    assert not any(re.search("mysql-password=[0-9a-f]", " ".join(rep.argv))
                   for rep in stored.reps)
    bootstraps = [rep.argv for rep in stored.reps if "--bootstrap" in " ".join(rep.argv)]
    assert bootstraps and all(argv[-1] == "128M" for argv in bootstraps)
    # Every server was shut down: no MariaDB is left running.
    assert subprocess.run(["pgrep", "-x", "mariadbd"], capture_output=True).returncode == 1
