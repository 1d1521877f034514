"""`vmtax run`'s flags: the target flags each kind declares (cli=True options), made only
when run's options are first needed, and the RunRequest the parsed flags make, which is
what the command gets (with RunOutput, how to show the result), never the flags one by
one; and the comma-separated lists it and other commands take (`csv_list`)."""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable

import click

from vmtax.core.errors import VmtaxError
from vmtax.core.limits import MAX_COUNT

if TYPE_CHECKING:
    from vmtax.studies.requests import RunRequest


def csv_list(value: str | None, flag: str) -> list[str] | None:
    """A comma-separated list; None when the flag was not given. An empty one is an error:
    running everything instead would be a surprise (and a long one)."""
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise VmtaxError(f"{flag}: expected a comma-separated list of names, got {value!r}")
    return items


# What the target flags are called among `vmtax run`'s parsed flags: TARGET_FLAG + option.
TARGET_FLAG = "target_option_"


def target_flags() -> list[click.Option]:
    """A flag for every target option a plugin marks cli=True (--vcpus, --qemu, ...): it
    applies to every target whose kind has that option; repeated, or as LABEL=VALUE, it
    makes one target per value (NAME@LABEL)."""
    from vmtax.core import plugin
    from vmtax.core import target as targets

    found: dict[str, plugin.OptionInfo] = {}
    for kind in targets.kinds().values():
        for info in plugin.option_infos(kind.Options).values():
            if info.cli:
                found.setdefault(info.field, info)
    flags = []
    for field, info in sorted(found.items()):
        unit = f" [{info.unit}]" if info.unit and info.unit != "bytes" else ""
        default = "" if info.default in (None, [], "") else f" [default: {info.default}]"
        flags.append(click.Option([f"--{field.replace('_', '-')}", TARGET_FLAG + field],
                                  multiple=True, metavar="[LABEL=]VALUE",
                                  help=f"{info.doc}{unit}.{default}"))
    return flags


@dataclasses.dataclass(frozen=True)
class RunOutput:
    """The flags of `vmtax run` that are the command line's, not the study's: where results
    are stored, and whether it only shows the plan, prints JSON or every metric."""
    results: str
    dry_run: bool = False
    as_json: bool = False
    show_all: bool = False


def request(flags: dict[str, Any]) -> "RunRequest":
    """The RunRequest that `vmtax run`'s parsed flags make: lists split, --runs N or auto
    checked, the run's name checked, the fleet's flags and the target flags gathered."""
    from vmtax.results.store import check_run_name
    from vmtax.studies.requests import FleetRequest, RunRequest

    runs, name = flags["runs"], flags["name"]
    if name is not None:
        check_run_name(name)
    if runs == "auto":
        repetitions = dict(runs=flags["min_runs"], max_runs=flags["max_runs"],
                           ci_target=flags["ci_target"] / 100)
    elif runs.isdigit() and 1 <= int(runs) <= MAX_COUNT:
        repetitions = dict(runs=int(runs))
    else:
        raise VmtaxError(f"--runs takes a whole number from 1 to {MAX_COUNT} or 'auto', got "
                         f"{runs!r}")
    fleet = (flags["fleet_address"], csv_list(flags["fleet_hosts"], "--hosts"), flags["spread"])
    return RunRequest(
        plan_file=flags["plan_file"], quick=flags["quick"], resume=flags["resume"],
        targets=csv_list(flags["targets"], "--targets"),
        workloads=csv_list(flags["workloads"], "--workloads"),
        target_options={key.removeprefix(TARGET_FLAG): list(values)
                        for key, values in flags.items()
                        if key.startswith(TARGET_FLAG) and values},
        warmup=flags["warmup"], time=flags["time_"], **repetitions,
        collect=csv_list(flags["collect"], "--collect") or [],
        interleave=not flags["no_interleave"], name=name,
        fleet=FleetRequest(*fleet) if any(fleet) else None)


def parsed(command: Callable[["RunRequest", RunOutput], None]) -> Callable[..., None]:
    """`vmtax run`'s callback, given the request its flags make and how to show the result
    instead of each flag: click passes the flags by name, they are read here once."""

    @functools.wraps(command)
    def callback(**flags: Any) -> None:
        command(request(flags), RunOutput(flags["results"], flags["dry_run"],
                                               flags["as_json"], flags["show_all"]))
    return callback


class RunCommand(click.Command):
    """`vmtax run`, whose target flags and plan defaults are made when its options are
    first needed (parsing, --help): they import every target plugin and pydantic, which
    `vmtax --help`, `runs` and `show` must not wait for."""

    _complete = False

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        if not self._complete:
            self._complete = True
            from vmtax.studies import plan as plan_mod

            defaults = {"runs": str(plan_mod.DEFAULT_RUNS), "time_": plan_mod.DEFAULT_TIME}
            for param in self.params:
                if param.name in defaults:
                    param.default = defaults[param.name]
            at = next(i for i, p in enumerate(self.params) if p.name == "time_") + 1
            self.params[at:at] = target_flags()
        return super().get_params(ctx)
