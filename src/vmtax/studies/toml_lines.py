"""Where things are in a TOML text: tomllib gives values, not lines.

`Locator` maps every table, key and array element of a (valid) TOML text to its line, so
a plan's problems are reported as `FILE:LINE: KEY.PATH: …`; `show` and `dotted` write a
value and a key path back the way TOML spells them.
"""

from __future__ import annotations

import bisect
import json
import re
import tomllib
from typing import Any

KeyPath = tuple[str | int, ...]   # table keys and array indices, outermost first

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR = re.compile(r"[^,\]}\n#]*")    # a number, boolean or date: up to what ends it


class Locator:
    """Line of each table, key and array element of a TOML text, by key path.

    A skeleton parse that follows tables, arrays of tables, dotted keys, inline tables and
    (multi-line) arrays but skips values; the text is already known to be valid TOML.
    """

    def __init__(self, text: str):
        self.text = text
        self.i = 0
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.lines: dict[KeyPath, int] = {}
        self.arrays: dict[KeyPath, int] = {}      # array-of-tables path -> tables seen so far
        self._document()

    def line(self, path: KeyPath) -> int:
        """Line of path, else of its nearest enclosing key that was written down."""
        for end in range(len(path), 0, -1):
            if path[:end] in self.lines:
                return self.lines[path[:end]]
        return 1

    def alias(self, source: KeyPath, dest: KeyPath) -> None:
        """dest (and what is below it) now holds the value written at source: report it
        at source's lines."""
        for path in [p for p in self.lines if p[:len(dest)] == dest]:
            del self.lines[path]
        for path, line in list(self.lines.items()):
            if path[:len(source)] == source:
                self.lines[dest + path[len(source):]] = line

    def _here(self) -> int:
        return bisect.bisect_right(self.starts, self.i)

    def _record(self, base: KeyPath, keys: KeyPath, line: int) -> KeyPath:
        for end in range(1, len(keys) + 1):
            self.lines.setdefault(base + keys[:end], line)
        return base + keys

    def _peek(self, s: str) -> bool:
        return self.text.startswith(s, self.i)

    def _match(self, pattern: re.Pattern[str]) -> re.Match[str]:
        m = pattern.match(self.text, self.i)
        if m is None:    # the text is valid TOML: a bare key or scalar is there
            raise ValueError(f"not TOML at offset {self.i}")
        return m

    def _skip(self, newlines: bool) -> None:
        blank = " \t\r\n" if newlines else " \t"
        while self.i < len(self.text):
            c = self.text[self.i]
            if c in blank:
                self.i += 1
            elif c == "#" and newlines:
                end = self.text.find("\n", self.i)
                self.i = len(self.text) if end < 0 else end
            else:
                return

    def _string(self) -> str:
        quote = self.text[self.i]
        if self._peek(quote * 3):
            end = self.i + 3
            while not self.text.startswith(quote * 3, end):
                end += 2 if quote == '"' and self.text[end] == "\\" else 1
            end += 3
            while end < len(self.text) and self.text[end] == quote:   # """a"""" ends in a quote
                end += 1
            raw = self.text[self.i:end]
        else:
            end = self.i + 1
            while self.text[end] != quote:
                end += 2 if quote == '"' and self.text[end] == "\\" else 1
            raw = self.text[self.i:end + 1]
            end += 1
        self.i = end
        value: str = tomllib.loads(f"s = {raw}")["s"]   # a string literal's value
        return value

    def _key(self) -> KeyPath:
        keys: list[str] = []
        while True:
            self._skip(newlines=False)
            if self.text[self.i] in "\"'":
                keys.append(self._string())
            else:
                m = self._match(_BARE_KEY)
                keys.append(m[0])
                self.i = m.end()
            self._skip(newlines=False)
            if not self._peek("."):
                return tuple(keys)
            self.i += 1

    def _resolve(self, keys: KeyPath) -> KeyPath:
        """A header's key path with the index of the current table of each array on the way."""
        path: KeyPath = ()
        for key in keys:
            path += (key,)
            if path in self.arrays:
                path += (self.arrays[path] - 1,)
        return path

    def _document(self) -> None:
        table: KeyPath = ()
        while True:
            self._skip(newlines=True)
            if self.i >= len(self.text):
                return
            line = self._here()
            if self._peek("[["):
                self.i += 2
                keys = self._key()
                array = self._resolve(keys[:-1]) + keys[-1:]
                index = self.arrays.get(array, 0)
                self.arrays[array] = index + 1
                table = self._record((), array + (index,), line)
                self.i += 2
            elif self._peek("["):
                self.i += 1
                table = self._record((), self._resolve(self._key()), line)
                self.i += 1
            else:
                self._pair(table)

    def _pair(self, table: KeyPath) -> None:
        path = self._record(table, self._key(), self._here())
        self._skip(newlines=False)
        self.i += 1                                     # "="
        self._value(path)

    def _value(self, path: KeyPath) -> None:
        self._skip(newlines=False)
        c = self.text[self.i]
        if c in "\"'":
            self._string()
        elif c == "[":
            self.i += 1
            index = 0
            while True:
                self._skip(newlines=True)
                if self._peek("]"):
                    self.i += 1
                    return
                if self._peek(","):
                    self.i += 1
                    index += 1
                    continue
                self.lines.setdefault(path + (index,), self._here())
                self._value(path + (index,))
        elif c == "{":
            self.i += 1
            while True:
                self._skip(newlines=True)
                if self._peek("}"):
                    self.i += 1
                    return
                if self._peek(","):
                    self.i += 1
                    continue
                self._pair(path)
        else:
            m = self._match(_SCALAR)
            self.i = m.end()


def show(value: Any) -> str:
    """A value as it is written in TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(show, value)) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {show(v)}" for k, v in value.items()) + " }"
    return str(value)


def dotted(path: KeyPath) -> str:
    out = ""
    for key in path:
        if isinstance(key, int):
            out += f"[{key}]"
        else:
            bare = _BARE_KEY.fullmatch(key)
            out += ("." if out else "") + (key if bare else json.dumps(key))
    return out or "top level"
