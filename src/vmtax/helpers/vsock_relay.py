"""The guest's end of the agent's channel over vsock (tools/vsock: connect to the host, then
become the agent), for VMMs that have no virtio-serial port (Firecracker, Cloud Hypervisor).
Busybox has no vsock client. Built on first use by Debian's Go (the standard library only,
no cgo: static, so it runs in any guest), cached by its source's digest.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.guest.kernel_cache import build_lock, publish_dir
from vmtax.helpers import go_toolchain

SOURCE = Path(__file__).resolve().parents[3] / "tools" / "vsock"
PROGRAM = "vmtax-vsock"
# The name the guest's /init runs it by (/vmtax/vsock).
GUEST_NAME = "vsock"


def relay() -> Path:
    """The program, built into the cache the first time (a few seconds)."""
    dest = paths.cache_dir() / "guest-tools" / f"vsock-{go_toolchain.source_digest(SOURCE)}"
    if (dest / PROGRAM).exists():
        return dest / PROGRAM
    go = go_toolchain.bootstrap_go()
    if go is None:
        raise VmtaxError(f"building the guest's vsock client needs Go ({go_toolchain.INSTALL})")
    with build_lock(dest):
        if not (dest / PROGRAM).exists():
            tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
            try:
                go_toolchain.run_go([go, "build", "-trimpath", "-ldflags=-s -w", "-o",
                                     str(tmp / PROGRAM), "."],
                                    go_toolchain.go_env(tmp / "go"), SOURCE,
                                    "building tools/vsock", "vsock")
                shutil.rmtree(tmp / "go")
                tmp.chmod(0o755)
                publish_dir(tmp, dest, PROGRAM)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    return dest / PROGRAM


if __name__ == "__main__":   # `make builds`: ahead of the live tests
    import sys
    try:
        relay()
    except VmtaxError as exc:
        print(f"vmtax: {exc}", file=sys.stderr)
        sys.exit(1)
