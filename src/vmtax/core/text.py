"""Text from users: names as a terminal may show them, and files read within bounds.

Control characters are refused where names come in (targets, runs, labels: `check_printable`),
and names are taken in Unicode's composed form (`composed`: NFC), so "café" typed with a
combining accent is one name, never a second column that looks the same (`unique_names`,
which refuses names alike as they look, NFKC, and spaces at an end too);
names stored before that, or read from elsewhere, are shown escaped (`printable`), so an
ESC or OSC sequence in a name cannot retitle the terminal, hide text or move the cursor.
A file a user gives (a plan, a report to import) is read by `read_user_file`: a regular
file only (a FIFO would block, /dev/zero never end) and at most a size cap.
"""

from __future__ import annotations

import os
import re
import unicodedata

from rich.markup import escape

from vmtax.core.errors import VmtaxError
from vmtax.core.files import read_bounded


def first_line(text: str) -> str:
    """A tool's first line that is not blank, stripped (its version, its error)."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def printable(text: str, newlines: bool = False) -> str:
    """text with each character str.isprintable refuses (C0 and C1 controls, DEL, Unicode
    format and separator characters but the space) as its Python escape: "\\x1b]0;x";
    with newlines, a newline stays (text a renderer laid out in lines)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or (newlines and c == "\n")
                   else c.encode("unicode_escape").decode("ascii") for c in text)


# C0 and C1 controls and DEL but the tab, newline and carriage return an HTML page's own
# markup may hold.
_PAGE_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def page_text(page: str) -> str:
    """An HTML page whose text came from outside (stored names, errors, symbols), each
    control character in it written as its Python escape ("\\x1b"), as `printable`
    does: a page (or a terminal it is cat to) gets no raw ESC or BEL."""
    return _PAGE_CONTROLS.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), page)


def markup(text: str) -> str:
    """Text from outside (a name, a symbol, an error) as rich markup that prints it as it
    is: its control characters escaped (`printable`, newlines kept) and its markup too."""
    return escape(printable(text, newlines=True))


def check_printable(text: str, what: str) -> str:
    """text, or a VmtaxError naming what it is (`--name`, `plan.toml: targets`) when it
    holds a control character."""
    if not text.isprintable():
        raise VmtaxError(f"{what}: '{printable(text)}' holds control characters; "
                         "expected printable text")
    return text


def composed(text: str) -> str:
    """text in Unicode's composed form NFC: "cafe\u0301" (an e and a combining accent) is
    "café", the name a terminal shows for both."""
    return unicodedata.normalize("NFC", text)


def looks(text: str) -> str:
    """text as it looks: in Unicode's compatibility form NFKC, so a full-width "ｖｍ" or a
    ligature "ﬁ" is "vm", "fi"; two names that look alike so are refused, though each is
    kept as written (composed)."""
    return unicodedata.normalize("NFKC", text)


def alike_form(one: str, other: str) -> str:
    """The form of Unicode in which two names written differently are one name."""
    return ("composed form (NFC)" if composed(one) == composed(other)
            else "compatibility form (NFKC), as they look")


def _name_problem(name: str, seen: dict[str, str]) -> str | None:
    """Why name cannot be a name beside those seen (how each looks -> as it was written;
    name is added when it can): spaces at an end, or one that looks as another."""
    if name != name.strip():
        return f"'{_code_points(name)}' has a space at an end; expected a name without"
    other = seen.setdefault(looks(name), name)
    if other == name:
        return None
    return (f"'{_code_points(other)}' and '{_code_points(name)}' are one name in Unicode's "
            f"{alike_form(other, name)}; expected names that differ")


def unique_names(names: list[str], what: str) -> list[str]:
    """names as vmtax keeps them: printable (else a VmtaxError naming what, as
    `check_printable`) and composed; a VmtaxError names the first that has spaces at an
    end, or two that are one name as they look, though written differently."""
    seen: dict[str, str] = {}
    for name in names:
        problem = _name_problem(check_printable(name, what), seen)
        if problem:
            raise VmtaxError(f"{what}: {problem}")
    return [composed(name) for name in names]


def _code_points(text: str) -> str:
    """text with all but ASCII as escapes: names that look the same, told apart."""
    return text.encode("ascii", "backslashreplace").decode("ascii")


def read_user_file(path: str | os.PathLike[str], what: str, limit: int,
                   errors: str = "strict") -> str:
    """The text of the regular file at path, at most limit bytes, decoded as UTF-8 (with
    errors); else a VmtaxError naming path and what the file was to be (`the plan file`)."""
    data = read_bounded(path, what, limit)
    try:
        return data.decode("utf-8", errors)
    except UnicodeDecodeError as exc:
        raise VmtaxError(f"{path}: cannot read {what} (not UTF-8 text: {exc.reason} at "
                         f"byte {exc.start})") from None
