"""A guest that stops answering is killed at its timeout, the repetition is stored as a
timeout, the guest is booted again and the plan goes on."""

import itertools

import pytest
from conftest import warnings_reporter

from vmtax.core import plugin
from vmtax.core.errors import ParseError
from vmtax.core.target import Job
from vmtax.core.types import MetricSpec
from vmtax.core.workload import Workload
from vmtax.results.store import Store
from vmtax.studies import plan as plan_mod
from vmtax.studies.runner import Runner
from vmtax.guest import vmm_guest

pytestmark = pytest.mark.live


class FreezeOnce(Workload):
    """The second repetition hangs the guest agent: it kills the agent's watchdog (the
    pattern [w]atchdog does not match its own command line) and outlives its timeout, so
    the agent never answers — what a hung guest looks like from the host. The others
    print a number."""
    name = "freeze-once-test"
    metrics = (MetricSpec("value", "u", True, primary=True),)
    calls = itertools.count()

    def run_job(self):
        if next(self.calls) == 1:
            return Job(["sh", "-c", "sleep 0.5; for p in /proc/[0-9]*; do "
                        "tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q '[w]atchdog' "
                        "&& kill -KILL ${p#/proc/}; done; sleep 60"], timeout=2)
        return Job(["echo", "7"], timeout=10)

    def parse(self, stdout):
        try:
            return [self.metric("value", float(stdout))]
        except ValueError:
            raise ParseError("no number") from None


def test_hung_guest_is_killed_rebooted_and_the_plan_goes_on(tmp_path, monkeypatch):
    monkeypatch.setitem(plugin.registry()["workload"], FreezeOnce.name, FreezeOnce)
    monkeypatch.setattr(vmm_guest, "HOST_MARGIN", 2.0)   # the host's grace beyond the job timeout
    reporter = warnings_reporter()
    store = Store(tmp_path)
    plan = plan_mod.Plan(targets=plan_mod.target_specs(["vm:tcg"], {}),
                         workloads=[plan_mod.WorkloadSpec(FreezeOnce.name)],
                         runs=4, warmup=0, time=None)
    run = store.load_run(Runner(plan, store, reporter).execute())
    assert [(r.idx, r.status) for r in run.reps] == [
        (0, "ok"), (1, "timeout"), (2, "ok"), (3, "ok")]
    assert run.reps[1].error.startswith("timed out after 2 s")
    assert run.reps[1].host_elapsed >= 4   # the job's 2 s, then the host's 2 s of grace
    assert any("stopped responding" in w and "restarting it" in w for w in reporter.lines)
    assert run.status == "done"
    # Both guests' boot times are stored: the first, and the one that replaced it.
    boots = run.targets["vm:tcg"]["fingerprint"]["boots_seconds"]
    assert len(boots) == 2 and all(b > 0 for b in boots)
