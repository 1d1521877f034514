"""Target kinds: every module of this package may define some (see vmtax.plugin).

A target name is `KIND` or `KIND:VARIANT` (container:runc, vm:tcg); the variant sets the
kind's `variant_option`.
"""

from __future__ import annotations

from typing import Any

from vmtax import plugin
from vmtax.errors import VmtaxError
from vmtax.targets.base import Target, TargetContext


def kinds() -> dict[str, type[Target]]:
    return plugin.plugins(Target.group)  # type: ignore[return-value]


def get(kind: str) -> type[Target]:
    return plugin.get(Target.group, kind)  # type: ignore[return-value]


def known_names() -> list[str]:
    names = []
    for kind, cls in kinds().items():
        names.append(kind)
        names.extend(f"{kind}:{v}" for v in cls.variants())
    return names


def parse_name(name: str) -> tuple[str, dict[str, Any]]:
    """`container:runc` -> ("container", {"runtime": "runc"}). Raises VmtaxError when unknown."""
    kind, _, variant = name.partition(":")
    cls = kinds().get(kind)
    if cls is None or (variant and (cls.variant_option is None
                                    or variant not in cls.variants())):
        raise VmtaxError(f"unknown target {name!r}; known targets: " + ", ".join(known_names()))
    return kind, ({cls.variant_option: variant} if variant and cls.variant_option else {})


def create(name: str, kind: str, options: dict[str, Any], ctx: TargetContext) -> Target:
    cls = get(kind)
    return cls(name, plugin.build(cls.Options, options, name, strict=False, kind=kind), ctx)


__all__ = ["Target", "TargetContext", "create", "get", "kinds", "known_names", "parse_name"]
