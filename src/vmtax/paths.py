"""Where vmtax keeps its cache (guest images, kernels) and its runtime journal."""

import os
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("VMTAX_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vmtax")
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def runtime_dir(create: bool = True) -> Path:
    """Host-wide state that must survive a crash of vmtax (the undo journal); create=False
    for those that only look."""
    base = os.environ.get("VMTAX_RUNTIME") or (
        "/run/vmtax" if os.geteuid() == 0 else os.path.join(
            os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/vmtax-{os.geteuid()}", "vmtax"))
    path = Path(base)
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path
