"""`vmtax lab [OPTIONS] COMMAND ARGS…`: any vmtax command, run inside a lab (a TCG guest
with emulated AMD-V that is a real, nested KVM host; vmtax.guest.lab); or, with --session
FILE, several in turn in one lab.

    vmtax lab run --targets native,vm:kvm,vm:tcg --workloads cpu,memory --runs 2
    vmtax lab boot --target vm:kvm --count 3
    vmtax lab --vcpus 2 --memory 6G run --targets native,vm:kvm --collect exits
    vmtax lab --results R --session commands.txt

ARGS are checked here, on the host, as COMMAND itself checks them, before the lab boots.
The runs the commands store come back into this host's store (--results, given before or
after COMMAND, or VMTAX_RESULTS) as ordinary runs; their host facts say "nested KVM in a
TCG lab, AMD-V emulated", and every ratio in them is to the lab's own native.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import sys
from collections.abc import Callable
from typing import BinaryIO
from pathlib import Path

import click

from vmtax.cli import bounds
from vmtax.cli.consoles import err
from vmtax.cli.density import results_option
from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.guest import lab
from vmtax.host import guardian, journal, machine, proc
from vmtax.studies import lab as lab_study
from vmtax.studies import lab_watch

class DryRun(Exception):
    """A `run --dry-run`, answered on the host (its output)."""


# Commands that make no sense in a throwaway lab: they manage this host or the lab itself.
NOT_IN_LAB = ("lab", "cleanup", "fleet")
HELP = ("-h", "--help")
# Commands whose --dry-run checks all they will run: asked on the host before the lab boots.
DRY_RUNS = ("run", "tune")


def _results_given(args: list[str]) -> tuple[list[str], str | None]:
    """ARGS without a --results DIR given after the command, and that DIR (None: none)."""
    kept, given = [], None
    words = iter(args)
    for word in words:
        if word == "--results":
            given = next(words, None)
            if given is None:
                raise VmtaxError("lab: --results needs a directory")
        elif word.startswith("--results="):
            given = word.partition("=")[2]
        else:
            kept.append(word)
    return kept, given


def _check_command(ctx: click.Context, command: str, args: list[str], results: str,
                   kernel: str | None) -> str | None:
    """ARGS as COMMAND takes them: a usage error is the very one `vmtax COMMAND` gives. A
    `run --dry-run`'s answer, found on the way."""
    root = ctx.find_root()
    group = root.command
    assert isinstance(group, click.Group)
    cmd = None if command in NOT_IN_LAB else group.get_command(root, command)
    if cmd is None:
        raise VmtaxError(f"lab: {command!r} is not a vmtax command the lab runs; use one of "
                         + ", ".join(c for c in group.list_commands(root) if c not in NOT_IN_LAB))
    if command in DRY_RUNS:
        # The whole plan, checked as the command checks it (targets, workloads, knobs, plan
        # file, the run to resume in the host's store), on the host and in a second: the lab
        # takes a minute to boot. Devices the lab's kernel gives it (/dev/vhost-net) count
        # as there.
        planned = lab.devices(lab.lab_kernel(paths.cache_dir(), kernel))
        said = io.StringIO()
        with contextlib.redirect_stdout(said), machine.planning_lab(planned):
            cmd.main([*args, "--dry-run", "--results", results],
                     prog_name=f"{root.info_name} {command}", standalone_mode=False)
        return said.getvalue() if "--dry-run" in args else None
    with cmd.make_context(command, list(args), parent=root):
        pass
    return None


def _session(path: str) -> list[list[str]]:
    """A session file's commands: one vmtax command a line, words as a shell splits them
    (no shell runs them); blank lines and # comments skipped."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise VmtaxError(f"lab: --session {path}: {exc.strerror}") from None
    commands = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise VmtaxError(f"lab: {path}:{number}: {exc}") from None
        if words[:1] == ["vmtax"]:
            words = words[1:]
        if words:
            commands.append(words)
    if not commands:
        raise VmtaxError(f"lab: --session {path}: no command in it (one vmtax command a line)")
    return commands


def _commands(ctx: click.Context, command: str | None, args: list[str], session: str | None,
              results: str, kernel: str | None) -> tuple[list[list[str]], str]:
    """The commands to run in the lab, checked, without --results; and the host's store
    they store into (a --results given after a command, or the lab's)."""
    if command is not None and session is not None:
        raise VmtaxError(f"lab: give a COMMAND ({command}) or --session FILE, not both")
    if command is None and session is None:
        raise VmtaxError("lab: give a COMMAND to run in the lab (vmtax lab run …), or "
                         "--session FILE")
    asked = _session(session) if session is not None else [[str(command), *args]]
    found, chosen = [], None
    for words in asked:
        kept, given = _results_given(words[1:])
        if given is not None:
            if chosen not in (None, given):
                raise VmtaxError(f"lab: --results {given} and --results {chosen}: a lab "
                                 "stores its runs into one results directory")
            chosen = given
        found.append([words[0], *kept])
    default = os.environ.get("VMTAX_RESULTS", "results")
    if chosen is not None and results not in (default, chosen):
        raise VmtaxError(f"lab: --results {results} and --results {chosen}: give one")
    results = chosen or results
    for words in found:
        answer = _check_command(ctx, words[0], words[1:], results, kernel)
        if answer is not None and len(found) == 1:   # no lab boots to say what it would run
            raise DryRun(answer)
    return found, results


@click.command("lab", context_settings={"ignore_unknown_options": True,
                                        "allow_interspersed_args": False})
@click.option("--vcpus", type=click.IntRange(1, 64), default=lab_study.DEFAULT_VCPUS,
              show_default=True, help="The lab's vCPUs.")
@click.option("--memory", default=lab_study.DEFAULT_MEMORY, show_default=True,
              help="The lab's RAM: vmtax's writes and its guests live in it.")
@click.option("--disk", default=lab_study.DEFAULT_DISK, show_default=True,
              help="The lab's disk, sparse on the host and gone with the lab: everything "
                   "the lab writes.")
@click.option("--qemu", default="qemu-system-x86_64", show_default=True,
              help="The QEMU that runs the lab (its TCG must emulate AMD-V).")
@click.option("--cpu", default=lab.CPU, show_default=True,
              help="The lab's QEMU CPU model and flags (+svm,+npt are added).")
@click.option("--kernel", metavar="PACKAGE",
              help="The lab's own kernel: a Debian kernel package apt fetches (e.g. "
                   "linux-image-6.12.107+deb12-amd64-unsigned). [default: the guests' "
                   "Debian kernel]")
@click.option("--tb-size", type=click.IntRange(1, 4096), metavar="MiB",
              help="TCG's translation cache for the lab. [default: QEMU's]")
@click.option("--tcg-thread", type=click.Choice(["multi", "single"]), default="multi",
              show_default=True, help="TCG: one host thread per lab vCPU, or one for all.")
@click.option("--hang-timeout", type=bounds.seconds(5, high=3600), metavar="SECONDS",
              default=lab_watch.HANG_TIMEOUT, show_default=True,
              help="A lab without heartbeat and output this long has hung: a new one goes "
                   "on with the command.")
@click.option("--restarts", type=click.IntRange(0, 10), default=lab_study.RESTARTS,
              show_default=True,
              help="New labs booted, at most, for commands a lab that hung or died cut short.")
@click.option("--session", metavar="FILE",
              help="Run the commands of FILE (one vmtax command a line) in turn in one lab, "
                   "until one fails.")
@results_option
@click.argument("command", required=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def lab_command(ctx: click.Context, vcpus: int, memory: str, disk: str, qemu: str, cpu: str,
                kernel: str | None, tb_size: int | None, tcg_thread: str, hang_timeout: float,
                restarts: int, session: str | None, results: str, command: str | None,
                args: tuple[str, ...]) -> None:
    """Run a vmtax COMMAND inside a lab: a TCG guest with emulated AMD-V in which KVM
    really runs guests (nested, so the shape of the tax, never hardware's numbers).
    COMMAND's own options: `vmtax COMMAND --help`, on the host."""
    if any(word in HELP for word in args):
        click.echo(ctx.get_help())   # the lab's, here: no lab boots to answer it
        return
    config = lab_study.LabConfig(vcpus=vcpus, memory=memory, disk=disk, qemu=qemu, cpu=cpu,
                                 kernel=kernel, tb_size=tb_size, tcg_thread=tcg_thread,
                                 hang_timeout=hang_timeout, restarts=restarts)
    lab_study.check(config)   # the lab's own size first: it is asked before the commands
    try:
        commands, results = _commands(ctx, command, list(args), session, results, kernel)
    except DryRun as answer:
        click.echo(str(answer), nl=False)
        return
    for line in journal.recover():
        err.print(f"[yellow]recovered:[/yellow] {line}")
    own = journal.Journal()
    tty = sys.stdout.isatty()
    env = {"TERM": os.environ.get("TERM", "dumb")} if tty else {}
    if tty:
        size = os.get_terminal_size()
        env.update(COLUMNS=str(size.columns), LINES=str(size.lines))
    elif "COLUMNS" in os.environ:   # piped: the width asked for, as vmtax itself takes it
        env["COLUMNS"] = os.environ["COLUMNS"]

    def echo(stream: BinaryIO) -> Callable[[bytes], None]:
        def write(data: bytes) -> None:
            stream.write(data)
            stream.flush()
        return write

    with guardian.guard(own.path):
        outcome = lab_study.run(commands, config, results=Path(results), journal=own,
                                echo=(echo(sys.stdout.buffer), echo(sys.stderr.buffer)),
                                say=lambda text: err.print(text, highlight=False,
                                                           soft_wrap=True),
                                env=env, tty=tty)
    parts = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in outcome.seconds.items())
    err.print(f"lab: {'interrupted; ' * outcome.interrupted}{parts}", highlight=False)
    for run_id in outcome.run_ids:
        err.print(f"lab: stored run {run_id} in {results}", highlight=False)
    sys.exit(proc.stopped_exit_code() if outcome.interrupted else outcome.exit_code)
