"""The plugin contract: typed options, and how plugins are found.

A plugin is one class in one module that describes itself: its name, a one-line doc, its
options as an `Options` model (pydantic: type, unit, range or choices, default, doc per
field) and, for workloads, the metrics it produces. Plan validation, `--help`, `vmtax
list`, the report's grouping and the guest image's contents are derived from that.

Plugins are found by scanning vmtax's own plugin packages (`PACKAGES`) and the modules
named by the `vmtax.plugins` entry-point group, so a third-party package adds a workload,
target kind or container runtime without editing vmtax. Which module holds which plugin is
kept in an index (made by importing them all, remade when a plugin file or an installed
distribution changes), so a command imports only the plugins it looks up. A plugin class
is any subclass of `Plugin` that sets `name` in its own body; two plugins of one group
with the same name are an error at load.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import pkgutil
import sys
import types as pytypes
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import (
    Annotated,
    Any,
    Callable,
    ClassVar,
    Iterable,
    Iterator,
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

ENTRY_POINT_GROUP = "vmtax.plugins"
# Packages whose every module is scanned for built-in plugins.
PACKAGES = ("vmtax.workloads", "vmtax.targets", "vmtax.collectors")

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
    hyphenated alias (sysbench's `cpu-max-prime`) is written and stored by its alias."""
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

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


# -- plugins and the registry --------------------------------------------------------------

class Plugin:
    """Base of everything the registry finds. `group` says what kind of plugin a base
    class is ("workload", "target", "container-runtime", "collector"); `name` is set by
    each concrete plugin."""
    group: ClassVar[str]
    name: ClassVar[str]
    description: ClassVar[str] = ""
    Options: ClassVar[type[Options]] = Options
    # Debian packages the plugin needs on the host (the set-up script installs them all).
    packages: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def options_json(cls) -> list[dict[str, Any]]:
        return [o.to_json() for o in option_infos(cls.Options).values()]


def _plugin_classes(module: pytypes.ModuleType) -> Iterator[type[Plugin]]:
    for obj in vars(module).values():
        if (isinstance(obj, type) and issubclass(obj, Plugin) and obj.__module__ == module.__name__
                and "name" in vars(obj)):
            yield obj


def _entry_point_modules() -> Iterator[tuple[str, str]]:
    """(entry point's name and value, module) for each `vmtax.plugins` entry point."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        yield f"{ep.name} ({ep.value})", ep.value.partition(":")[0]


def _import(module_name: str, entry_point: str | None) -> pytypes.ModuleType:
    try:
        return importlib.import_module(module_name)
    except Exception as exc:   # a broken third-party plugin is named, not a traceback
        if entry_point is None:
            raise
        raise VmtaxError(f"plugin {entry_point} failed to load: {exc}") from None


def _modules() -> Iterator[tuple[pytypes.ModuleType, str | None]]:
    """Every plugin module, with its entry point (None for vmtax's own)."""
    for package_name in PACKAGES:
        try:
            package = importlib.import_module(package_name)
        except ModuleNotFoundError:
            continue
        # A plugin with support modules of its own may be a package (targets/libvirt/).
        for info in pkgutil.walk_packages(package.__path__, package_name + "."):
            yield importlib.import_module(info.name), None
    for entry_point, module_name in _entry_point_modules():
        yield _import(module_name, entry_point), entry_point


# -- the index: which module holds which plugin, so a command imports only the plugins it
# uses (all of them cost ~0.3 s). It is made by importing every plugin module, as loading
# always did (a duplicate name still fails here), and kept in the cache directory keyed on
# what could change it: the plugin packages' files, the distributions installed on the
# import path (whose entry points name plugins) and the files those name; a change makes
# it again.

_INDEX_VERSION = 1


def _stamp(path: str) -> list[Any]:
    try:
        st = os.stat(path)
    except OSError:
        return [path, None]
    return [path, st.st_mtime_ns, st.st_size]


def _distributions(directory: str) -> list[str]:
    """The installed distributions (whose entry points name plugins) in a directory of
    the import path: a version installed or removed renames or removes its metadata."""
    try:
        with os.scandir(directory or ".") as entries:
            return sorted(e.name for e in entries
                          if e.name.endswith((".dist-info", ".egg-info")))
    except OSError:
        return []


def _index_key() -> list[Any]:
    """The stat of each built-in plugin package's directories and files, and the
    distributions in each directory of sys.path that has any."""
    stamps = []
    for package_name in PACKAGES:
        spec = importlib.util.find_spec(package_name)
        for top in (spec.submodule_search_locations or []) if spec else []:
            for directory, subdirectories, names in os.walk(top):
                subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
                stamps.append(_stamp(directory))
                stamps += sorted(_stamp(os.path.join(directory, name)) for name in names
                                 if name.endswith(".py"))
    installed = [[p, found] for p in sys.path if (found := _distributions(p))]
    return [_INDEX_VERSION, stamps, installed]


def _index_path() -> Path:
    """One index per Python environment and vmtax source tree."""
    from vmtax.core import paths

    where = hashlib.sha256(json.dumps([sys.executable, __file__]).encode()).hexdigest()
    return paths.cache_dir() / f"plugin-index-{where[:16]}.json"


def _build_index() -> dict[str, Any]:
    """group -> name -> [module, entry point or None]; the entry points' module files."""
    found: dict[str, dict[str, type[Plugin]]] = {}
    entry_points: dict[str, str | None] = {}
    files = []
    for module, entry_point in _modules():
        entry_points[module.__name__] = entry_point
        source = module.__file__
        if entry_point is not None and source:
            files.append(_stamp(source))
        for cls in _plugin_classes(module):
            group = found.setdefault(cls.group, {})
            other = group.get(cls.name)
            if other is not None and other is not cls:
                raise VmtaxError(f"two {cls.group} plugins named {cls.name!r}: "
                                 f"{other.__module__} and {cls.__module__}")
            group[cls.name] = cls
    # By name: the order of files on disk must not change listings or messages.
    return {"groups": {g: {name: [cls.__module__, entry_points[cls.__module__]]
                           for name, cls in sorted(plugins.items())}
                       for g, plugins in found.items()},
            "files": files}


def _index() -> dict[str, Any]:
    key = _index_key()
    try:
        path: Path | None = _index_path()
    except OSError:   # no cache directory: the index is made each time
        path = None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        kept = json.loads(path.read_text()) if path else None
        if kept and kept["key"] == key and all(_stamp(f[0]) == f for f in kept["files"]):
            return kept  # type: ignore[no-any-return]
    index = {"key": key, **_build_index()}
    if path is not None:
        with contextlib.suppress(OSError):   # a read-only cache only costs the next call time
            tmp = path.with_name(f"{path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(index))
            tmp.replace(path)
    return index


class _Group(MutableMapping[str, "type[Plugin]"]):
    """One group's plugins by name, each module imported when one of its plugins is first
    looked up (iterating values imports them all). Tests may add or replace plugins."""

    def __init__(self, where: dict[str, list[Any]]) -> None:
        self._where = where
        self._loaded: dict[str, type[Plugin]] = {}
        self._names = list(where)

    def __getitem__(self, name: str) -> type[Plugin]:
        if name not in self._loaded:
            if name not in self._where:
                raise KeyError(name)
            module_name, entry_point = self._where[name]
            module = _import(module_name, entry_point)
            found = {cls.name: cls for cls in _plugin_classes(module)}
            if name not in found:   # the file changed after the index was made
                raise VmtaxError(f"plugin {name!r} is no longer in {module_name}; "
                                 "run the command again")
            self._loaded[name] = found[name]
        return self._loaded[name]

    def __setitem__(self, name: str, cls: type[Plugin]) -> None:
        if name not in self._names:
            self._names.append(name)
        self._loaded[name] = cls

    def __delitem__(self, name: str) -> None:
        if name not in self._names:
            raise KeyError(name)
        self._names.remove(name)
        self._loaded.pop(name, None)
        self._where.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names


@functools.cache
def registry() -> dict[str, MutableMapping[str, type[Plugin]]]:
    """group -> name -> plugin class, by name; modules are imported as their plugins are
    looked up."""
    return {group: _Group(where) for group, where in _index()["groups"].items()}


def plugins(group: str) -> Mapping[str, type[Plugin]]:
    return registry().get(group, {})


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """The end of an unknown name's error: the closest known name, a misspelling's likely
    intent (" (did you mean 'cpu'?)"), or "" when none is close."""
    near = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def get(group: str, name: str) -> type[Plugin]:
    found = plugins(group)
    if name not in found:
        raise VmtaxError(f"unknown {group} {name!r}; known {group}s: {', '.join(found) or 'none'}"
                         + did_you_mean(name, found))
    return found[name]
