"""The call path of one vmtax command through the package's upper parts (cli, studies,
report, analysis, results; issue #39): the calls that cross from one part into another, how
many modules they enter, how often each, and how often the path climbs back up, that is
enters a module of a higher part than the crossing before it did (a renderer that called
analysis, then the CLI calling the renderer again, or a renderer calling analysis anew), and
how often a renderer (report) calls into analysis or results itself, which it should never:
it renders what analysis computed.

    .venv/bin/python scripts/callpath.py show golden-a --results DIR
"""

import collections
import contextlib
import io
import os
import sys

# VMTAX_CALLPATH_VERBOSE=1: also print every crossing, with the function entered.
VERBOSE = bool(os.environ.get("VMTAX_CALLPATH_VERBOSE"))
UPPER = {"cli", "studies", "report", "analysis", "results"}
LAYERS = ["cli", "studies|report", "analysis", "results", "workloads|targets|collectors",
          "helpers", "guest", "host", "core"]


def _part(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def _height(module: str) -> int:
    part = _part(module)
    for i, layer in enumerate(LAYERS):
        if part in layer.split("|"):
            return len(LAYERS) - i
    return len(LAYERS) + 1     # vmtax.__main__ and the like: above every part


def trace(argv: list[str]) -> list[tuple[str, str]]:
    """Each crossing of the command's call path: (the calling module, the module entered
    with the function, "vmtax.report.html:build"), in order."""
    from vmtax.cli.main import cli

    entries: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        # Module-level functions only: a method or property of a summary's row is reading
        # the model, not computing it again.
        if event != "call" or "." in frame.f_code.co_qualname or frame.f_code.co_name == "<module>":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("vmtax.") or _part(module) not in UPPER:
            return
        caller = frame.f_back
        while caller is not None and not caller.f_globals.get("__name__", "").startswith("vmtax."):
            caller = caller.f_back
        if caller is None or _part(caller.f_globals["__name__"]) != _part(module):
            entries.append((caller.f_globals["__name__"] if caller else "",
                            f"{module}:{frame.f_code.co_name}"))

    sys.setprofile(profile)
    try:
        # A text stream with a binary buffer: export writes its bytes to stdout's.
        with contextlib.redirect_stdout(io.TextIOWrapper(io.BytesIO())), \
                contextlib.suppress(SystemExit):
            cli.main(argv, prog_name="vmtax", standalone_mode=True)
    finally:
        sys.setprofile(None)
    return entries


def renderer_calls(crossings: list[tuple[str, str]]) -> list[str]:
    """The crossings from a renderer (report) into analysis or results."""
    return [callee for caller, callee in crossings
            if _part(caller) == "report" and _part(callee) in ("analysis", "results")]


def main() -> None:
    crossings = trace(sys.argv[1:])
    calls = [callee for _, callee in crossings]
    # A visit: consecutive crossings into one module (a loop over rows calling one of its
    # functions) are one visit.
    modules = [c.partition(":")[0] for c in calls]
    entries = [c for i, c in enumerate(calls) if i == 0 or modules[i] != modules[i - 1]]
    if VERBOSE:
        print("\n".join(entries))
    entries = [e.partition(":")[0] for e in entries]
    counts = collections.Counter(entries)
    climbs = sum(_height(b) > _height(a) for a, b in zip(entries, entries[1:]))
    into_analysis = sum(n for m, n in counts.items() if _part(m) == "analysis")
    print(f"modules: {len(counts)}  visits: {len(entries)}  climbs back up: {climbs}  "
          f"analysis visited: {into_analysis}  "
          f"renderer into analysis/results: {len(renderer_calls(crossings))}")
    for module, n in counts.most_common():
        print(f"  {n:4d}  {module}")
    # Each entry into analysis, visits or not: a run analysed once is one analyse.
    entered = collections.Counter(c for c in calls if _part(c) == "analysis")
    print("analysis entered: " + ", ".join(f"{c} ×{n}" for c, n in entered.items()))


if __name__ == "__main__":
    main()
