"""Errors that reach the user as one line, never as a traceback."""


class VmtaxError(Exception):
    """A user-facing problem: bad input, missing tool, unusable host feature.

    The message must name what was wrong and what to do about it.
    """


class TargetError(VmtaxError):
    """A target could not be prepared or stopped responding."""


class ParseError(Exception):
    """A workload's output could not be turned into metrics (stored as a failed run)."""
