"""Every option that names a path, given as "../../../NAME" from three levels down (issue
#35, item 1). A program, kernel or key a plan names is kept by its absolute path; a rootfs
and an ssh bundle built with such a program hold it inside themselves; and every command
whose options name files reads and writes where they say and nowhere else (its whole
sandbox is compared before and after). The commands' cases are CASES: each says which of
the path options (torture_kit.coverage) it covers, which makes the Attack's `covers`."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

from torture_kit.env import ROOT, VMTAX, Env, Outcome, check_output
from torture_kit.registry import Attack
from torture_kit.stores import files, in_directory, profiled_store, traversal_store

UP = "../../../"


@dataclass(frozen=True)
class Case:
    """A command whose path arguments are {up} (the sandbox, three levels up) and {out} (a
    directory of the user's there); allowed: what it may create there, beside results."""
    args: tuple[str, ...]
    covers: tuple[tuple[str, ...], ...]
    allowed: tuple[str, ...] = ()


CASES = [
    Case(("run", "{up}p.toml", "--dry-run"), (("run", "plan_file"),)),
    Case(("run", "--targets", "native", "--workloads", "cpu", "--results", "{up}r",
          "--dry-run"), (("run", "--results"),)),
    Case(("show", "last", "--results", "{up}r"), (("show", "--results"),)),
    Case(("runs", "--results", "{up}r"), (("runs", "--results"),)),
    Case(("compare", "last:native", "last:other", "--results", "{up}r"),
         (("compare", "--results"),)),
    Case(("compare", "last:native", "last:other", "--junit", "{out}v.xml", "--results",
          "{up}r"), (("compare", "--junit"),), ("out",)),
    Case(("composite", "last", "--results", "{up}r"), (("composite", "--results"),)),
    Case(("cleanup", "--results", "{up}r"), (("cleanup", "--results"),)),
    Case(("plan", "{up}p.toml"), (("plan", "plan_file"),)),
    Case(("list", "packages", "--plan", "{up}p.toml"), (("list", "--plan"),)),
    Case(("tune", "{up}t.toml", "--dry-run"), (("tune", "plan_file"),)),
    Case(("tune", "--targets", "vm", "--workloads", "cpu", "--dry-run", "--results", "{up}r"),
         (("tune", "--results"),)),
    Case(("density", "{up}bad-density.toml"), (("density", "args"),)),
    Case(("density", "show", "last", "--results", "{up}r"), (("density", "--results"),)),
    Case(("boot", "--target", "nope", "--results", "{up}r"), (("boot", "--results"),)),
    Case(("boot", "{up}bad-boot.toml"), (("boot", "plan_file"),)),
    Case(("exits", "import", "{up}rep.txt", "--label", "cap", "--results", "{up}exits-r"),
         (("exits", "import", "file"),), ("exits-r",)),
    Case(("exits", "import", "{up}rep.txt", "--label", "cap2", "--results", "{up}exits-r"),
         (("exits", "import", "--results"),), ("exits-r",)),
    Case(("exits", "show", "cap", "--results", "{up}exits-r"), (("exits", "show", "--results"),)),
    Case(("exits", "diff", "cap", "cap2", "--results", "{up}exits-r"),
         (("exits", "diff", "--results"),)),
    Case(("profile", "show", "last", "--results", "{up}r-profile"),
         (("profile", "show", "--results"),), ("r-profile",)),
    Case(("profile", "diff", "last:native", "last:vm:tcg", "--results", "{up}r-profile"),
         (("profile", "diff", "--results"),), ("r-profile",)),
    Case(("report", "last", "--html", "{out}r.html", "--png", "{out}png", "--svg", "{out}svg",
          "--results", "{up}r"),
         (("report", "--html"), ("report", "--png"), ("report", "--svg"),
          ("report", "--results")), ("out",)),
    Case(("export", "last", "--csv", "{out}x.csv", "--json", "{out}x.json", "--jsonl",
          "{out}x.jsonl", "--benchstat", "{out}x.txt", "--markdown", "{out}x.md", "--results",
          "{up}r"),
         tuple(("export", flag) for flag in ("--csv", "--json", "--jsonl", "--benchstat",
                                             "--markdown", "--results")), ("out",)),
    Case(("fleet", "join", "999.1.1.1:1", "--name", "h1", "--results", "{up}fleet-r",
          "--ray-temp-dir", "{up}ray"),
         (("fleet", "join", "--results"), ("fleet", "join", "--ray-temp-dir")), ("fleet-r",)),
    Case(("fleet", "show", "last", "--results", "{up}r"), (("fleet", "show", "--results"),)),
    Case(("trend", "t", "--html", "{out}t.html", "--results", "{up}r"),
         (("trend", "--html"), ("trend", "--results")), ("out",)),
    Case(("publish", "t", "{out}site", "--results", "{up}r"),
         (("publish", "names"), ("publish", "--results")), ("out",)),
    # Refused for its size before a lab boots: where its --results would be, is checked.
    Case(("lab", "--results", "{up}lab-r", "--memory", "999G", "run", "--targets", "native",
          "--workloads", "cpu"), (("lab", "--results"),), ("lab-r",)),
    Case(("lab", "--memory", "999G", "--session", "{up}session.txt"),
         (("lab", "--session"),)),
]


def _path_typed_options() -> list[tuple[str, str, bool]]:
    """(target kind, option, takes a list) of every target option that names a host file
    or program (vmtax.core.option_types: Program(s), ExistingFile, GuestKernel, LocalPath)."""
    import typing

    from vmtax.core import option_types, plugin
    from vmtax.core import target as targets

    def expects(annotation: Any) -> set[str]:
        if typing.get_origin(annotation) is typing.Annotated:
            inner, *meta = typing.get_args(annotation)
            return {m.text for m in meta if isinstance(m, plugin.Expect)} | expects(inner)
        return {t for a in typing.get_args(annotation) for t in expects(a)}
    texts = set().union(*(expects(t) for t in (
        option_types.Program, option_types.Programs, option_types.ExistingFile,
        option_types.GuestKernel, option_types.LocalPath)))
    return [(kind, key, info.takes_list) for kind in targets.kinds()
            for key, info in plugin.option_infos(targets.get(kind).Options).items()
            if info.expected() in texts]


def path_traversal_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """The attack; not quick, also the issue's container run, whose copy once landed
    outside every tree of vmtax's."""
    from vmtax.core import plugin
    from vmtax.core import target as targets
    from vmtax.core.errors import VmtaxError
    from vmtax.guest import remote_bundle, rootfs

    base = env.work / "traversal"
    cwd = base / "d" / "a" / "b"
    cwd.mkdir(parents=True)
    (base / "x").mkdir()
    program = base / "x" / "h"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    up = UP
    (base / "p.toml").write_text('[targets.native]\n[[workloads]]\nname = "cpu"\n')
    (base / "t.toml").write_text('[targets.vm]\naccel = "tcg"\n[[workloads]]\nname = "cpu"\n'
                                 '[tune]\nbaseline = "vm"\n')
    (base / "out").mkdir()   # a directory of the user's, named from elsewhere
    (base / "session.txt").write_text("runs\n")
    profiled_store(base / "r-profile", "f")
    (base / "bad-density.toml").write_text("maxx = 1\n")
    (base / "bad-boot.toml").write_text('[targets.c]\nkind = "container"\n[[workloads]]\n'
                                        'name = "cpu"\n[boot]\ncont = 1\n')
    shutil.copy(ROOT / "tests" / "fixtures" / "perf_kvm" / "classic-vmx.txt", base / "rep.txt")
    traversal_store(base / "r")
    cache = base / "cache"

    # A target option that names a file or program: kept absolute, whatever kind.
    for kind, key, takes_list in _path_typed_options():
        outcome.cases += 1
        given = [up + "x/h"] if takes_list else up + "x/h"
        try:
            with in_directory(cwd):
                kept = plugin.option_infos(targets.get(kind).Options)[key].check(given)
        except plugin.Invalid as exc:
            outcome.fail(f"{kind}.{key} = {given!r}: refused: {exc}")
            continue
        if kept != ([str(program)] if takes_list else str(program)):
            outcome.fail(f"{kind}.{key} = {given!r}: kept as {kept!r}, not {program}")
    # What is built with such a program keeps it inside.
    outcome.cases += 2
    before = files(base)
    with in_directory(cwd):
        tree = rootfs.build([up + "x/h"], cache)
        if not (tree / str(program).lstrip("/")).is_file():
            outcome.fail(f"rootfs of {up}x/h: the program is not at {program} inside it")
        try:
            bundle = remote_bundle.make([up + "x/h"])
            outcome.fail(f"ssh bundle of {up}x/h: made, as {sorted(bundle.files)}")
        except VmtaxError:
            outcome.note("a relative program out of an ssh bundle refused")
    strays = [p for p in files(base) - before if not p.startswith("cache")]
    if strays:
        outcome.fail(f"a rootfs build wrote outside its cache: {strays[:3]}")

    for case in CASES:
        args = [a.format(up=UP, out=UP + "out/") for a in case.args]
        if quick and args[0] not in ("run", "report", "export", "exits"):
            continue
        outcome.cases += 1
        before = files(base)
        done = subprocess.run([*VMTAX, *args], cwd=cwd, text=True, capture_output=True,
                              timeout=300, env={**env.env, "VMTAX_CACHE": str(cache)})
        what = f"vmtax {' '.join(args)}"
        check_output(outcome, what, done.stderr)
        lines = done.stderr.strip().splitlines()
        if done.returncode not in (0, 2) or done.returncode == 2 and len(lines) != 1:
            outcome.fail(f"{what}: exit {done.returncode}: {done.stderr.strip()[-200:]}")
        strays = [p for p in files(base) - before
                  if not p.startswith(("cache", "r" + os.sep, *case.allowed))]
        if strays:
            outcome.fail(f"{what}: wrote outside what it names: {strays[:3]}")
        outcome.note(f"exit {done.returncode}")
    for name in ("out/r.html", "out/x.csv", "out/x.json", "out/x.jsonl", "out/x.txt",
                 "out/t.html", "out/site/index.html"):
        if not (base / name).is_file() and not quick:
            outcome.fail(f"{name}: not written where its option named it")
    # fleet start would start Ray's head: its --ray-temp-dir is checked where it is made.
    from vmtax.studies import fleet_ray
    outcome.cases += 1
    with in_directory(cwd):
        argv = fleet_ray.head_argv(1, up + "ray")
    if argv[argv.index("--temp-dir") + 1] != str(base / "ray"):
        outcome.fail(f"fleet start --ray-temp-dir {up}ray: Ray is given {argv[-1]}")
    if quick:
        return
    # The reproduction: a container whose plan names ../../../x/h.
    outcome.cases += 1
    (cwd / "plan.toml").write_text(f'[targets.c]\nkind = "container"\nruntime = "runc"\n'
                                   f'binaries = ["{up}x/h"]\n[[workloads]]\nname = "cpu"\n')
    before = files(base)
    done = subprocess.run([*VMTAX, "run", "plan.toml", "--runs", "1", "--warmup", "0",
                           "--time", "1", "--results", str(base / "r")], cwd=cwd, text=True,
                          capture_output=True, timeout=600,
                          env={**env.env, "VMTAX_CACHE": str(cache)})
    check_output(outcome, "the issue's container run", done.stderr)
    strays = [p for p in files(base) - before
              if not p.startswith(("cache", "r" + os.sep, os.path.join("d", "a", "b")))]
    if done.returncode not in (0, 2) or strays:
        outcome.fail(f"the issue's container run: exit {done.returncode}, outside its "
                     f"trees: {strays[:3]}: {done.stderr.strip()[-200:]}")


ATTACK = Attack(
    "paths out of their tree (#35)",
    "every option of every command that names a path, and target options naming programs",
    "kept absolute; nothing read or written outside what the option names; exit 0 or one "
    "line", path_traversal_attack,
    # fleet start would start Ray's head: its --ray-temp-dir is checked where it is made.
    covers=frozenset({o for case in CASES for o in case.covers}
                     | {("fleet", "start", "--ray-temp-dir")}))
