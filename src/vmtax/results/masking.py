"""Secrets (a job's Job.secrets) are never stored: wherever one appears in what a
repetition stores (its argv, output or error) it is kept as SECRET_SHOWN."""

from __future__ import annotations

import re
from typing import Callable, Iterable

SECRET_SHOWN = "***"


def masker(secrets: Iterable[str]) -> Callable[[str | None], str | None]:
    """A function that replaces each of secrets (longest first: one may hold another)
    in a text by SECRET_SHOWN."""
    found = sorted({s for s in secrets if s}, key=len, reverse=True)
    if not found:
        return lambda text: text
    pattern = re.compile("|".join(map(re.escape, found)))
    return lambda text: None if text is None else pattern.sub(SECRET_SHOWN, text)
