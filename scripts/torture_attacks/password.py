"""A workload's secret: in no command line, never stored (issue #29, defect 11)."""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

from torture_kit.env import Env, Outcome
from torture_kit.host import processes
from torture_kit.registry import Attack


def password_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Defect 11: a workload's secret (oltp's per-run MariaDB password) is in no command
    line and never stored. Quick: the jobs of client-server workloads and the store; else
    every workload's jobs and a real oltp run natively, every command line read while it
    runs."""
    from vmtax.core import workload as workloads
    from vmtax.core.types import Endpoint
    from vmtax.results.store import Store

    for name, cls in sorted(workloads.registered().items()):
        if quick and cls.server_port is None:
            continue    # a server's credentials are what a run makes; some prepares take s
        try:
            workload = cls.make({}, 2, strict=False)
            jobs = [*workload.prepare_jobs(), workload.run_job()]
        except Exception:   # noqa: BLE001 - a two-role workload has no run_job
            jobs = [*workload.prepare_jobs()]
        if cls.server_port is not None:
            jobs += [workload.server_job(), workload.client_job(Endpoint("127.0.0.1", 1))]
        for job in jobs:
            outcome.cases += 1
            for secret in job.secrets:
                if any(secret in arg for arg in job.argv):
                    outcome.fail(f"{name}: a secret in a command line: {job.argv[:3]}")
            if job.secrets:
                results = env.work / f"secret-{name}"
                store = Store(results)
                run_id = store.new_run({}, {}, "0")
                store.add_rep(run_id, target="native", workload=name, params={},
                              phase="measure", idx=0, status="failed", argv=[*job.argv,
                              *job.secrets], started=1.0, error=f"x {job.secrets[0]}",
                              stdout=job.secrets[0], stderr=job.secrets[0],
                              secrets=job.secrets)
                store.close()
                if job.secrets[0].encode() in (results / "vmtax.sqlite").read_bytes():
                    outcome.fail(f"{name}: a secret stored in the results database")
                outcome.note(f"{name}: secrets declared")
    if quick or not all(shutil.which(b) for b in ("mariadbd", "sysbench", "busybox")):
        return
    outcome.cases += 1
    results = env.work / "oltp-r"
    proc = env.start("run", "--targets", "native", "--workloads", "oltp", "--runs", "1",
                     "--warmup", "0", "--time", "1", "--results", str(results))
    seen_cmdlines, passwords = set(), set()
    while proc.poll() is None:
        for pid, (_, _, cmd) in processes().items():
            seen_cmdlines.add(cmd)
            with contextlib.suppress(OSError):
                for var in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    if var.startswith(b"VMTAX_DB_PASSWORD="):
                        passwords.add(var.split(b"=", 1)[1].decode())
        time.sleep(0.05)
    proc.communicate()
    data = (results / "vmtax.sqlite").read_bytes() if (results / "vmtax.sqlite").exists() \
        else b""
    for password in passwords:
        if any(password in cmd for cmd in seen_cmdlines):
            outcome.fail("oltp: the password was in a command line during the run")
        if password.encode() in data:
            outcome.fail("oltp: the password is stored in the results database")
    outcome.note(f"oltp run: {len(passwords)} password(s) seen in environments only")


ATTACK = Attack(
    "a workload's password", "every workload's jobs, the store; a real oltp run",
    "a secret is in no command line and not in the results database", password_attack)
