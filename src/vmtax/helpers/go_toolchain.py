"""The pinned Go toolchain that builds runsc (vmtax.targets.runsc) and the serving workload's
tools (vmtax.helpers.serving_tools).

Debian 12's Go (1.19) is too old for both, so Debian's go only fetches a pinned Go
toolchain from the Go module proxy (the route GOTOOLCHAIN takes), and that toolchain does
the builds. Every go command runs with private caches under vmtax's cache, so every host
builds the same programs with the same Go, whatever Go it has itself.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
from pathlib import Path

from vmtax.core.errors import VmtaxError
from vmtax.host import proc

# gVisor's go.mod asks for Go >= 1.26.3; the newest patch release of that line.
GO_VERSION = "1.26.11"
GO_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
BUILD_TIMEOUT = 1800.0
# How users reach the module proxy (a company mirror); the other GO* variables (GOROOT,
# GOFLAGS, GOOS, ...) would change which Go runs or what it builds, so they are dropped.
GO_NETWORK_VARS = ("GOPROXY", "GONOPROXY", "GOPRIVATE", "GOSUMDB", "GONOSUMDB", "GOINSECURE")
INSTALL = "apt-get install golang-go"


def source_digest(source: Path) -> str:
    """A Go program's sources (the files of its directory), so an edit builds it anew."""
    h = hashlib.sha256()
    for path in sorted(source.glob("*")):
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def go_arch() -> str | None:
    """Go's name of this host's architecture; None where there is no toolchain for it."""
    return GO_ARCH.get(os.uname().machine)


def toolchain_module() -> str:
    return f"golang.org/toolchain@v0.0.1-go{GO_VERSION}.linux-{go_arch()}"


def bootstrap_go() -> str | None:
    """A Go that can fetch the toolchain: Debian's golang-go, else whatever is on PATH."""
    for candidate in ("/usr/bin/go", *sorted(glob.glob("/usr/lib/go-*/bin/go"))):
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("go")


def go_env(gopath: Path) -> dict[str, str]:
    """The environment of every go command: private caches (never ~/go), no toolchain
    switching, no cgo (a cgo-built runsc fails at run time)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GO") or k in GO_NETWORK_VARS}
    env.update(GOPATH=str(gopath), GOMODCACHE=str(gopath / "pkg" / "mod"),
               GOCACHE=str(gopath / "cache"), GOTOOLCHAIN="local", CGO_ENABLED="0",
               # -modcacherw: the module cache stays deletable with the rest of the cache.
               GOFLAGS="-mod=mod -modcacherw")
    return env


def download_command(go: str) -> list[str]:
    return [go, "mod", "download", "-json", toolchain_module()]


def run_go(argv: list[str], env: dict[str, str], cwd: Path, what: str, owner: str) -> str:
    """Run a go command; its stdout, or VmtaxError ("OWNER: WHAT failed") with the end of
    its stderr."""
    done = proc.run(argv, env=env, cwd=str(cwd), timeout=BUILD_TIMEOUT)
    if done.exit_code != 0:
        why = "timed out" if done.timed_out else f"exit code {done.exit_code}"
        tail = " | ".join(done.stderr.strip().splitlines()[-5:])
        raise VmtaxError(f"{owner}: {what} failed ({why}): {tail}")
    return done.stdout


def fetch_toolchain(gopath: Path, scratch: Path, owner: str, product: str) -> str:
    """The pinned Go toolchain's go command, downloaded into gopath by the bootstrap Go if
    needed; VmtaxError ("OWNER: needs Go to build PRODUCT") without a bootstrap Go."""
    go = bootstrap_go()
    if go is None:
        raise VmtaxError(f"{owner}: needs Go to build {product} ({INSTALL})")
    info = json.loads(run_go(download_command(go), go_env(gopath), scratch,
                             f"downloading Go {GO_VERSION}", owner))
    root = Path(info["Dir"])
    # Module zips carry no file modes: make the toolchain's programs executable again.
    for path in [*(root / "bin").iterdir(), *(root / "pkg" / "tool").rglob("*")]:
        if path.is_file():
            path.chmod(path.stat().st_mode | 0o111)
    return str(root / "bin" / "go")
