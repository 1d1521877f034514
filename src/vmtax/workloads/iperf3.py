"""iperf3: TCP stream throughput between a server in the target and a client on the host.

It stands in for E3's netperf TCP stream test, which Debian 12 does not package. The
server (`iperf3 -s`) stays up in the target for the cell's repetitions; each repetition is
one client run on the host (`iperf3 -c ADDR -J`), pinned to host CPUs apart from the
target's, whose JSON report is parsed. Natively the server listens on the host itself and
the client reaches it over loopback.
"""

from __future__ import annotations

import json
import math
from typing import Any

from vmtax.core import plugin
from vmtax.core.errors import ParseError
from vmtax.core.types import Endpoint, Job, JobResult, Metric, MetricSpec
from vmtax.core.workload import Workload

PORT = 5201   # iperf3's own default


class Iperf3Options(plugin.Options):
    time: int = plugin.option(10, "Seconds each client run sends for (iperf3 -t); the "
                              "plan's time fills it", unit="s", ge=1, le=3600)
    reverse: bool = plugin.option(False, "The target sends and the host receives (-R)")
    streams: int = plugin.option(1, "Parallel TCP streams (-P)", unit="streams", ge=1,
                                 le=128)


class Iperf3(Workload):
    name = "iperf3"
    description = ("TCP stream from the host to a server in the target (or back with "
                   "reverse): throughput and retransmits; stands in for netperf")
    Options = Iperf3Options
    options: Iperf3Options
    binaries = ("iperf3",)
    packages = ("iperf3",)
    time_option = "time"
    server_port = PORT
    metrics = (
        MetricSpec("throughput", "Gbit/s", True, "Received bits per second",
                   group="network", primary=True),
        MetricSpec("retransmits", "segments", False, "TCP segments the sender sent again"),
        MetricSpec("sender cpu", "%", False, "CPU the sending side's iperf3 used, by its "
                   "own account", secondary=True),
        MetricSpec("receiver cpu", "%", False, "CPU the receiving side's iperf3 used, by "
                   "its own account", secondary=True),
    )

    def server_job(self) -> Job:
        # The server lives for the cell; its timeout bounds how long it may take to start.
        # Binds the address the target names, if any (the bare host: loopback only).
        return Job(["busybox", "sh", "-c", 'exec iperf3 --server --port "$1" '
                    '${VMTAX_LISTEN:+--bind "$VMTAX_LISTEN"}', "iperf3", str(PORT)], timeout=30)

    def client_job(self, endpoint: Endpoint) -> Job:
        argv = ["iperf3", "--client", endpoint.address, "--port", str(endpoint.port),
                "--time", str(self.options.time), "--parallel", str(self.options.streams),
                "--json"]
        if self.options.reverse:
            argv.append("--reverse")
        # Connection set-up and the final exchange of results take seconds under TCG.
        return Job(argv, timeout=self.options.time * 3 + 30)

    def turned_away(self, result: JobResult) -> str | None:
        # iperf3's server closes its listening socket after each test and opens a new one: a
        # client whose connection waited on the old one (a guest paused right after the last
        # test) is reset before its test begins, and reports no interval. A report without
        # an error, every good run's, is not decoded twice (parse decodes it).
        if '"error"' not in result.stdout:
            return None
        try:
            report = json.loads(result.stdout)
        except ValueError:
            return None
        if isinstance(report, dict) and report.get("error") and report.get("intervals") == []:
            return f"iperf3: {report['error']}"
        return None

    def parse(self, stdout: str) -> list[Metric]:
        try:
            report = json.loads(stdout)
        except json.JSONDecodeError as exc:
            raise ParseError(f"iperf3 printed no JSON report ({exc.msg} at line "
                             f"{exc.lineno})") from None
        except ValueError as exc:   # a number json cannot convert (over 4,300 digits)
            raise ParseError(f"iperf3's report has an unusable value: {str(exc)[:100]}") from None
        if not isinstance(report, dict):
            raise ParseError("iperf3's report is not a JSON object")
        if report.get("error"):
            raise ParseError(f"iperf3: {report['error']}")
        end = report.get("end")
        received = _table(end, "sum_received")
        sent = _table(end, "sum_sent")
        cpu = _table(end, "cpu_utilization_percent")
        sender_cpu, receiver_cpu = ("remote_total", "host_total") if self.options.reverse \
            else ("host_total", "remote_total")
        bits = _number(received, "bits_per_second")
        if bits <= 0:
            raise ParseError("iperf3 received nothing (0 bits/s)")
        return [self.metric("throughput", bits / 1e9),
                self.metric("retransmits", _number(sent, "retransmits")),
                self.metric("sender cpu", _number(cpu, sender_cpu)),
                self.metric("receiver cpu", _number(cpu, receiver_cpu))]


def _table(parent: Any, key: str) -> dict[str, Any]:
    value = parent.get(key) if isinstance(parent, dict) else None
    if not isinstance(value, dict):
        raise ParseError(f"iperf3's report has no end.{key}")
    return value


def _number(table: dict[str, Any], key: str) -> float:
    value = table.get(key)
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not math.isfinite(value) or value < 0):
        raise ParseError(f"iperf3's report: {key} is {value!r}, not a number")
    return float(value)
