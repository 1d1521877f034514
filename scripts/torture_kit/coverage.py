"""A property of the registry as a whole: every option and argument of vmtax's commands
that names a file or directory is attacked by some attack with a path meant to escape its
tree (Attack.covers). A command that gains such an option fails the torture, and
tests/test_torture.py, until an attack declares it. Each is named as --help shows it: an
option by its flag, an argument by its metavar (`vmtax run PLAN.toml`)."""

from __future__ import annotations

from typing import Iterable

from torture_kit.registry import Attack


def path_options() -> dict[tuple[str, ...], str]:
    """(command words..., option or argument) -> how it shows in --help, for every
    option and argument of every vmtax command that names a file or directory."""
    import click

    from vmtax.cli.main import cli

    found: dict[tuple[str, ...], str] = {}

    def walk(command: click.Command, words: tuple[str, ...], ctx: click.Context) -> None:
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None:
                    walk(sub, (*words, name), click.Context(sub, parent=ctx))
            return
        # get_params: a command may make its options when they are first needed (run's).
        for param in command.get_params(ctx):
            names = param.metavar or ""
            if isinstance(param.type, click.Path) or any(w in names for w in ("FILE", "DIR",
                                                                              "PLAN")):
                shown = param.opts[0] if isinstance(param, click.Option) else \
                    names.strip("[]") or (param.name or "").upper()
                found[(*words, shown)] = names
    walk(cli, (), click.Context(cli))
    return found


def unattacked(attacks: Iterable[Attack]) -> list[tuple[str, ...]]:
    """The path options no attack covers, in the order of --help."""
    covered = set().union(*(a.covers for a in attacks))
    return [option for option in path_options() if option not in covered]
