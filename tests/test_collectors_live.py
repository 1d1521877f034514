"""Collectors against real processes: host-cpu sees a busy loop's CPU time (from /proc and
from a real cgroup v1 cpuacct group), host-mem sees memory a process allocated."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from vmtax.collectors.host_cpu import HostCpu
from vmtax.collectors.host_mem import HostMem
from vmtax.core import plugin
from vmtax.core.collector import Subject
from vmtax.host.journal import Journal

pytestmark = pytest.mark.live

# Burns one second of its own CPU time (not wall time: other tests may share the CPUs),
# says so, then waits for stdin to close, so it is still there when the collector stops.
# It reads its CPU clock seldom: that clock is a system call, which would be system time.
BUSY = """
import sys, time
while time.process_time() < 1.0:
    for _ in range(100_000):
        pass
print("done", flush=True)
sys.stdin.read()
"""

# Allocates and touches 50 MiB when told ("hold"), or allocates it and frees it again
# ("peak"), then waits for stdin to close.
ALLOCATE = """
import sys, time
mode = sys.stdin.readline().strip()
block = b"\\1" * (50 << 20)
if mode == "peak":
    time.sleep(0.5)
    del block
print("done", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def child():
    started = []

    def start(code: str) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
        started.append(p)
        return p
    yield start
    for p in started:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


@pytest.fixture
def make(tmp_path):
    def make(cls, **params):
        return cls(plugin.build(cls.Options, params, cls.name),
                   journal=Journal(tmp_path), scratch=tmp_path)
    return make


def values(metrics):
    return {m.key: m.value for m in metrics}


def test_host_cpu_of_a_busy_process_is_its_cpu_time(child, make):
    p = child(BUSY)
    c = make(HostCpu)
    c.start(Subject(kind="native", name="native", pids=[p.pid]))
    assert p.stdout.readline() == "done\n"
    got = values(c.stop())
    # Python's start-up (~0.03 s) may fall before or after start(); ticks are 10 ms.
    assert got["host cpu"] == pytest.approx(1.0, abs=0.15)
    assert got["host cpu user"] > 0.8 and got["host cpu system"] < 0.2
    assert c.warnings == []


CPUACCT = Path("/sys/fs/cgroup/cpuacct")


@pytest.mark.skipif(os.geteuid() != 0 or not (CPUACCT / "cpuacct.usage_user").exists(),
                    reason="needs root and a cgroup v1 cpuacct hierarchy")
def test_host_cpu_from_a_cgroup_counts_processes_that_came_and_went(child, make):
    # The busy loop runs in a child of the observed process, started once that is in the
    # cgroup: invisible in the /proc/PID/stat of the pid given, counted by the cgroup.
    p = child("import subprocess, sys\n"
              "sys.stdin.readline()\n"
              f"subprocess.run([sys.executable, '-c', {BUSY!r}], stdin=subprocess.DEVNULL)\n"
              "sys.stdin.read()\n")
    group = CPUACCT / f"vmtax-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(p.pid))
        c = make(HostCpu)
        c.start(Subject(kind="container", name="container", pids=[p.pid],
                        cgroup="/" + group.name))
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline() == "done\n"
        got = values(c.stop())
        assert got["host cpu"] == pytest.approx(1.0, abs=0.2) and got["host cpu user"] > 0.8
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        # The busy child, if still there, leaves the cgroup once init has reaped it.
        deadline = time.monotonic() + 5
        while group.exists():
            try:
                group.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)


def test_host_mem_sees_50_mib_a_process_holds(child, make):
    p = child(ALLOCATE)
    c = make(HostMem)
    p.stdin.write("hold\n")
    p.stdin.flush()
    assert p.stdout.readline() == "done\n"
    c.start(Subject(kind="native", name="native", pids=[p.pid]))
    got = values(c.stop())
    assert got["host rss"] >= 50 and got["host pss"] >= 50 and got["host pss peak"] >= 50


def test_host_mem_peak_catches_memory_freed_before_stop(child, make):
    p = child(ALLOCATE)
    c = make(HostMem, interval=0.1)
    c.start(Subject(kind="native", name="native", pids=[p.pid]))
    p.stdin.write("peak\n")
    p.stdin.flush()
    assert p.stdout.readline() == "done\n"
    got = values(c.stop())
    assert got["host pss peak"] >= 50 > got["host pss"]
