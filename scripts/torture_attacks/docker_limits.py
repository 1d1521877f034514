"""Docker limits Docker refuses or ignores (issue #35, items 3 and 4)."""

from __future__ import annotations

import json
import os
import sqlite3

from torture_kit.env import Env, Outcome, check_output, one_line_refusal
from torture_kit.registry import Attack


def docker_limits_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Issue #35, items 3 and 4: Docker limits Docker refuses (more CPUs than the host's, a
    memory limit below 6M) or rounds to no limit at all (cpu_limit = 0.0000001) are refused
    by `vmtax plan` in one line; and a limit it applies is the one the fingerprint records."""
    from vmtax.targets import docker

    cpus = len(os.sched_getaffinity(0))
    for key, value in (("cpu_limit", f"{cpus + 0.5}"), ("cpu_limit", "0.0000001"),
                       ("memory_limit", '"5M"')):
        plan = env.work / "docker-limit.toml"
        plan.write_text(f'[targets.d]\nkind = "container"\nruntime = "docker"\n{key} = {value}\n'
                        '[[workloads]]\nname = "cpu"\n')
        outcome.cases += 1
        done = env.run("plan", str(plan))
        if os.geteuid() != 0:
            outcome.note("not root: docker options are refused as such")
            return
        one_line_refusal(outcome, f"{key} = {value}", done, f"targets.d.{key}: expected")
    if quick or docker.Docker.unavailable() is not None:
        outcome.note("no limited Docker run (quick, or Docker unavailable)")
        return
    plan = env.work / "docker-limited.toml"
    plan.write_text('runs = 1\nwarmup = 0\ntime = 1\n[targets.d]\nkind = "container"\n'
                    'runtime = "docker"\ncpu_limit = 0.05\nmemory_limit = "64M"\n'
                    '[[workloads]]\nname = "cpu"\n')
    results = env.work / "docker-limited"
    done = env.run("run", str(plan), "--results", str(results))
    outcome.cases += 1
    check_output(outcome, "a Docker run with limits", done.stderr)
    try:
        with sqlite3.connect(results / "vmtax.sqlite") as db:
            (stored,), = db.execute("SELECT fingerprint FROM targets").fetchall()
        enforced = json.loads(stored)["limits"]["enforced"]
    except (sqlite3.Error, ValueError, KeyError) as exc:
        outcome.fail(f"a Docker run with limits: no limits stored ({exc}): "
                     f"{done.stderr.strip()[-200:]}")
        return
    if enforced != {"cpus": 0.05, "memory": 64 << 20}:
        outcome.fail(f"a Docker run with limits: the fingerprint says {enforced}")
    else:
        outcome.note("the limits the cgroups enforce are stored")


ATTACK = Attack(
    "Docker limits Docker refuses or ignores", "container:docker's cpu_limit, memory_limit",
    "refused by `vmtax plan` in one line; a limit applied is the one the fingerprint holds",
    docker_limits_attack)
