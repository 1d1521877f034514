"""What a study is asked to do, as the command line parsed it: typed records that a study
reads and the CLI builds. They import nothing of vmtax, so any part may name them.

Each field that a flag sets declares it (`flag`): its help, how the CLI reads it (`kind`:
a comma-separated list, a count, whole seconds, a percentage, a choice, an on/off flag, or
the negation of one), and what the request is when it does something (`takes`: the classic
plan shaped by flags, a plan file, a resumed run): given where it would do nothing, it is
refused, never ignored. `vmtax run`'s options are generated from these declarations
(vmtax.cli.run_flags), beside the target options plugins mark cli=True (which shape the
classic plan only); a field without one (target_options, fleet) is filled from flags of
its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# How the CLI reads a flag's value: the words of its `kind` (vmtax.cli.run_flags maps each
# to a click type).
Kind = Literal["text", "list", "count", "count0", "whole seconds", "percent", "choice",
               "on", "off", "argument"]
# What a run request is: the classic plan shaped by its flags, a plan file's, a resumed
# run's (its own plan, as it was stored).
Form = Literal["classic", "plan", "resume"]
EVERY_FORM: tuple[Form, ...] = ("classic", "plan", "resume")


def flag(default: Any, help: str, *, kind: Kind = "text", name: str | None = None,
         metavar: str | None = None, choices: tuple[str, ...] = (),
         default_text: str | None = None, aliases: tuple[str, ...] = (),
         takes: tuple[Form, ...] = ("classic",)) -> Any:
    """A field that a flag sets: `--NAME` (the field's name with dashes; `name` to say
    another), its help, how its value is read (kind), where the default is no literal value
    (a plan's) the words its help gives for it (default_text), and the forms of request it
    does something in (takes)."""
    metadata = {"flag": {"help": help, "kind": kind, "name": name, "metavar": metavar,
                         "choices": choices, "default_text": default_text, "aliases": aliases,
                         "takes": takes}}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class FleetRequest:
    """`vmtax run --fleet HEAD`: where, on which hosts, how the plan is spread."""
    # None with --hosts/--spread alone: refused by the study.
    address: str | None = flag(None, "Run on the fleet at HEAD_ADDRESS (`vmtax fleet "
                               "start`), not here.", name="fleet", metavar="HEAD_ADDRESS",
                               takes=EVERY_FORM)
    hosts: list[str] | None = flag(None, "With --fleet: the hosts to run on. [default: all]",
                                   kind="list", metavar="all|NAME,...",
                                   takes=EVERY_FORM)   # None: every host
    spread: str | None = flag(None, "With --fleet: the whole plan on every host, or its "
                              "cells spread over identical hosts. [default: hosts]",
                              kind="choice", choices=("hosts", "cells"),
                              takes=EVERY_FORM)   # None: "hosts"


@dataclass(frozen=True)
class RunRequest:
    """`vmtax run`: a plan file, a resumed run, or the classic plan shaped by names and
    settings. runs is a count, or "auto": repeat from min_runs to max_runs until the
    median's CI is within ci_target percent."""
    plan_file: str | None = flag(None, "", kind="argument", metavar="[PLAN.toml]",
                                 takes=("plan",))
    targets: list[str] | None = flag(   # None: the classic plan's
        None, "Comma-separated targets, KIND or KIND:VARIANT (`vmtax list targets`).",
        kind="list", metavar="NAME,...", default_text="those of plans/classic.toml")
    workloads: list[str] | None = flag(   # None: the classic plan's
        None, "Comma-separated workloads (`vmtax list workloads`).", kind="list",
        metavar="NAME,...", default_text="those of plans/classic.toml")
    runs: int | Literal["auto"] = flag(
        5, "Measured repetitions per target and workload; 'auto' repeats until the median's "
        "95% CI is within --ci-target (between --min-runs and --max-runs).", metavar="N|auto")
    min_runs: int = flag(5, "With --runs auto: runs before precision is judged.", kind="count")
    max_runs: int = flag(20, "With --runs auto: give up (and flag it) after this many runs.",
                         kind="count")
    ci_target: float = flag(2.0, "With --runs auto: wanted CI half-width, percent of the "
                            "median.", kind="percent", metavar="PCT")
    warmup: int = flag(1, "Warm-up repetitions run first and discarded.", kind="count0")
    time: int | None = flag(None, "Seconds each time-bounded workload runs (its declared time "
                            "option).", kind="whole seconds")
    # The target options plugins mark cli=True (--vcpus, --qemu, ...), by option.
    target_options: dict[str, list[str]] = field(default_factory=dict)
    collect: list[str] = flag(
        [], "Collectors recording on the host around each cell's measured repetitions, e.g. "
        "host-cpu,host-mem (`vmtax list collectors`).", kind="list", metavar="NAME,...",
        takes=("classic", "plan"))
    interleave: bool = flag(True, "Run all repetitions of one target before the next "
                            "(default: A B B A order).", kind="off", name="no-interleave")
    resume: str | None = flag(None, "Continue an interrupted run, skipping what it stored "
                              "(its own plan: no flag shapes it).", metavar="RUN_ID",
                              takes=("resume",))
    quick: bool = flag(False, "With PLAN.toml: run its short [quick] form.", kind="on",
                       takes=("plan",))
    name: str | None = flag(None, "Name the run: NAME then works wherever a run id does (the "
                            "latest run of that name), e.g. vmtax compare baseline NAME.",
                            metavar="NAME", takes=("classic", "plan"))
    fleet: FleetRequest | None = None     # set by its own flags (FleetRequest's)

    @property
    def form(self) -> Form:
        return "resume" if self.resume else "plan" if self.plan_file else "classic"

    @property
    def adaptive(self) -> bool:
        """--runs auto: repeat until precise enough."""
        return self.runs == "auto"
