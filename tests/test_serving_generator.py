"""The generator collector: the CPU time of a client-server workload's client on the host,
as the runner counts it, between the cell's first and last measured repetitions."""

import pytest

from vmtax.collectors.generator import Generator
from vmtax.core import plugin
from vmtax.core.collector import CollectorError, HostClient, Subject
from vmtax.host.journal import Journal


def _collector(tmp_path) -> Generator:
    return Generator(plugin.build(Generator.Options, {}, "generator"),
                     journal=Journal(tmp_path / "journal"), scratch=tmp_path)


def test_records_the_client_runs_between_start_and_stop(tmp_path):
    client = HostClient()
    client.add(5.0, 1.0, 10.0)            # a warm-up, before the collector started
    subject = Subject(kind="vm", name="vm", host_client=client)
    assert Generator.unavailable(subject) is None
    collector = _collector(tmp_path)
    collector.start(subject)
    client.add(0.6, 0.2, 2.0)
    client.add(0.3, 0.1, 2.0)
    by_name = {m.name: m for m in collector.stop()}
    assert by_name["generator cpu user"].value == pytest.approx(0.9)
    assert by_name["generator cpu system"].value == pytest.approx(0.3)
    assert by_name["generator cpu time"].value == pytest.approx(1.2)
    assert by_name["generator load"].value == pytest.approx(30.0)
    assert by_name["generator load"].unit == "%"


def test_without_a_client_on_the_host(tmp_path):
    subject = Subject(kind="native", name="native")
    assert "no client on the host" in Generator.unavailable(subject)
    collector = _collector(tmp_path)
    with pytest.raises(CollectorError, match="no client on the host"):
        collector.start(subject)
    collector.abort()
    idle = _collector(tmp_path)
    idle.start(Subject(kind="native", name="native", host_client=HostClient()))
    with pytest.raises(CollectorError, match="did not run"):
        idle.stop()
