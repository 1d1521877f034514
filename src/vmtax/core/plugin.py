"""The plugin contract: typed options, and how plugins are found.

A plugin is one class in one module that describes itself: its name, a one-line doc, its
options as an `Options` model (pydantic: type, unit, range or choices, default, doc per
field) and, for workloads, the metrics it produces. Plan validation, `--help`, `vmtax
list`, the report's grouping and the guest image's contents are derived from that.

Plugins are found by scanning vmtax's own plugin packages (`PACKAGES`) and the modules
named by the `vmtax.plugins` entry-point group, so a third-party package adds a workload,
target kind or container runtime without editing vmtax. Which module holds which plugin is
kept in an index (made by importing them all, remade when a plugin file or an installed
distribution changes), so a command imports only the plugins it looks up. The index also
keeps each plugin's manifest (`Plugin.manifest`: a workload's metrics), so commands that
read stored results import no plugin, nor pydantic (the options live in
vmtax.core.options, re-exported here and loaded on first use). A plugin class is any
subclass of `Plugin` that sets `name` in its own body; two plugins of one group with the
same name are an error at load.
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
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Iterator, Mapping, TypeVar

from vmtax.core.errors import VmtaxError

if TYPE_CHECKING:
    from vmtax.core.options import Expect as Expect
    from vmtax.core.options import Invalid as Invalid
    from vmtax.core.options import OptionInfo as OptionInfo
    from vmtax.core.options import Options as Options
    from vmtax.core.options import build as build
    from vmtax.core.options import option as option
    from vmtax.core.options import option_infos as option_infos
    from vmtax.core.options import type_name as type_name
    from vmtax.core.options import unknown_option as unknown_option

# The options' names, kept in vmtax.core.options (with pydantic) and loaded on first use.
_OPTIONS = ("Expect", "Invalid", "OptionInfo", "Options", "build", "option", "option_infos",
            "type_name", "unknown_option")


def __getattr__(name: str) -> Any:
    if name in _OPTIONS:
        from vmtax.core import options

        return getattr(options, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_M = TypeVar("_M")

ENTRY_POINT_GROUP = "vmtax.plugins"
# Packages whose every module is scanned for built-in plugins.
PACKAGES = ("vmtax.workloads", "vmtax.targets", "vmtax.collectors")


# -- plugins and the registry --------------------------------------------------------------

class _NoOptions:
    """Plugin.Options of a plugin without options: the empty model, imported when read."""

    def __get__(self, instance: object, owner: type) -> type[Options]:
        from vmtax.core.options import Options

        return Options


class Plugin:
    """Base of everything the registry finds. `group` says what kind of plugin a base
    class is ("workload", "target", "container-runtime", "collector"); `name` is set by
    each concrete plugin."""
    group: ClassVar[str]
    name: ClassVar[str]
    description: ClassVar[str] = ""
    # The empty model unless the plugin declares its own (made when first read).
    Options: ClassVar[type[Options]] = _NoOptions()  # type: ignore[assignment]
    # Debian packages the plugin needs on the host (the set-up script installs them all).
    packages: ClassVar[tuple[str, ...]] = ()
    # Those only some of its options need (what building a guest's minimal kernel takes):
    # listed with `packages` by `vmtax list packages`, installed on first use by a plugin
    # of those options (its packages_for).
    option_packages: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def options_json(cls) -> list[dict[str, Any]]:
        from vmtax.core.options import option_infos

        return [o.to_json() for o in option_infos(cls.Options).values()]

    @classmethod
    def manifest(cls) -> dict[str, Any]:
        """What commands that read stored results need of the plugin, as JSON. The index
        keeps it, so they import neither the plugin's module nor pydantic (`manifest`)."""
        return {}


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


def _build_options(cls: type[Plugin], entry_point: str | None) -> None:
    """The plugin's options validator, which pydantic defers to its first use (Options)."""
    try:
        cls.Options.model_rebuild()
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

_INDEX_VERSION = 4
# vmtax's own source directory.
_VMTAX = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


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
    """group -> name -> [module, entry point or None, manifest]; the entry points' module
    files."""
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
            _build_options(cls, entry_point)
    # The manifests come from the plugins and what they import (perf_kvm's metrics,
    # sysbench_report's resolutions): a change to any of vmtax's files loaded by now makes
    # the index again, as the plugin packages' own files do (_index_key).
    files += sorted(_stamp(path) for module in list(sys.modules.values())
                    if isinstance(module, pytypes.ModuleType)
                    and (path := vars(module).get("__file__") or "").startswith(_VMTAX))
    # By name: the order of files on disk must not change listings or messages.
    return {"groups": {g: {name: [cls.__module__, entry_points[cls.__module__],
                                  cls.manifest()]
                           for name, cls in sorted(plugins.items())}
                       for g, plugins in found.items()},
            "files": files}


# The index is a few tens of KB; a file far larger is none of vmtax's.
_MAX_INDEX = 16 << 20


def _digest(index: dict[str, Any]) -> str:
    """What the index held when vmtax wrote it: a garbled or hand-edited one (a `groups`
    that lost a group) is made again, not believed."""
    body = {k: v for k, v in index.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _kept_index(path: Path, key: list[Any]) -> dict[str, Any] | None:
    """The index kept at path when it is the one for key, whole, of files unchanged since,
    and naming only modules plugins may come from (vmtax's plugin packages, the entry
    points installed now); None to make it again. A file that is not one vmtax writes (a
    FIFO, /dev/zero, another user's) is refused (vmtax.core.files.Untrusted)."""
    from vmtax.core.files import read_json

    try:
        kept = read_json(path, "the plugin index", _MAX_INDEX)
        if (not isinstance(kept, dict) or kept.get("digest") != _digest(kept)
                or kept["key"] != key or not all(_stamp(f[0]) == f for f in kept["files"])):
            return None
        own = tuple(f"{package}." for package in PACKAGES)
        named = [(module, entry_point) for group in kept["groups"].values()
                 for module, entry_point, _ in group.values()]
        installed = ({module for _, module in _entry_point_modules()}
                     if any(ep is not None for _, ep in named) else set())
        if all(module.startswith(own) if ep is None else module in installed
               for module, ep in named):
            return kept
    except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def _index() -> dict[str, Any]:
    key = _index_key()
    try:
        path: Path | None = _index_path()
    except OSError:   # no cache directory: the index is made each time
        path = None
    kept = _kept_index(path, key) if path is not None else None
    if kept is not None:
        return kept
    index = {"key": key, **_build_index()}
    index["digest"] = _digest(index)
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
        self._manifests: dict[str, Any] = {}

    def __getitem__(self, name: str) -> type[Plugin]:
        if name not in self._loaded:
            if name not in self._where:
                raise KeyError(name)
            module_name, entry_point, _ = self._where[name]
            module = _import(module_name, entry_point)
            found = {cls.name: cls for cls in _plugin_classes(module)}
            if name not in found:   # the file changed after the index was made
                raise VmtaxError(f"plugin {name!r} is no longer in {module_name}; "
                                 "run the command again")
            self._loaded[name] = found[name]
        return self._loaded[name]

    def manifest(self, name: str, read: Callable[[dict[str, Any]], _M]) -> _M | None:
        """The plugin's manifest as `read` makes it, once, from the index unless its class
        is loaded; None for a name the group lacks."""
        if name not in self._manifests:
            if name in self._loaded:
                self._manifests[name] = read(self._loaded[name].manifest())
            elif name in self._where:
                self._manifests[name] = read(self._where[name][2])
            else:
                return None
        return self._manifests[name]  # type: ignore[no-any-return]

    def __setitem__(self, name: str, cls: type[Plugin]) -> None:
        if name not in self._names:
            self._names.append(name)
        self._loaded[name] = cls
        self._manifests.pop(name, None)

    def __delitem__(self, name: str) -> None:
        if name not in self._names:
            raise KeyError(name)
        self._names.remove(name)
        self._loaded.pop(name, None)
        self._where.pop(name, None)
        self._manifests.pop(name, None)

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


def manifest(group: str, name: str, read: Callable[[dict[str, Any]], _M]) -> _M | None:
    """The plugin's manifest (Plugin.manifest) as `read` makes it, without importing the
    plugin; None for an unknown name."""
    found = registry().get(group, {})
    if isinstance(found, _Group):
        return found.manifest(name, read)
    return read(found[name].manifest()) if name in found else None   # a group a test made


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
