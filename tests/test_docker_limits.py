"""container:docker's CPU and memory limits (issue #35, items 3 and 4): what Docker would
refuse, or not apply, is refused when the plan is checked; what it refuses anyway is told in
its own words; what it applied is what the fingerprint records."""

import json
import os
from pathlib import Path

import pytest

from vmtax.core import plugin
from vmtax.core import target as targets
from vmtax.core.errors import VmtaxError
from vmtax.host.proc import Completed
from vmtax.targets import docker

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="container options need root")


def build(**options):
    return plugin.build(targets.get("container").Options, {"runtime": "docker", **options},
                        "c", strict=False)


@root_only
@pytest.mark.parametrize("key, value, expected", [
    ("cpu_limit", 2.5, "from 0.01 to 2 CPUs"),           # Docker: "Range of CPUs is ..."
    ("cpu_limit", 0.0000001, "from 0.01 to 2 CPUs"),     # ran unthrottled
    ("cpu_limit", 0.009, "from 0.01 to 2 CPUs"),         # a quota below the kernel's 1 ms
    ("cpu_limit", 0.0123456789012, "at most 9 decimal places"),
    ("memory_limit", "5M", "at least 6M"),
    ("memory_limit", "6143K", "at least 6M"),
])
def test_what_docker_refuses_or_ignores_is_refused_by_the_plan_check(monkeypatch, key, value,
                                                                     expected):
    monkeypatch.setattr(docker.os, "sched_getaffinity", lambda pid: {0, 1})
    with pytest.raises(VmtaxError, match=f"c: {key}: expected {expected}"):
        build(**{key: value})


@root_only
@pytest.mark.parametrize("key, value", [("cpu_limit", 0.01), ("cpu_limit", 2),
                                        ("cpu_limit", 0.123456789), ("memory_limit", "6M"),
                                        ("memory_limit", "6144K")])
def test_what_docker_applies_passes(monkeypatch, key, value):
    monkeypatch.setattr(docker.os, "sched_getaffinity", lambda pid: {0, 1})
    assert build(**{key: value}).values()[key] == value


def test_a_refusal_is_told_in_the_engines_own_words(monkeypatch):
    said = ("docker: Error response from daemon: Range of CPUs is from 0.01 to 2.00, as "
            "there are only 2 CPUs available.\n\nRun 'docker run --help' for more "
            "information\n")
    monkeypatch.setattr(docker, "docker", lambda *a, **k: Completed(125, "", said, 0.1, False))
    with pytest.raises(VmtaxError) as refused:
        docker.must("starting the job container", "run", "x")
    assert str(refused.value) == (
        "docker: starting the job container failed: docker: Error response from daemon: "
        "Range of CPUs is from 0.01 to 2.00, as there are only 2 CPUs available. | "
        "Run 'docker run --help' for more information")


def fake_cgroups(monkeypatch, tmp_path, files: dict[str, str], v2: bool) -> None:
    """A container's cgroups: in one v2 hierarchy, or in v1's cpu and memory ones."""
    hierarchies = ([(str(tmp_path), frozenset([""]))] if v2 else
                   [(str(tmp_path / "cpu"), frozenset(["cpu", "cpuacct"])),
                    (str(tmp_path / "memory"), frozenset(["memory"]))])
    monkeypatch.setattr(docker.runtime_cgroup, "hierarchies", lambda: hierarchies)
    monkeypatch.setattr(docker.runtime_cgroup, "own_cgroups",
                        lambda path: {controllers: "/vmtax-docker-x/c"
                                      for _, controllers in hierarchies})
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


@pytest.mark.parametrize("v2, files, expected", [
    (False, {"cpu/vmtax-docker-x/c/cpu.cfs_quota_us": "5000",
             "cpu/vmtax-docker-x/c/cpu.cfs_period_us": "100000",
             "memory/vmtax-docker-x/c/memory.limit_in_bytes": "9223372036854771712"},
     {"cpus": 0.05, "memory": None}),
    (False, {"cpu/vmtax-docker-x/c/cpu.cfs_quota_us": "-1",
             "cpu/vmtax-docker-x/c/cpu.cfs_period_us": "100000",
             "memory/vmtax-docker-x/c/memory.limit_in_bytes": "6291456"},
     {"cpus": None, "memory": 6291456}),
    (True, {"vmtax-docker-x/c/cpu.max": "250000 100000",
            "vmtax-docker-x/c/memory.max": "max"}, {"cpus": 2.5, "memory": None}),
    (True, {"vmtax-docker-x/c/cpu.max": "max 100000",
            "vmtax-docker-x/c/memory.max": "6291456"}, {"cpus": None, "memory": 6291456}),
])
def test_the_enforced_limits_are_read_from_the_containers_cgroups(monkeypatch, tmp_path, v2,
                                                                  files, expected):
    fake_cgroups(monkeypatch, tmp_path, files, v2)
    assert docker.enforced(1234) == expected


def attached(tmp_path: Path, monkeypatch, host_config: dict, enforced: dict,
             **settings) -> docker.Docker:
    made = docker.Docker("/usr/bin/docker", tmp_path)
    made.settings = {"cpu_limit": None, "memory_limit": None, **settings}
    monkeypatch.setattr(docker, "must", lambda *a, **k: json.dumps(host_config))
    monkeypatch.setattr(docker, "enforced", lambda pid: enforced)
    return made


def test_a_cpu_limit_docker_did_not_apply_is_never_measured_as_if_it_had(tmp_path,
                                                                          monkeypatch):
    # --cpus=0.0000001: Docker keeps NanoCpus=100, and the quota it derives rounds to none.
    made = attached(tmp_path, monkeypatch, {"NanoCpus": 100, "CpuQuota": 0, "CpuPeriod": 0},
                    {"cpus": None, "memory": None}, cpu_limit=0.0000001)
    with pytest.raises(VmtaxError, match="cpu_limit 1e-07 asked for, but the container's "
                                         "cgroup enforces no limit"):
        made.applied_limits("vmtax-0123abcd", 1234)


def test_the_fingerprint_records_the_limits_docker_applied(tmp_path, monkeypatch):
    config = {"NanoCpus": 50_000_000, "CpuQuota": 0, "CpuPeriod": 0, "CpusetCpus": "",
              "Memory": 6291456, "MemorySwap": 12582912}
    made = attached(tmp_path, monkeypatch, config, {"cpus": 0.05, "memory": 6291456},
                    cpu_limit=0.05, memory_limit="6M")
    assert made.applied_limits("vmtax-0123abcd", 1234) == {
        "docker": config, "enforced": {"cpus": 0.05, "memory": 6291456}}
    made = attached(tmp_path, monkeypatch, config, {"cpus": 0.05, "memory": None},
                    cpu_limit=0.05, memory_limit="6M")
    with pytest.raises(VmtaxError, match="memory_limit 6M asked for, but the container's "
                                         "cgroup enforces no limit"):
        made.applied_limits("vmtax-0123abcd", 1234)
