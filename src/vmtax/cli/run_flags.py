"""`vmtax run`'s flags, made from declarations: each field of RunRequest, FleetRequest and
RunOutput that a flag sets declares it (vmtax.studies.requests.flag), and each target option
a plugin marks cli=True is a flag too (--vcpus, --qemu, ...), its help saying what it means
for every kind that takes it. They are made when run's options are first needed (parsing,
--help); the parsed flags make a RunRequest, which is what the command gets (with RunOutput,
how to show the result), never the flags one by one. Also the comma-separated lists it and
other commands take (`csv_list`)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, Callable

import click

from vmtax.cli import bounds
from vmtax.core import hints
from vmtax.core.errors import VmtaxError
from vmtax.core.limits import MAX_COUNT
from vmtax.studies.requests import EVERY_FORM, FleetRequest, Form, RunRequest, flag

if TYPE_CHECKING:
    from vmtax.core.options import OptionInfo


def csv_list(value: str | None, flag: str) -> list[str] | None:
    """A comma-separated list; None when the flag was not given. An empty one is an error:
    running everything instead would be a surprise (and a long one)."""
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise VmtaxError(f"{flag}: expected a comma-separated list of names, got {value!r}")
    return items


@dataclasses.dataclass(frozen=True)
class RunOutput:
    """The flags of `vmtax run` that are the command line's, not the study's: whether it only
    shows the plan, where results are stored, whether it prints JSON or every metric."""
    dry_run: bool = flag(False, "Check the run and print what it would run and how long it "
                         "should take; run nothing.", kind="on", takes=EVERY_FORM)
    results: str = flag(hints.default_results(), "Results directory (one SQLite database in "
                        "it).", metavar="DIRECTORY", takes=EVERY_FORM)
    as_json: bool = flag(False, "Print machine-readable JSON instead of a table; with --fleet, "
                         "one JSON document: each host's run, the spread across hosts and what "
                         "failed.", kind="on", name="json", takes=EVERY_FORM)
    show_all: bool = flag(False, "Every metric with every flag spelt out, not only the summary "
                          "of primary metrics.", kind="on", name="all", aliases=("--metrics",),
                          takes=EVERY_FORM)


# The records run's flags fill, in the order --help lists them; the target flags go after
# TARGET_FLAGS_AFTER.
RECORDS = (RunRequest, FleetRequest, RunOutput)
TARGET_FLAGS_AFTER = "time"
# What the target flags are called among `vmtax run`'s parsed flags: TARGET_FLAG + option.
TARGET_FLAG = "target_option_"


def _key(record: type, field: str) -> str:
    """What a record's field is called among the parsed flags (click lowercases an
    argument's name)."""
    return f"{record.__name__.lower()}__{field}"


def _click_type(kind: str, choices: tuple[str, ...]) -> Any:
    return {"count": bounds.count(), "count0": bounds.count(0),
            "whole seconds": bounds.seconds(whole=True),
            "percent": bounds.number(0, 100, low_open=True),
            "choice": click.Choice(list(choices))}.get(kind, click.STRING)


def _parameter(record: type, f: dataclasses.Field[Any]) -> click.Parameter:
    """The flag (or argument) a record's field declares."""
    spec = f.metadata["flag"]
    key = _key(record, f.name)
    if spec["kind"] == "argument":
        return click.Argument([key], metavar=spec["metavar"], required=False,
                              type=click.Path())
    names = [f"--{spec['name'] or f.name.replace('_', '-')}", *spec["aliases"], key]
    help_text = spec["help"] + (f" [default: {spec['default_text']}]"
                                if spec["default_text"] else "")
    if spec["kind"] in ("on", "off"):
        return click.Option(names, is_flag=True, help=help_text)
    shown = f.default not in (None, [], "") and spec["kind"] != "list"
    return click.Option(names, default=None if spec["kind"] == "list" else f.default,
                        type=_click_type(spec["kind"], spec["choices"]),
                        metavar=spec["metavar"], show_default=shown, help=help_text)


def declared_flags() -> list[click.Parameter]:
    """Every flag RECORDS declare, the target flags among them."""
    made: list[click.Parameter] = []
    for record in RECORDS:
        for f in dataclasses.fields(record):
            if "flag" in f.metadata:
                made.append(_parameter(record, f))
            if record is RunRequest and f.name == TARGET_FLAGS_AFTER:
                made += target_flags()
    return made


def target_flags() -> list[click.Option]:
    """A flag for every target option some plugin marks cli=True (--vcpus, --qemu, ...): it
    applies to every target whose kind has an option of that name, so its help says what it
    means, and its default, for each of those kinds (--machine: libvirt's q35, vm's
    microvm; --cpus: LXD's count, a container's host CPU list); repeated, or as
    LABEL=VALUE, it makes one target per value (NAME@LABEL)."""
    from vmtax.core import plugin
    from vmtax.core import target as targets

    marked = {info.field for kind in targets.kinds().values()
              for info in plugin.option_infos(kind.Options).values() if info.cli}
    meanings: dict[str, dict[tuple[str, str], list[str]]] = {field: {} for field in marked}
    for name, kind in sorted(targets.kinds().items()):
        for info in plugin.option_infos(kind.Options).values():
            if info.field in marked:
                meanings[info.field].setdefault(_meaning(info), []).append(name)
    return [click.Option([f"--{field.replace('_', '-')}", TARGET_FLAG + field],
                         multiple=True, metavar="[LABEL=]VALUE",
                         help=_per_kind(meanings[field]))
            for field in sorted(marked)]


def _meaning(info: OptionInfo) -> tuple[str, str]:
    """An option's doc, and its unit and default, as a flag's help gives them."""
    unit = info.unit if info.unit and info.unit != "bytes" else ""
    default = "" if info.default in (None, [], "") else f"default: {info.default}"
    return info.doc, ", ".join(filter(None, (unit, default)))


def _per_kind(meanings: dict[tuple[str, str], list[str]]) -> str:
    """A flag's help from each meaning and the kinds that give it that one."""
    if len(meanings) == 1:
        [((doc, extra), kinds)] = meanings.items()
        return f"{doc}. [{', '.join(filter(None, (extra, 'for ' + ', '.join(kinds))))}]"
    return " ".join(f"{', '.join(kinds)}: {doc}" + (f" [{extra}]." if extra else ".")
                    for (doc, extra), kinds in meanings.items())


def _fields(record: type, flags: dict[str, Any]) -> dict[str, Any]:
    """The values a record's declared fields were given (those of lists split)."""
    found = {}
    for f in dataclasses.fields(record):
        key = _key(record, f.name)
        if key not in flags:
            continue
        spec, value = f.metadata["flag"], flags[key]
        if spec["kind"] == "list":
            value = csv_list(value, f"--{spec['name'] or f.name.replace('_', '-')}")
            if value is None:
                continue             # the record's own default
        elif spec["kind"] == "off":
            value = not value
        found[f.name] = value
    return found


def request(flags: dict[str, Any], typed: AbstractSet[str] = frozenset()) -> RunRequest:
    """The RunRequest that `vmtax run`'s parsed flags make: lists split, --runs N or auto
    checked, the run's name checked, the fleet's flags and the target flags gathered; a
    flag typed (typed: the parsed names the command line gave) where it would do nothing
    is refused."""
    from vmtax.results.store import check_run_name

    given = _fields(RunRequest, flags)
    runs = given["runs"]
    if runs != "auto":
        if not (str(runs).isdigit() and 1 <= int(runs) <= MAX_COUNT):
            raise VmtaxError(f"--runs takes a whole number from 1 to {MAX_COUNT} or 'auto', "
                             f"got {runs!r}")
        given["runs"] = int(runs)
    if given["name"] is not None:
        check_run_name(given["name"])
    fleet = _fields(FleetRequest, flags)
    made = RunRequest(
        **given, target_options={key.removeprefix(TARGET_FLAG): list(values)
                                 for key, values in flags.items()
                                 if key.startswith(TARGET_FLAG) and values},
        fleet=FleetRequest(**fleet) if any(v is not None for v in fleet.values()) else None)
    _refuse_idle(made.form, typed)
    return made


# What a request of each form is, for the line refusing a flag that would do nothing in it.
_FORM_SAYS = {"plan": "PLAN.toml says what to run; set it there",
              "resume": "--resume goes on with the run as it was planned and stored",
              "classic": "it takes a plan file (PLAN.toml)"}


def _refuse_idle(form: Form, typed: AbstractSet[str]) -> None:
    """A VmtaxError naming the flags typed that a request of this form takes no notice
    of (--time with a plan file, --targets with --resume)."""
    idle = [_spelling(name) for name in sorted(typed) if form not in _takes(name)]
    if idle:
        raise VmtaxError(f"{', '.join(idle)} would do nothing here: {_FORM_SAYS[form]}")


def _declared(name: str) -> tuple[dataclasses.Field[Any], dict[str, Any]] | None:
    """The field a parsed flag sets and its declaration; None for a target flag."""
    return next(((f, f.metadata["flag"]) for record in RECORDS for f in dataclasses.fields(record)
                 if "flag" in f.metadata and _key(record, f.name) == name), None)


def _takes(name: str) -> tuple[str, ...]:
    """The forms of request a parsed flag does something in (a target flag: the classic
    plan's)."""
    found = _declared(name)
    return tuple(found[1]["takes"]) if found else ("classic",)


def _spelling(name: str) -> str:
    """A parsed flag as it is typed: --no-interleave, --vcpus, PLAN.toml."""
    found = _declared(name)
    if found is None:
        return "--" + name.removeprefix(TARGET_FLAG).replace("_", "-")
    f, spec = found
    if spec["kind"] == "argument":
        return str(spec["metavar"]).strip("[]")
    return f"--{spec['name'] or f.name.replace('_', '-')}"


def parsed(command: Callable[[RunRequest, RunOutput], None]) -> Callable[..., None]:
    """`vmtax run`'s callback, given the request its flags make and how to show the result
    instead of each flag: click passes the flags by name, they are read here once."""

    @functools.wraps(command)
    def callback(**flags: Any) -> None:
        ctx = click.get_current_context()
        typed = {name for name in flags if ctx.get_parameter_source(name) in (
            click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)}
        command(request(flags, typed), RunOutput(**_fields(RunOutput, flags)))
    return callback


class RunCommand(click.Command):
    """`vmtax run`, whose flags are made from the declarations when its options are first
    needed (parsing, --help): the target flags import every target plugin and pydantic,
    which `vmtax --help`, `runs` and `show` must not wait for; the plan's defaults are
    said then too."""

    _complete = False

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        if not self._complete:
            self._complete = True
            from vmtax.studies import plan as plan_mod

            made = declared_flags()
            defaults = {_key(RunRequest, "runs"): str(plan_mod.DEFAULT_RUNS),
                        _key(RunRequest, "time"): plan_mod.DEFAULT_TIME}
            for param in made:
                if isinstance(param, click.Option) and param.name in defaults:
                    param.default = defaults[param.name]
                    param.show_default = True
            self.params[:0] = made
        return super().get_params(ctx)
