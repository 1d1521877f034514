"""`vmtax lab [--vcpus N --memory M] COMMAND ARGS…`: any vmtax command, run inside a lab (a
TCG guest with emulated AMD-V that is a real, nested KVM host; vmtax.guest.lab).

    vmtax lab run --targets native,vm:kvm,vm:tcg --workloads cpu,memory --runs 2
    vmtax lab boot --target vm:kvm --count 3
    vmtax lab --vcpus 2 --memory 6G run --targets native,vm:kvm --collect exits

ARGS are checked here, on the host, as COMMAND itself checks them, before the lab boots.
The runs the command stores come back into this host's store (--results / VMTAX_RESULTS)
as ordinary runs; their host facts say "nested KVM in a TCG lab, AMD-V emulated", and every
ratio in them is to the lab's own native.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

import click

from vmtax.cli.density import err, results_option
from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.guest import lab
from vmtax.host import guardian, journal, machine, proc
from vmtax.studies import lab as lab_study

# Commands that make no sense in a throwaway lab: they manage this host or the lab itself.
NOT_IN_LAB = ("lab", "cleanup", "fleet")


def _check_args(ctx: click.Context, command: str, args: list[str]) -> None:
    """ARGS as COMMAND takes them: a usage error is the very one `vmtax COMMAND` gives."""
    root = ctx.find_root()
    group = root.command
    assert isinstance(group, click.Group)
    if command in NOT_IN_LAB or group.get_command(root, command) is None:
        raise VmtaxError(f"lab: {command!r} is not a vmtax command the lab runs; use one of "
                         + ", ".join(c for c in group.list_commands(root) if c not in NOT_IN_LAB))
    if any(a == "--results" or a.startswith("--results=") for a in args):
        raise VmtaxError("lab: give --results before the command (vmtax lab --results DIR "
                         f"{command} …): the lab's runs come back into that store")
    cmd = group.get_command(root, command)
    assert cmd is not None
    if command == "run" and "--dry-run" not in args:
        # The whole plan, checked as `run` checks it (targets, workloads, plan file), on the
        # host and in a second: the lab takes a minute to boot. Devices the lab's kernel
        # gives it (/dev/vhost-net) count as there.
        planned = lab.devices(lab.lab_kernel(paths.cache_dir()))
        with contextlib.redirect_stdout(io.StringIO()), machine.planning_lab(planned):
            cmd.main([*args, "--dry-run"], prog_name=f"{root.info_name} {command}",
                     standalone_mode=False)
        return
    with cmd.make_context(command, list(args), parent=root):
        pass


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
@results_option
@click.argument("command")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def lab_command(ctx: click.Context, vcpus: int, memory: str, disk: str, qemu: str,
                results: str,
                command: str, args: tuple[str, ...]) -> None:
    """Run a vmtax COMMAND inside a lab: a TCG guest with emulated AMD-V in which KVM
    really runs guests (nested, so the shape of the tax, never hardware's numbers)."""
    _check_args(ctx, command, list(args))
    for line in journal.recover():
        err.print(f"[yellow]recovered:[/yellow] {line}")
    own = journal.Journal()
    out = sys.stdout.buffer
    env = {"TERM": os.environ.get("TERM", "dumb")} if sys.stdout.isatty() else {}
    if sys.stdout.isatty():
        size = os.get_terminal_size()
        env.update(COLUMNS=str(size.columns), LINES=str(size.lines))
    elif "COLUMNS" in os.environ:   # piped: the width asked for, as vmtax itself takes it
        env["COLUMNS"] = os.environ["COLUMNS"]

    def echo(data: bytes) -> None:
        out.write(data)
        out.flush()

    with guardian.guard(own.path):
        outcome = lab_study.run([command, *args], vcpus=vcpus, memory=memory, disk=disk,
                                qemu=qemu, results=Path(results), journal=own, echo=echo,
                                say=lambda text: err.print(text, highlight=False),
                                env=env, tty=sys.stdout.isatty())
    parts = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in outcome.seconds.items())
    err.print(f"lab: {'interrupted; ' * outcome.interrupted}{parts}", highlight=False)
    for run_id in outcome.run_ids:
        err.print(f"lab: stored run {run_id} in {results}", highlight=False)
    sys.exit(proc.stopped_exit_code() if outcome.interrupted else outcome.exit_code)
