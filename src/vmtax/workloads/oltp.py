"""oltp: sysbench OLTP (read-write or read-only) against a real MariaDB server that runs
inside the target (E3's OLTP test): transactions/s, queries/s and latency.

A two-role workload, like iperf3: Debian's MariaDB server (`mariadbd`) is the server role,
started in the target's scratch directory for the cell's repetitions and stopped after
them (SIGTERM: MariaDB's clean shutdown); Debian's sysbench is the client, on the host.

vmtax initialises the data directory itself, as mariadb-install-db does: MariaDB's system
tables from Debian's SQL scripts, fed to `mariadbd --bootstrap`, then one account with a
random password made for this run (`sbtest`, all rights on the `sbtest` database and
nothing else: no root account is left), so only vmtax's client can use the server while
it listens on the target's network (natively: on loopback only). The password is in no
command line (`ps` would show it) and never stored: the bootstrap and the client get it in
their environment (PASSWORD_ENV), sysbench reads it from a config file on a pipe, and the
store keeps `***` for it (Job.secrets). It dies with the data directory, which a cleanup
job deletes. Root file systems carry programs, not data, so prepare jobs bring in the SQL
scripts and MariaDB's error messages file (vmtax.helpers.macro_data.carry_jobs).

sysbench's tables are prepared once per target and cell: the first client run against a
server (a new server after a target restart included) first drops and creates them
(`cleanup`, `prepare`, printed on stderr) and then runs the test; the measured numbers are
sysbench's own, from its `run` report alone.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from pathlib import Path
from typing import Literal

from vmtax.core import plugin
from vmtax.core.errors import ParseError
from vmtax.core.option_types import Size
from vmtax.core.types import Endpoint, Job, Metric, MetricSpec
from vmtax.core.workload import Workload
from vmtax.helpers.macro_data import carry_jobs, programs, script_job
from vmtax.helpers.sysbench_report import FAIRNESS, LATENCY_RESOLUTION, Report, find, number

PORT = 3306
SHARE = Path("/usr/share/mysql")
ERRMSG = SHARE / "english" / "errmsg.sys"
# What mariadb-install-db feeds `mariadbd --bootstrap`, less the help, GIS, sys-schema and
# test tables a benchmark does not use.
SYSTEM_SQL = (SHARE / "mysql_system_tables.sql", SHARE / "mysql_system_tables_data.sql")
BOOTSTRAP_TIMEOUT = 600.0
# MariaDB creates InnoDB's system tablespace and redo log before it listens: seconds
# natively, up to minutes under TCG.
SERVER_START_TIMEOUT = 300.0
# Dropping and creating the tables before the first run: table_size rows per table at
# no less than 100 rows/s.
SLOWEST_ROWS_S = 100.0

# The server with the options the bootstrap and the server share (its first argument: the
# buffer pool); it replaces the shell that calls it. The Unix socket's path is relative to
# the data directory: a scratch path can be longer than a socket's 108 bytes, and the
# server dies of it right after it starts listening.
_MARIADBD = """mariadbd() {
    pool=$1
    shift
    exec "$MARIADBD_BIN" --no-defaults --user=root --datadir="$PWD/mariadb" \\
        --lc-messages-dir="$PWD/mariadb-messages" --innodb-buffer-pool-size="$pool" \\
        --innodb-log-file-size=48M --skip-name-resolve "$@"
}
"""
# Where the bootstrap and the client find the password (the scripts below name it): their
# environment, which only their user (and root) can read, where a command line is everyone's.
PASSWORD_ENV = "VMTAX_DB_PASSWORD"
# The password of the one account is in $VMTAX_DB_PASSWORD. The bootstrap thread may write
# every table, but CREATE USER needs the grant tables loaded (FLUSH PRIVILEGES) first. A
# pipeline's last command runs in a subshell of its own, which mariadbd replaces.
_BOOTSTRAP = _MARIADBD + """busybox rm -rf mariadb
busybox mkdir mariadb
{
    echo "CREATE DATABASE IF NOT EXISTS mysql;"
    echo "USE mysql;"
    echo "SET @auth_root_socket=NULL;"
    busybox cat mariadb-sql/mysql_system_tables.sql mariadb-sql/mysql_system_tables_data.sql
    echo "DELETE FROM global_priv;"
    echo "DELETE FROM proxies_priv;"
    echo "FLUSH PRIVILEGES;"
    echo "CREATE DATABASE sbtest;"
    echo "CREATE USER 'sbtest'@'%' IDENTIFIED BY '$VMTAX_DB_PASSWORD';"
    echo "GRANT ALL ON sbtest.* TO 'sbtest'@'%';"
} | mariadbd "$1" --bootstrap --log-warnings=0 --enforce-storage-engine= \\
    --max_allowed_packet=8M --net_buffer_length=16K > mariadb-bootstrap.log 2>&1 || {
    busybox tail -n 20 mariadb-bootstrap.log >&2
    exit 1
}
"""
# Every address of the target, unless the target names one (the bare host: loopback).
_SERVER = _MARIADBD + """mariadbd "$1" --bind-address="${VMTAX_LISTEN:-0.0.0.0}" --port="$2" \\
    --socket=mariadb.sock \\
    --pid-file="$PWD/mariadb.pid"
"""


def _sysbench(command: str, redirect: str = "") -> str:
    """A line of a script on the host: sysbench's command, its arguments passed through,
    the password read from a config file on a pipe (fd 3), in no command line or file."""
    return (f'sysbench --config-file=/dev/fd/3 "$@" {command}{redirect} 3<<EOF\n'
            f"mysql-password=${PASSWORD_ENV}\nEOF\n")


_PREPARE_AND_RUN = ("set -e\n" + _sysbench("cleanup", " >&2") + _sysbench("prepare", " >&2")
                    + "exec " + _sysbench("run"))
_RUN = "exec " + _sysbench("run")
_TRANSACTIONS = re.compile(r"transactions:\s+([0-9]+)\s+\((\S+) per sec\.\)")
_QUERIES = re.compile(r"queries:\s+([0-9]+)\s+\((\S+) per sec\.\)")
_ERRORS = re.compile(r"ignored errors:\s+([0-9]+)\s+\((\S+) per sec\.\)")

Test = Literal["oltp_read_write", "oltp_read_only"]


class OltpOptions(plugin.Options):
    test: Test = plugin.option("oltp_read_write", "sysbench's OLTP test")
    time: int = plugin.option(10, "Seconds each client run lasts (sysbench --time); the "
                              "plan's time fills it", unit="s", ge=1)
    threads: int = plugin.option(1, "Client threads, one connection each", unit="threads",
                                 ge=1, le=256)
    tables: int = plugin.option(1, "Tables sysbench creates", unit="tables", ge=1, le=64)
    table_size: int = plugin.option(10000, "Rows per table", unit="rows", ge=1,
                                    le=100_000_000)
    buffer_pool: Size = plugin.option("128M", "InnoDB's buffer pool in the server "
                                      "(innodb_buffer_pool_size)")


class Oltp(Workload):
    name = "oltp"
    description = ("sysbench OLTP against a MariaDB server inside the target "
                   "(transactions/s, queries/s, p95 latency)")
    Options = OltpOptions
    options: OltpOptions
    binaries = ("mariadbd",)
    packages = ("mariadb-server", "sysbench")
    time_option = "time"
    server_port = PORT
    metrics = (
        # Every transaction commits through InnoDB's redo log (flushed at each commit).
        MetricSpec("transactions", "tx/s", True, "Transactions per second, by sysbench",
                   group="disk I/O", primary=True),
        MetricSpec("queries", "q/s", True, "Queries per second, by sysbench"),
        MetricSpec("latency p95", "ms", False, "95th percentile of transaction latency",
                   group="latency", resolution=LATENCY_RESOLUTION),
        MetricSpec("latency avg", "ms", False, "Mean transaction latency", secondary=True,
                   resolution=LATENCY_RESOLUTION),
        MetricSpec("latency min", "ms", False, "Fastest transaction", secondary=True,
                   resolution=LATENCY_RESOLUTION),
        MetricSpec("latency max", "ms", False, "Slowest transaction", secondary=True,
                   resolution=LATENCY_RESOLUTION),
        *(MetricSpec(name, unit, False, doc, secondary=True, spread=True, resolution=0.01)
          for name, unit, doc in ((FAIRNESS[0], "events", "Spread of transactions per "
                                   "thread"), (FAIRNESS[1], "s", "Spread of run time per "
                                               "thread"))),
    )

    def __init__(self, options: plugin.Options):
        super().__init__(options)
        # Servers whose tables the first client run against them prepared.
        self._prepared: list[Endpoint] = []
        # Hex digits only: it is written into the bootstrap's SQL as it is.
        self._password = secrets.token_hex(16)

    def prepare_seconds(self) -> float:
        return 5.0 + self.options.tables * self.options.table_size / 10_000

    def prepare_jobs(self) -> list[Job]:
        bootstrap = script_job(_BOOTSTRAP, self.options.buffer_pool,
                               env={**programs("mariadbd"), PASSWORD_ENV: self._password},
                               timeout=BOOTSTRAP_TIMEOUT)
        return [*carry_jobs(ERRMSG, "mariadb-messages/english/errmsg.sys"),
                *(job for sql in SYSTEM_SQL
                  for job in carry_jobs(sql, f"mariadb-sql/{sql.name}")),
                dataclasses.replace(bootstrap, secrets=(self._password,))]

    def server_job(self) -> Job:
        return script_job(_SERVER, self.options.buffer_pool, PORT, env=programs("mariadbd"),
                          timeout=SERVER_START_TIMEOUT)

    def client_job(self, endpoint: Endpoint) -> Job:
        o = self.options
        args = [o.test, "--db-driver=mysql", f"--mysql-host={endpoint.address}",
                f"--mysql-port={endpoint.port}", "--mysql-user=sbtest", "--mysql-db=sbtest",
                f"--tables={o.tables}", f"--table-size={o.table_size}",
                f"--threads={o.threads}", f"--time={o.time}", "--percentile=95"]
        # Connecting and the last transactions in flight take seconds under TCG.
        timeout = o.time * 3 + 60
        env, secret = {PASSWORD_ENV: self._password}, (self._password,)
        if any(e is endpoint for e in self._prepared):
            return Job(["busybox", "sh", "-c", _RUN, "sysbench", *args], env=env,
                       timeout=timeout, secrets=secret)
        self._prepared.append(endpoint)
        return Job(["busybox", "sh", "-c", _PREPARE_AND_RUN, "sysbench", *args], env=env,
                   timeout=timeout + o.tables * o.table_size / SLOWEST_ROWS_S + 60,
                   secrets=secret)

    def cleanup_jobs(self) -> list[Job]:
        return [script_job("busybox rm -rf mariadb mariadb-messages mariadb-sql mariadb.pid "
                           "mariadb-bootstrap.log\n", timeout=120)]

    def parse(self, stdout: str) -> list[Metric]:
        report = Report(stdout, self.metric)
        lines = report.lines
        values = {}
        for name, regex in (("transactions", _TRANSACTIONS), ("queries", _QUERIES)):
            m = find(lines, regex, name)
            values[name] = number(m[2], f"{name} per sec.")
        errors = find(lines, _ERRORS, "ignored errors", required=False)
        if errors and int(errors[1]):
            raise ParseError(f"sysbench ignored {errors[1]} errors of the server")
        if values["transactions"] <= 0:
            raise ParseError("sysbench completed no transaction")
        latency = {m.name: m for m in report.latency}
        if "latency p95" not in latency:
            raise ParseError("no 95th percentile in sysbench's latency block")
        return [self.metric("transactions", values["transactions"]),
                self.metric("queries", values["queries"]),
                *latency.values(), *report.fairness]
