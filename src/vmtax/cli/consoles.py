"""The consoles the commands print to: tables and JSON on stdout, progress, warnings and
errors on stderr."""

from rich.console import Console

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)
