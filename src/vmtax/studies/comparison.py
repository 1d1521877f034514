"""The comparison study, `vmtax run`: the plan a RunRequest asks for, run under a guarded
journal with the host's quiet checked around it, analysed once into the RunModel every view
renders. The CLI parses the request, calls this and renders the model."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, ContextManager, NoReturn

from vmtax.analysis.model import RunModel, analyse
from vmtax.core import hints
from vmtax.core.errors import VmtaxError
from vmtax.results.store import Store
from vmtax.studies import plan as plan_mod
from vmtax.studies.requests import RunRequest
from vmtax.studies.runner import Reporter

# Makes the run's progress: (the plan's estimated seconds, repetitions per cell, lines to
# say before the first step).
Progress = Callable[[float | None, int, list[str]], ContextManager[Reporter]]


def plan_of(request: RunRequest, store: Store | None = None) -> plan_mod.Plan:
    """The plan request asks for: a resumed run's (from store), a plan file's, or the
    classic plan shaped by the request's names and settings."""
    if request.quick and not request.plan_file:
        raise VmtaxError("--quick runs a plan file's [quick] form: give the plan file")
    if request.resume:
        if store is None:
            raise VmtaxError("--resume: no results store to resume from")
        resumed = store.load_run(request.resume)
        _resumable_here(resumed.id, resumed.host, store.dir)
        the_plan = plan_mod.Plan.from_dict(resumed.plan)
    elif request.plan_file:
        from vmtax.studies import planfile
        the_plan = planfile.load(request.plan_file, request.quick)
        if request.collect:
            the_plan.collect = list(dict.fromkeys([*the_plan.collect, *request.collect]))
            the_plan.__post_init__()
    else:
        classic_targets, classic_workloads = plan_mod.classic_names()
        repetitions = (dict(runs=request.min_runs, max_runs=request.max_runs,
                            ci_target=request.ci_target / 100) if request.adaptive else
                       dict(runs=request.runs))
        the_plan = plan_mod.from_names(
            request.targets or classic_targets, request.workloads or classic_workloads,
            request.target_options, warmup=request.warmup, time=request.time,
            **repetitions, interleave=request.interleave, collect=request.collect)
    if request.name is not None:
        the_plan.name = request.name
    return the_plan


def _resumable_here(run_id: str, host: dict[str, Any], results: Path) -> None:
    """A run is resumed where it was made: a lab's in a lab, a host's on a host, so that no
    run mixes nested numbers with a host's."""
    from vmtax.host import machine

    made_in_lab, here = host.get("lab"), machine.lab()
    if made_in_lab and not here:
        again = hints.command("lab", "--results", results, "run", "--resume", run_id)
        raise VmtaxError(f"run {run_id} was made in a lab ({made_in_lab}): resume it in one, "
                         f"`{again}`")
    if here and not made_in_lab:
        raise VmtaxError(f"run {run_id} was made on a host, not in a lab: resume it there "
                         "(vmtax run --resume, without vmtax lab)")


def run(the_plan: plan_mod.Plan, store: Store, resume: str | None, progress: Progress,
        recovered: Callable[[str], None],
        stopped: Callable[[str | None], NoReturn]) -> RunModel:
    """Run the_plan into store (resume: go on with that run), the host's changes under a
    guarded journal (what crashed runs left is undone first, each said to recovered). A
    Ctrl-C or SIGTERM ends in stopped(the run stored so far, None before the first).
    Returns the run analysed."""
    from vmtax.host import quiet
    from vmtax.studies import estimate
    from vmtax.studies.runner import Runner
    from vmtax.studies.session import guarded_journal

    with guarded_journal(recovered) as own:
        before = quiet.snapshot()
        with progress(estimate.estimate(the_plan).seconds, the_plan.warmup + the_plan.runs,
                      [f"host not quiet: {p}" for p in quiet.problems(before)]) as reporter:
            runner = Runner(the_plan, store, reporter, resume=resume, journal=own)
            try:
                run_id = runner.execute()
                store.set_host_quiet(run_id, before, quiet.snapshot(interval=None))
            except KeyboardInterrupt:
                stopped(runner.run_id)
    return analyse(store.load_run(run_id), runner.summary)
