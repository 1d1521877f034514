"""dbench: N clients replaying a file server's load on the target's scratch disk (E3's
dbench test), throughput and the worst latency.

dbench replays Debian's loadfile, /usr/share/dbench/client.txt (26 MB of NetBench
operations). Target root file systems carry programs, not data, so prepare jobs carry the
file in (vmtax.helpers.macro_data.carry_jobs: 1.9 MB compressed, in 6 jobs). Each
repetition is one `dbench -t TIME N` run; the parser reads its closing line ("Throughput
X MB/sec  N clients  N procs  max_latency=Y ms").
"""

from __future__ import annotations

import re
from pathlib import Path

from vmtax.core import plugin
from vmtax.core.errors import ParseError
from vmtax.core.types import Job, Metric, MetricSpec
from vmtax.core.workload import Workload
from vmtax.helpers.macro_data import carry_jobs, script_job

LOADFILE = Path("/usr/share/dbench/client.txt")
_RESULT = re.compile(r"Throughput ([0-9.]+) MB/sec\s+([0-9]+) clients\s+([0-9]+) procs\s+"
                     r"max_latency=([0-9.]+) ms")


class DbenchOptions(plugin.Options):
    clients: int = plugin.option(8, "Clients replaying the load at once", unit="clients",
                                 ge=1, le=1024)
    # dbench reports 0 MB/sec for a 1-second run: its rate needs one whole second done.
    time: int = plugin.option(10, "Seconds dbench runs (-t); the plan's time fills it",
                              unit="s", ge=2)


class Dbench(Workload):
    name = "dbench"
    description = ("dbench: clients replaying a file server's load on the scratch disk "
                   "(MB/s, max latency)")
    Options = DbenchOptions
    options: DbenchOptions
    binaries = ("dbench",)
    packages = ("dbench",)
    time_option = "time"
    metrics = (
        MetricSpec("throughput", "MB/s", True, "Data the clients' operations moved per "
                   "second, by dbench's account", group="disk I/O", primary=True),
        MetricSpec("max latency", "ms", False, "The slowest single operation of any client",
                   group="latency"),
    )

    def host_problems(self) -> list[tuple[str, str]]:
        if not LOADFILE.is_file():
            return [("clients", f"dbench's loadfile on the host ({LOADFILE}): apt-get "
                                "install dbench")]
        return []

    def prepare_seconds(self) -> float:
        return 5.0

    def prepare_jobs(self) -> list[Job]:
        return carry_jobs(LOADFILE, "client.txt")

    def run_job(self) -> Job:
        o = self.options
        # dbench deletes its clients' trees after the timed part: minutes under TCG.
        return Job(["dbench", "-c", "client.txt", "-t", str(o.time), "-D", ".",
                    str(o.clients)], timeout=o.time * 3 + 300, in_scratch=True)

    def cleanup_jobs(self) -> list[Job]:
        return [script_job("busybox rm -rf client.txt client.txt.gz clients\n",
                           timeout=120)]

    def parse(self, stdout: str) -> list[Metric]:
        found = [m for m in map(_RESULT.search, stdout.splitlines()) if m]
        if len(found) != 1:
            raise ParseError(f"{len(found)} dbench result lines in the output, expected one")
        m = found[0]
        if int(m[2]) != self.options.clients:
            raise ParseError(f"dbench ran {m[2]} clients, expected {self.options.clients}")
        throughput = float(m[1])
        if throughput <= 0:
            raise ParseError("dbench moved no data (0 MB/sec)")
        return [self.metric("throughput", throughput),
                self.metric("max latency", float(m[4]))]
