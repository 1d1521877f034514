"""What the `serving` workload runs, built and made on this host on first use, then cached.

The server (tools/httpd, standard library only) and the load generator (vegeta, a pinned
Go module) are built by the pinned Go toolchain that runsc's build fetches from the Go
module proxy (vmtax.helpers.go_toolchain), static (no cgo), so every target runs the same file. The
transcode endpoint's input clips come from ffmpeg's own test source, never a download.

The workload builds them when a run first needs its server; `python -m
vmtax.helpers.serving_tools` builds whatever is missing ahead of time (`make test` does).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable

from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.helpers import go_toolchain
from vmtax.host import build_progress, proc

VEGETA_MODULE = "github.com/tsenart/vegeta/v12"
VEGETA_VERSION = "v12.13.0"
SOURCE = Path(__file__).resolve().parents[3] / "tools" / "httpd"
BUILD_TIMEOUT = 1800.0
CLIP_SIZE = "640x360"
CLIP_RATE = 25


def home() -> Path:
    path = paths.cache_dir() / "serving"
    path.mkdir(exist_ok=True)
    return path


def httpd_path() -> Path:
    return home() / f"httpd-{go_toolchain.source_digest(SOURCE)}" / "httpd"


def vegeta_path() -> Path:
    return home() / f"vegeta-{VEGETA_VERSION}_go{go_toolchain.GO_VERSION}" / "vegeta"


def built() -> bool:
    return httpd_path().exists() and vegeta_path().exists()


def _publish(target: Path, build: Callable[[Path], None]) -> None:
    """target's directory made by build(scratch) the first time, published whole, so a
    binary in the cache is always a complete one."""
    if target.exists():
        return
    with open(home() / ".lock", "w") as lock:
        # A second vmtax waits for the first one's build instead of doing it again.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return
        for stale in home().glob(".build-*"):     # left by a build that was killed
            shutil.rmtree(stale)
        scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=home()))
        try:
            build(scratch)
            scratch.chmod(0o755)
            shutil.rmtree(target.parent, ignore_errors=True)
            scratch.rename(target.parent)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def how_built() -> tuple[bool, str]:
    """Whether the server and vegeta can be built here, and from what (for doctor)."""
    go = go_toolchain.bootstrap_go()
    if go is None:
        return False, (f"not built yet, and building it needs Go: {go_toolchain.INSTALL} "
                       "(the first serving run builds it)")
    return True, (f"not built yet: the first serving run builds it from {SOURCE} with {go}, "
                  f"and vegeta {VEGETA_VERSION} with Go {go_toolchain.GO_VERSION} from the "
                  "Go module proxy (a minute or two)")


def _build_httpd(scratch: Path, progress: build_progress.Build) -> None:
    # Standard library only and written for Go 1.19: Debian's own Go builds it offline.
    go = go_toolchain.bootstrap_go()
    if go is None:
        raise VmtaxError(f"serving: needs Go to build tools/httpd ({go_toolchain.INSTALL})")
    gopath = scratch / "go"
    progress.describe("building tools/httpd")
    go_toolchain.run_go([go, "build", "-trimpath", "-o", str(scratch / "httpd"), "."],
                        go_toolchain.go_env(gopath), SOURCE, "building tools/httpd",
                        "serving")
    shutil.rmtree(gopath)


def _build_vegeta(scratch: Path, progress: build_progress.Build) -> None:
    # vegeta needs Go >= 1.22: the pinned toolchain, which runsc's build uses too.
    if go_toolchain.go_arch() is None:
        raise VmtaxError(f"serving: no Go toolchain for {os.uname().machine}")
    gopath = home() / "go"
    progress.describe(f"downloading Go {go_toolchain.GO_VERSION}")
    go = go_toolchain.fetch_toolchain(gopath, scratch, "serving", "vegeta")
    progress.describe(f"building vegeta {VEGETA_VERSION}")
    go_toolchain.run_go([go, "install", "-trimpath", f"{VEGETA_MODULE}@{VEGETA_VERSION}"],
                        {**go_toolchain.go_env(gopath), "GOBIN": str(scratch)}, scratch,
                        f"building vegeta {VEGETA_VERSION}", "serving")
    # The toolchain and the module and build caches only speed up another pin's build;
    # a failed build keeps them for its retry.
    shutil.rmtree(gopath)


def build() -> None:
    """The server and vegeta, built into the cache the first time (a minute or two)."""
    httpd = httpd_path()
    if not built():
        with build_progress.Build("serving workload's server and vegeta",
                                  "serving-tools", logged=False) as progress:
            _publish(httpd, lambda scratch: _build_httpd(scratch, progress))
            _publish(vegeta_path(), lambda scratch: _build_vegeta(scratch, progress))
    for old in home().glob("httpd-*"):      # servers built from earlier sources
        if old != httpd.parent:
            shutil.rmtree(old)


def clip_path(seconds: int) -> Path:
    return home() / f"clip-{CLIP_SIZE}-{seconds}s.mp4"


def clip(seconds: int) -> Path:
    """A `seconds`-long 640x360 H.264 clip of ffmpeg's test pattern, made once."""
    path = clip_path(seconds)
    if path.exists():
        return path
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise VmtaxError("serving: ffmpeg is not installed (apt-get install ffmpeg)")
    tmp = home() / f".clip-{os.getpid()}.mp4"
    try:
        done = proc.run([ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-f",
                         "lavfi", "-i", f"testsrc2=size={CLIP_SIZE}:rate={CLIP_RATE}:"
                         f"duration={seconds}", "-c:v", "libx264", "-pix_fmt", "yuv420p",
                         "-y", str(tmp)], timeout=300)
        if done.exit_code != 0:
            raise VmtaxError(f"serving: making the {seconds} s test clip failed: "
                             f"{done.stderr.strip()[-300:]}")
        tmp.rename(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


DEFAULT_CLIP_SECONDS = 2


def main() -> int:
    try:
        build()
        clip(DEFAULT_CLIP_SECONDS)
    except VmtaxError as exc:
        print(f"vmtax: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
