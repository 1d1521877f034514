"""A plan's keys and values checked against the options their plugins declare.

`Checker` gathers a plan file's problems, each one line `FILE:LINE: KEY.PATH: expected
WHAT, got VALUE` at the line where the value was written (a [quick] value at its own):
a value against its option's model (`check`), a key its table does not declare, with the
nearest one that it does (`check_of`, `unknown`), and the options of one configuration
against each other (`together`).

May import: `vmtax.core`, `vmtax.studies.toml_lines`.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from vmtax.core import plugin
from vmtax.studies.toml_lines import KeyPath, Locator, dotted, show

CheckOf = Callable[[KeyPath, str], "plugin.OptionInfo | None"]
# What the host says about one configuration's options: (option, what it expected).
HostProblems = Callable[[plugin.Options], list[tuple[str, str]]]


def unknown(key: str, known: Iterable[str]) -> str:
    """An unknown key as an error shows it, with the nearest known one: a misspelling."""
    near = difflib.get_close_matches(key, list(known), n=1)
    return json.dumps(key) + (f' (did you mean "{near[0]}"?)' if near else "")


@dataclass
class Origin:
    """The table a target or workload configuration was expanded from."""
    path: KeyPath       # [targets.NAME] or [[workloads]] entry
    values: KeyPath     # where its options or params are: path, or path + ("params",)
    given: dict[str, Any]
    zipped: Any

    def of(self, key: str) -> KeyPath:
        """Where key was written: among the values, in the zip, else the table itself."""
        if isinstance(self.zipped, dict) and key in self.zipped:
            return self.path + ("zip", key)
        return self.values + (key,) if key in self.given else self.path


class Checker:
    """The problems of one plan file's text, in the order found, with their lines."""

    def __init__(self, source: str, text: str):
        self.source = source
        self.where = Locator(text)
        self.errors: list[tuple[int, str]] = []     # (line, message)
        self.aliases: dict[KeyPath, KeyPath] = {}   # where a [quick] value went -> its key

    def bad(self, path: KeyPath, expected: str, got: str, at: KeyPath | None = None) -> None:
        shown = self.written_at(path)
        if at is not None and at[:len(path)] == path:
            # A key in a table, named by the table: a [quick] key by its own table's name.
            source = self.written_at(at)
            shown = source[:len(source) - (len(at) - len(path))]
        self.fail(path if at is None else at, f"{dotted(shown)}: expected {expected}, got {got}")

    def alias(self, source: KeyPath, dest: KeyPath) -> None:
        """A [quick] value moved from source to dest: name and place problems at source."""
        self.where.alias(source, dest)
        self.aliases[dest] = source

    def written_at(self, path: KeyPath) -> KeyPath:
        """Where the value at path was written: a [quick] value under its own key."""
        for dest, source in self.aliases.items():
            if path[:len(dest)] == dest:
                return source + path[len(dest):]
        return path

    def dotted(self, path: KeyPath) -> str:
        return dotted(self.written_at(path))

    def fail(self, at: KeyPath, message: str) -> None:
        line = self.where.line(at)
        self.errors.append((line, f"{self.source}:{line}: {message}"))

    def check(self, path: KeyPath, info: plugin.OptionInfo, value: Any) -> tuple[bool, Any]:
        try:
            return True, info.check(value)
        except plugin.Invalid as exc:
            self.bad(path, str(exc), show(value))
            return False, None

    def table(self, path: KeyPath, value: Any, what: str) -> dict[str, Any] | None:
        if isinstance(value, dict):
            return value
        self.bad(path, what, show(value))
        return None

    def where_written(self, table: KeyPath, at: KeyPath, value: str) -> str:
        """Where a value of table was written (at: the table or a key in it), as an error at
        run time names it: `FILE:LINE: [targets.vm] accel = "kvm"`; a [quick] value by
        its own table."""
        source = self.written_at(at)
        table = source[:len(source) - (len(at) - len(table))]
        return f"{self.source}:{self.where.line(at)}: [{dotted(table)}] {value}"

    def together(self, origin: Origin, model: type[plugin.Options], values: dict[str, Any],
                 which: str, host: HostProblems | None = None) -> plugin.Options | None:
        """The options of one expanded configuration, checked against each other (and the
        host); each problem is reported at its option's line."""
        options = model.model_validate(values)
        problems = options.problems() + (host(options) if host else [])
        infos = plugin.option_infos(model)
        for key, expected in problems:
            self.fail(origin.of(key), f"{self.dotted(origin.values + (key,))}: expected "
                      f"{expected}, got {show(getattr(options, infos[key].field))}{which}")
        return None if problems else options

    def check_of(self, owner: str, model: type[plugin.Options]) -> CheckOf:
        """The option a key of owner's table declares; None, said as a problem, for a key
        that the model does not declare."""
        infos = plugin.option_infos(model)

        def check_of(path: KeyPath, key: str) -> plugin.OptionInfo | None:
            if key not in infos:
                expected, hint = plugin.unknown_option(owner, model, key)
                self.bad(path[:-1], expected, json.dumps(key) + hint, at=path)
            return infos.get(key)
        return check_of
