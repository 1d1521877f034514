"""The factory's bookkeeping with a fake target: every instance that exists is stopped, also
after a failed or interrupted start. (tests/test_factory_live.py runs real guests.)"""

import threading
import time

import pytest

from vmtax.core.errors import TargetError, VmtaxError
from vmtax.core.instance import Instance
from vmtax.studies.factory import InstanceFactory


class FakeInstance(Instance):
    def __init__(self, name):
        super().__init__(name)
        self.running = False

    def _start(self):
        self.running = True

    def stop(self):
        self.running = False

    def alive(self):
        return self.running

    def host_pids(self):
        return []


class FakeTarget:
    """make_instance: instance i takes delays[i] s; fail = {i: exception to raise};
    after = {i: j}: instance i's start waits until instance j's has begun."""

    def __init__(self, delays=None, fail=None, after=None):
        self.delays = delays or {}
        self.fail = fail or {}
        self.after = after or {}
        self.began = {i: threading.Event() for i in range(16)}
        self.made: list[FakeInstance] = []
        self.jobs = []
        self.lock = threading.Lock()

    def make_instance(self, index, network, job=None):
        self.began[index].set()
        if index in self.after:
            assert self.began[self.after[index]].wait(10)
        time.sleep(self.delays.get(index, 0))
        if index in self.fail:
            raise self.fail[index]
        instance = FakeInstance(f"fake#{index}")
        instance.start()
        with self.lock:
            self.made.append(instance)
            self.jobs.append(job)
        return instance


def test_instances_in_index_order_and_all_stopped():
    target = FakeTarget(delays={0: 0.2})
    with InstanceFactory(target, network="net") as factory:
        first = factory.start(3, parallel=3, job="serve")
        more = factory.start(2)
        assert [i.name for i in first + more] == [f"fake#{i}" for i in range(5)]
        assert factory.instances == first + more and target.jobs == ["serve"] * 3 + [None] * 2
    assert not any(i.alive() for i in target.made)
    assert factory.instances == []


def test_a_failed_start_keeps_the_others_for_stop():
    target = FakeTarget(fail={1: TargetError("no room")})
    factory = InstanceFactory(target, network="net")
    with pytest.raises(TargetError, match="no room"):
        factory.start(3, parallel=2)
    assert len(factory.instances) == 2
    factory.stop()
    assert not any(i.alive() for i in target.made)


def test_an_interrupted_start_waits_for_starts_under_way():
    # Instance 1 is still booting when the wait for instance 0 is interrupted (whatever the
    # host's load: 0 is interrupted only once 1's start has begun).
    target = FakeTarget(delays={1: 0.3}, fail={0: KeyboardInterrupt()}, after={0: 1})
    factory = InstanceFactory(target, network="net")
    with pytest.raises(KeyboardInterrupt):
        factory.start(2, parallel=2)
    assert [i.name for i in factory.instances] == ["fake#1"]
    factory.stop()
    assert not any(i.alive() for i in target.made)


def test_bad_counts():
    with pytest.raises(VmtaxError, match="both must be at least 1"):
        InstanceFactory(FakeTarget(), network="net").start(0)
