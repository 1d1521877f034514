"""The session every study runs in: `run` (the runner), `density` and `boot`.

A study's plan names its targets as `TargetSpec`s, each checked against its kind's
options through the contract (`check_target`) before anything is made. In a session
(`session`) the study then has a private work directory and the target context, creates
its targets through the contract's registry, stores one run with the host's fingerprint
and each target's, and on the way out (normal end, an error, Ctrl-C) cleans up every
target, the network and whatever else the journal lists, and finishes the run with its
status. What a study does between those steps is its own.

    with session(store, journal, binaries=("nginx",), serves=True) as s:
        target = s.create(spec)
        s.new_run(plan)
        ...
        s.store_fingerprint(spec.name)
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from vmtax import __version__
from vmtax.core import paths, plugin
from vmtax.core import target as target_registry
from vmtax.core.errors import VmtaxError
from vmtax.core.target import Target, TargetContext
from vmtax.host import binary, guardian
from vmtax.host import machine as host
from vmtax.host.journal import Journal, recover
from vmtax.host.network import Network
from vmtax.results.store import Store
from vmtax.studies.plan import TargetSpec


def check_target(spec: TargetSpec, owner: str | None = None) -> plugin.Options:
    """The spec's options as its kind reads them; VmtaxError names the first problem as
    `OWNER: KEY: expected …` (owner: the spec's name unless given)."""
    return plugin.build(target_registry.get(spec.kind).Options, spec.options,
                        spec.name if owner is None else owner, strict=False, kind=spec.kind)


@dataclass
class Session:
    """What one study has made: its targets and its stored run."""
    store: Store
    journal: Journal
    ctx: TargetContext
    # Undo the journal before the targets clean up (see close()).
    undo_first: bool = False
    targets: dict[str, Target] = field(default_factory=dict)
    run_id: str | None = None
    # Told each record as it is stored (vmtax.studies.runner.EventSink): ("run", ...),
    # ("target", ...); None: nobody listens.
    on_stored: Callable[[str, dict[str, Any]], None] | None = None

    @property
    def work_dir(self) -> Path:
        return self.ctx.work_dir

    @property
    def network(self) -> Any:
        """The session's network (vmtax.host.network.Network), made on first use."""
        return self.ctx.shared_network()

    def create(self, spec: TargetSpec) -> Target:
        """The target of spec, through the registry, not yet prepared; cleaned up with the
        session."""
        target = target_registry.create(spec.name, spec.kind, spec.options, self.ctx,
                                        spec.written)
        self.targets[spec.name] = target
        return target

    def new_run(self, plan: dict[str, Any]) -> str:
        """Store a new run of plan (as stored: `vmtax show` reads it) on this host."""
        fingerprint = host.fingerprint()
        self.run_id = self.store.new_run(plan, fingerprint, __version__)
        if self.on_stored is not None:
            self.on_stored("run", {"local_run": self.run_id, "fingerprint": fingerprint})
        return self.run_id

    def reopen_run(self, run_id: str) -> None:
        """Go on storing into run_id (a resumed run)."""
        self.store.reopen_run(run_id)
        self.run_id = run_id

    @property
    def stored_run(self) -> str:
        """The id of the run being stored."""
        if self.run_id is None:
            raise VmtaxError("no run is stored yet")
        return self.run_id

    def store_fingerprint(self, name: str) -> None:
        target = self.targets[name]
        try:
            found = target.fingerprint()
        except VmtaxError as exc:   # a target that never came up still has its kind
            found = {"kind": target.kind, "error": str(exc)}
        fingerprint = {**found, "bare_host": target.bare_host,
                       **({"programs": programs} if (programs := self._programs()) else {})}
        if host.lab():
            # Every target in a lab is nested under TCG; its "bare host" is the lab's own
            # system (a TCG guest), never hardware: the baseline still (lab_host).
            fingerprint.update(lab=host.lab(), bare_host=False,
                               **({"lab_host": True} if target.bare_host else {}))
        self.store.set_target(self.stored_run, name, target.kind, fingerprint)
        if self.on_stored is not None:
            self.on_stored("target", {"name": name, "kind": target.kind,
                                      "fingerprint": fingerprint})

    def _programs(self) -> dict[str, str | None]:
        """What each workload program every target runs is (the host's own, carried into
        containers and guests): its sha256's first 16 digits, so a rebuild at the same
        path with the same version string is told apart."""
        return {name: binary.short_id(path) for name in self.ctx.binaries
                if (path := shutil.which(name)) is not None}

    def store_fingerprints(self) -> None:
        for name in self.targets:
            self.store_fingerprint(name)

    def close(self, status: str) -> list[str]:
        """Clean up every target, remove the network, undo the journal (the work
        directory, anything a target left); finish the run with status. Returns why each
        change that could not be undone was not: those stay journaled, to be retried.

        With undo_first, the journal is undone first, newest first: an instance still
        starting when a study of instances was interrupted is known to the journal alone,
        and its runtime's state must still be there when it is deleted (a target's cleanup
        removes that state); the targets' cleanups then find little left, and may fail.
        Otherwise each target cleans up first; one that fails (a container its runtime is
        still stopping) leaves the rest of its changes journaled, and the journal's undo,
        newest first, retries them in order."""
        try:
            if self.undo_first:
                self.journal.undo_all()
            for cleanup in [t.cleanup for t in self.targets.values()] + (
                    [self.ctx.network.destroy] if self.ctx.network is not None else []):
                with contextlib.suppress(Exception):
                    cleanup()
            return self.journal.undo_all()
        finally:
            if self.run_id is not None:
                self.store.finish_run(self.run_id, status)


@contextlib.contextmanager
def session(store: Store, own: Journal, *, binaries: tuple[str, ...] = (),
            trees: tuple[Path, ...] = (), serves: bool = False,
            undo_first: bool = False,
            on_stored: Callable[[str, dict[str, Any]], None] | None = None
            ) -> Iterator[Session]:
    """A session storing into store, its host changes in the journal own; the run it
    stores is finished "done", "interrupted" (Ctrl-C) or "failed" as the block ends.
    binaries, trees, serves: what the targets must carry (TargetContext); on_stored: told
    the run and each target's fingerprint as they are stored."""
    # Absolute: runtimes resolve paths from their own working directories, and a
    # relative one once made runc fail and the container fall back to unshare.
    # Journaled before it is made: a journal that cannot be written stops the study here.
    work_dir, _ = own.make_dir(paths.work_parent(store.dir).resolve(), ".work-")
    ctx = TargetContext(work_dir=work_dir, journal=own, binaries=binaries, trees=trees,
                        serves=serves, make_network=lambda: Network(own).create())
    current = Session(store, own, ctx, undo_first, on_stored=on_stored)
    status = "failed"
    try:
        yield current
        status = "done"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        # What failed is raised as it is; what could not be undone besides stays journaled
        # (the guardian retries it at exit, `vmtax cleanup` after).
        failed = current.close(status)
    if failed:
        raise VmtaxError(f"{len(failed)} host change(s) could not be undone, first "
                         f"{failed[0][:300]}; kept in the undo journal: vmtax's guardian "
                         "retries at exit, `vmtax cleanup` after")


@contextlib.contextmanager
def guarded_journal(recovered: Callable[[str], None]) -> Iterator[Journal]:
    """A new journal, with a guardian that undoes it should vmtax be killed, after what
    crashed runs left behind was undone (each said to recovered)."""
    for line in recover():
        recovered(line)
    own = Journal()
    with guardian.guard(own.path):
        yield own
