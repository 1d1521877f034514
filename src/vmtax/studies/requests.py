"""What a study is asked to do, as the command line parsed it: typed records that a study
reads and the CLI builds. They import nothing of vmtax, so any part may name them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FleetRequest:
    """`vmtax run --fleet HEAD`: where, on which hosts, how the plan is spread."""
    address: str | None            # None with --hosts/--spread alone: refused by the study
    hosts: list[str] | None = None   # None: every host
    spread: str | None = None        # "hosts" | "cells"; None: "hosts"


@dataclass(frozen=True)
class RunRequest:
    """`vmtax run`: a plan file, a resumed run, or the classic plan shaped by names and
    settings. runs/max_runs/ci_target are already checked (--runs N or auto)."""
    plan_file: str | None = None
    quick: bool = False
    resume: str | None = None
    targets: list[str] | None = None       # None: the classic plan's
    workloads: list[str] | None = None     # None: the classic plan's
    target_options: dict[str, list[str]] = field(default_factory=dict)   # cli=True flags
    runs: int = 5
    max_runs: int | None = None            # set: --runs auto (runs is then --min-runs)
    ci_target: float | None = None         # with max_runs: wanted half-width, a fraction
    warmup: int = 1
    time: int | None = None
    collect: list[str] = field(default_factory=list)
    interleave: bool = True
    name: str | None = None
    fleet: FleetRequest | None = None
