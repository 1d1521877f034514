"""Plugin options: an `Options` model per plugin (pydantic: type, unit, range or choices,
default, doc per field), how each option is described and how values are checked.

Loaded with the first plugin, not with the registry (vmtax.core.plugin re-exports these
names): pydantic costs ~0.05 s to import, which `vmtax show` and `compare` need not pay.
"""

from __future__ import annotations

import difflib
import functools
import types as pytypes
from dataclasses import dataclass
from typing import (
    Annotated,
    Any,
    Callable,
    Literal,
    Mapping,
    Sequence,
    Union,
    get_args,
    get_origin,
)

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from vmtax.core.errors import VmtaxError
from vmtax.core.limits import MAX_COUNT, MAX_SECONDS

# An option with a lower bound and none above gets this one (unit: its limit).
_UPPER = {"s": MAX_SECONDS, "ms": MAX_SECONDS * 1000}


class Invalid(Exception):
    """A value that does not fit its option; the message says what was expected."""


@dataclass(frozen=True)
class Expect:
    """Option metadata: what a valid value is, in words ("a size like \"2G\""); a function
    when the words depend on what is installed (the registered container runtimes)."""
    words: str | Callable[[], str]

    @property
    def text(self) -> str:
        return self.words if isinstance(self.words, str) else self.words()


def option(default: Any, doc: str, *, unit: str | None = None, alias: str | None = None,
           cli: bool = False, tune: Sequence[Any] = (),
           safety: str | Mapping[Any, str] | None = None, **constraints: Any) -> Any:
    """A field of an Options model: its default, one-line doc, unit and constraints (ge, le,
    gt, lt, min_length, ...). cli=True makes it a `vmtax run --NAME` flag for its kind.

    tune: the values `vmtax tune` tries for this option (a knob), each as a plan would write
    it; safety: what speed a value buys at the cost of safety, one note for every value or
    a note per value ({"unsafe": "loses data on a host crash"}).

    A number with a lower bound and none above is bounded by MAX_SECONDS (unit "s", "ms")
    or MAX_COUNT, so no value a plan gives overflows what it feeds."""
    if ({"ge", "gt"} & constraints.keys()) and not ({"le", "lt"} & constraints.keys()):
        constraints["le"] = _UPPER.get(unit or "", MAX_COUNT)
    extra: dict[str, Any] = {}
    if unit:
        extra["unit"] = unit
    if cli:
        extra["cli"] = True
    if tune:
        extra["tune"] = list(tune)
    if safety:
        extra["safety"] = safety if isinstance(safety, str) else {
            str(value): note for value, note in safety.items()}
    return Field(default, description=doc, alias=alias, json_schema_extra=extra or None,
                 **constraints)


class Options(BaseModel):
    """Base of every plugin's options. Frozen; unknown keys are errors; a field with a
    hyphenated alias (sysbench's `cpu-max-prime`) is written and stored by its alias.
    Its validator is built when first used: `vmtax doctor` imports every plugin and
    validates none (~0.04 s of CPU); the plugin index builds each when it finds the plugin
    (vmtax.core.plugin), so a model pydantic cannot build fails there, as at import."""
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True,
                              defer_build=True)

    def problems(self) -> list[tuple[str, str]]:
        """(option, what it should be) for options that do not fit the others or the host.

        Called after every value passed its own check; the plan file reports each problem
        at the option's line, the command line names the option.
        """
        return []

    def values(self) -> dict[str, Any]:
        """The options as written in plans and stored with results: by alias, unset
        (None) ones left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# -- describing and checking one option ----------------------------------------------------

@dataclass(frozen=True)
class OptionInfo:
    """One option of a model, as `vmtax list` and the checks see it."""
    key: str                 # as written: the alias if there is one
    field: str               # the model's attribute name
    info: FieldInfo

    @property
    def doc(self) -> str:
        return self.info.description or ""

    @property
    def unit(self) -> str | None:
        extra = self.info.json_schema_extra
        return extra.get("unit") if isinstance(extra, dict) else None  # type: ignore[return-value]

    @property
    def cli(self) -> bool:
        extra = self.info.json_schema_extra
        return bool(extra.get("cli")) if isinstance(extra, dict) else False

    @property
    def tune(self) -> tuple[Any, ...]:
        """The values `vmtax tune` tries for this option; () when it is no knob."""
        extra = self.info.json_schema_extra
        return tuple(extra.get("tune", ())) if isinstance(extra, dict) else ()  # type: ignore[arg-type]

    def safety(self, value: Any) -> str | None:
        """What setting the option to value gives up for speed, if anything."""
        extra = self.info.json_schema_extra
        notes = extra.get("safety") if isinstance(extra, dict) else None
        if isinstance(notes, dict):
            return notes.get(str(value))  # type: ignore[return-value]
        return notes if isinstance(notes, str) else None

    @property
    def default(self) -> Any:
        return self.info.get_default(call_default_factory=True)

    @property
    def annotation(self) -> Any:
        return self.info.annotation

    @property
    def nullable(self) -> bool:
        return _allows_none(self.annotation)

    @property
    def takes_list(self) -> bool:
        """The option's own value is a list, so only a list of lists sweeps it."""
        return any(get_origin(a) is list for a in _union_members(self.annotation))

    @property
    def choices(self) -> tuple[Any, ...]:
        return tuple(c for a in _union_members(self.annotation) if get_origin(a) is Literal
                     for c in get_args(a))

    def expected(self) -> str:
        """What a valid value is, in words. "none" is named only where it is a choice
        (hugepages = "none"); elsewhere leaving the option out is the way to unset it."""
        for meta in self.info.metadata:
            if isinstance(meta, Expect):
                return meta.text
        text = _describe(self.annotation, self.info.metadata)
        if self.nullable and text.startswith("one of ") and "none" not in self.choices:
            text += ', "none"'
        return text

    def to_json(self) -> dict[str, Any]:
        described = {"name": self.key, "type": type_name(self.annotation), "unit": self.unit,
                     "default": self.default, "choices": list(self.choices) or None,
                     "expected": self.expected(), "doc": self.doc}
        if self.tune:
            described["tune"] = [{"value": v, "safety": self.safety(v)} for v in self.tune]
        return described

    @functools.cached_property
    def _adapter(self) -> TypeAdapter[Any]:
        if not self.info.metadata:
            return TypeAdapter(self.annotation)
        # An Annotated built at run time is no static type form to the type checker.
        return TypeAdapter(
            Annotated[self.annotation, *self.info.metadata])  # type: ignore[arg-type]

    def check(self, value: Any, *, strict: bool = True) -> Any:
        """The value as the plugin wants it; raises Invalid. Plan files are checked
        strictly (TOML has types); command-line strings are converted (strict=False)."""
        if (isinstance(value, str) and value.lower() == "none" and self.nullable
                and "none" not in self.choices):   # memory-oper = "none" is sysbench's own
            return None
        if isinstance(value, str) and not value.isprintable():
            raise Invalid(f"{self.expected()}, without control characters")
        try:
            return self._adapter.validate_python(value, strict=strict)
        except ValidationError:
            raise Invalid(self.expected()) from None


def _union_members(annotation: Any) -> tuple[Any, ...]:
    """The types a value may have, Annotated wrappers taken off."""
    if get_origin(annotation) in (Union, pytypes.UnionType):
        return tuple(m for a in get_args(annotation) for m in _union_members(a))
    if get_origin(annotation) is Annotated:
        return _union_members(get_args(annotation)[0])
    return (annotation,)


def _allows_none(annotation: Any) -> bool:
    return any(a is type(None) for a in _union_members(annotation))


def type_name(annotation: Any) -> str:
    names = []
    for a in get_args(annotation) if get_origin(annotation) in (Union, pytypes.UnionType) \
            else (annotation,):
        if a is type(None):
            continue
        origin = get_origin(a)
        if origin is Literal:
            names.append("choice")
        elif origin is list:
            names.append("list of " + type_name(get_args(a)[0]))
        elif origin is Annotated:
            names.append(type_name(get_args(a)[0]))
        else:
            names.append(getattr(a, "__name__", str(a)))
    return " | ".join(dict.fromkeys(names))


def _bounds(metadata: list[Any]) -> str:
    found = {}
    for meta in metadata:
        for attr in ("ge", "gt", "le", "lt"):
            value = getattr(meta, attr, None)
            if value is not None:
                found[attr] = value
    low = (f"of at least {found['ge']}" if "ge" in found else
           f"above {found['gt']}" if "gt" in found else "")
    high = (f"at most {found['le']}" if "le" in found else
            f"below {found['lt']}" if "lt" in found else "")
    if "ge" in found and "le" in found:
        return f" from {found['ge']} to {found['le']}"
    return " " + " and ".join(p for p in (low, high) if p) if low or high else ""


def _describe(annotation: Any, metadata: list[Any]) -> str:
    parts = []
    members = (get_args(annotation) if get_origin(annotation) in (Union, pytypes.UnionType)
               else (annotation,))
    for a in members:
        if a is type(None):
            continue
        origin = get_origin(a)
        if origin is Annotated:
            inner, *meta = get_args(a)
            expect = next((m for m in meta if isinstance(m, Expect)), None)
            parts.append(expect.text if expect else _describe(inner, [*meta, *metadata]))
        elif origin is Literal:
            parts.append("one of " + ", ".join(
                f'"{c}"' if isinstance(c, str) else str(c).lower() for c in get_args(a)))
        elif a is bool:
            parts.append("true or false")
        elif a is int:
            parts.append("a whole number" + _bounds(metadata))
        elif a is float:
            parts.append("a number" + _bounds(metadata))
        elif a is str:
            parts.append("a non-empty string" if any(getattr(m, "min_length", 0)
                                                     for m in metadata) else "a string")
        elif origin is list:
            parts.append("a list of " + _describe(get_args(a)[0], []).removeprefix("a "))
        else:
            parts.append(type_name(a))
    return " or ".join(parts)


@functools.cache
def option_infos(model: type[Options]) -> dict[str, OptionInfo]:
    """Key as written -> option, in declaration order."""
    return {(f.alias or name): OptionInfo(f.alias or name, name, f)
            for name, f in model.model_fields.items()}


def unknown_option(owner: str, model: type[Options], key: str) -> tuple[str, str]:
    """For a key the model does not have: what was expected, and a hint naming a close
    match (or "")."""
    known = list(option_infos(model))
    if not known:
        return f"no options ({owner} takes none)", ""
    near = difflib.get_close_matches(key, known, n=1)
    return (f"a {owner} option ({', '.join(known)})",
            f' (did you mean "{near[0]}"?)' if near else "")


def build(model: type[Options], values: dict[str, Any], owner: str,
          *, strict: bool = True, kind: str | None = None) -> Options:
    """Check every value and the options together; VmtaxError names the first problem as
    `OWNER: KEY: expected …, got …` (kind: what OWNER is, for "a KIND option").
    Plan files report every problem at its line instead."""
    infos = option_infos(model)
    checked = {}
    for key, value in values.items():
        if key not in infos:
            expected, hint = unknown_option(kind or owner, model, key)
            raise VmtaxError(f"{owner}: expected {expected}, got {key!r}{hint}")
        try:
            checked[key] = infos[key].check(value, strict=strict)
        except Invalid as exc:
            raise VmtaxError(f"{owner}: {key}: expected {exc}, got {value!r}") from None
    options = model.model_validate(checked)
    for key, expected in options.problems():
        raise VmtaxError(f"{owner}: {key}: expected {expected}, got "
                         f"{getattr(options, infos[key].field)!r}")
    return options
