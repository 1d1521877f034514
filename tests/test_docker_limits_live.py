"""Live: container:docker's limits on the real dockerd (issue #35, items 3 and 4). What the
fingerprint records is what the container's cgroups enforce; a refusal reaches the user in
Docker's words; a limit Docker would not apply (past the plan check) stops the run."""

import json
import os
import sqlite3

import pytest
from conftest import processes, vmtax
from test_docker_live import leftovers, pytestmark  # noqa: F401 - Docker's live marks

from vmtax.core.errors import VmtaxError
from vmtax.core.target import TargetContext
from vmtax.guest import rootfs
from vmtax.host.journal import Journal
from vmtax.targets import docker


PLAN = """\
runs = 1
warmup = 0
time = 1

[targets.limited]
kind = "container"
runtime = "docker"
cpu_limit = 0.05
memory_limit = "32M"

[[workloads]]
name = "cpu"
"""


def test_the_fingerprint_records_the_limits_the_cgroups_enforce(tmp_path):
    dockerds = processes("dockerd")
    plan = tmp_path / "limited.toml"
    plan.write_text(PLAN)
    done = vmtax("run", str(plan), "--results", str(tmp_path / "results"), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    with sqlite3.connect(tmp_path / "results" / "vmtax.sqlite") as db:
        (stored,), = db.execute("SELECT fingerprint FROM targets").fetchall()
        # Measured within them (6M made sysbench thrash until its job's timeout: ~45 s).
        assert db.execute("SELECT status FROM reps WHERE phase = 'measure'").fetchall() == [
            ("ok",)]
    limits = json.loads(stored)["limits"]
    assert limits["enforced"] == {"cpus": 0.05, "memory": 32 << 20}
    assert limits["docker"]["NanoCpus"] == 50_000_000 and limits["docker"]["Memory"] == 32 << 20
    assert leftovers(dockerds) == []


class Unchecked:
    """A target's options as if the plan check had let them through."""

    def __init__(self, **values):
        self.given = {"network": "host", **values}

    def values(self):
        return self.given


@pytest.mark.parametrize("cpu_limit, said", [
    (len(os.sched_getaffinity(0)) + 1.0, "Error response from daemon: Range of CPUs is from"),
    (0.0000001, "cpu_limit 1e-07 asked for, but the container's cgroup enforces no limit"),
])
def test_what_docker_refuses_or_ignores_past_the_plan_check_stops_the_target(tmp_path,
                                                                             cpu_limit, said):
    dockerds = processes("dockerd")
    journal = Journal(tmp_path / "journal")
    made = docker.Docker(docker.Docker.locate(), tmp_path)
    ctx = TargetContext(work_dir=tmp_path, journal=journal)
    journal.add(type="rmdir", paths=made.cgroup_dirs())    # as the container target does
    try:
        with pytest.raises(VmtaxError, match=said):
            made.attach(ctx, Unchecked(cpu_limit=cpu_limit), rootfs.build([]))
    finally:
        made.detach()
        journal.undo_all()
    assert leftovers(dockerds) == []
