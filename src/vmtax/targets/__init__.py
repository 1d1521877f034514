"""Target registry: a target name is `KIND` or `KIND:VARIANT` (container:runc, vm:tcg)."""

from __future__ import annotations

import importlib
from typing import Any

from vmtax.errors import VmtaxError
from vmtax.targets.base import Target, TargetContext

# kind -> (module, class, option a variant sets, allowed variants or None for any)
KINDS: dict[str, tuple[str, str, str | None, tuple[str, ...] | None]] = {
    "native": ("vmtax.targets.native", "NativeTarget", None, ()),
    "container": ("vmtax.targets.container", "ContainerTarget", "runtime",
                  ("unshare", "runc", "crun")),
    "vm": ("vmtax.targets.vm", "VmTarget", "accel", ("kvm", "tcg", "auto")),
}


def parse_name(name: str) -> tuple[str, dict[str, Any]]:
    """`container:runc` -> ("container", {"runtime": "runc"}). Raises VmtaxError when unknown."""
    kind, _, variant = name.partition(":")
    if kind not in KINDS:
        raise VmtaxError(f"unknown target {name!r}; known targets: "
                         + ", ".join(known_names()))
    _, _, option, variants = KINDS[kind]
    if not variant:
        return kind, {}
    if option is None or (variants is not None and variant not in variants):
        raise VmtaxError(f"unknown target {name!r}; known targets: " + ", ".join(known_names()))
    return kind, {option: variant}


def known_names() -> list[str]:
    names = []
    for kind, (_, _, _, variants) in KINDS.items():
        names.append(kind)
        names.extend(f"{kind}:{v}" for v in variants or ())
    return names


def create(name: str, kind: str, options: dict[str, Any], ctx: TargetContext) -> Target:
    module, cls, _, _ = KINDS[kind]
    return getattr(importlib.import_module(module), cls)(name, options, ctx)
