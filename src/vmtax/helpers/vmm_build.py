"""A VMM (Firecracker, Cloud Hypervisor) built from its release source tarball on first use,
once, into vmtax's cache, with a progress bar and the time left, as the minimal kernel is.

A user's own binary (a release download, one on PATH) is used as it is; this is for a host
without one. The tarball is the user's to give (a VMM target's `source`): vmtax downloads
nothing. Its git dependencies (Cargo.lock's `git+URL#COMMIT` sources: micro-http for both)
are taken from tarballs beside it, named `NAME-COMMIT7.tar.gz` (NAME the URL's last part),
through cargo's `[patch]`; without one, cargo fetches the dependency itself. Crates come
from crates.io. The build runs in a work directory of the cache kept across a failed
build's retry (cargo's own cache makes it incremental), and the binary is published with a
meta.json that records the source's and the binary's sha256: a cached build is used only
while its binary still has that hash.

Built once per source tarball (its sha256): `python -m vmtax.helpers.vmm_build TARBALL...`
builds ahead of time (`make builds` does, for the live tests).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.guest.kernel_cache import build_lock, publish_dir
from vmtax.host import binary, build_progress

BUILD_TIMEOUT = 3600.0
# cargo's line per compiled crate: the bar's step.
CARGO_STEP = re.compile(r"^\s+Compiling \S+ v")
_GIT_SOURCE = re.compile(r'^source = "git\+(https://[^"?#]+)[^"#]*#([0-9a-f]{7,40})"$',
                         re.MULTILINE)
RUSTUP_HINT = "install Rust with rustup (https://rustup.rs)"


@dataclass(frozen=True)
class CargoBuild:
    """How one VMM builds from its release source: what its plugin declares."""
    name: str                    # "firecracker": the binary, and the tarball's stem
    title: str                   # "Firecracker", in messages
    package: str                 # cargo -p
    target: str | None = None    # --target, where the project's default is not the host's
    # Debian packages the build needs (bindgen's libclang, libseccomp).
    packages: tuple[str, ...] = ()

    def version_of(self, tarball: Path) -> str:
        """"1.16.1" from firecracker-1.16.1.tar.gz; VmtaxError for another name."""
        match = re.fullmatch(rf"{re.escape(self.name)}-v?(\d[\w.+-]*)\.tar\.gz", tarball.name)
        if match is None:
            raise VmtaxError(f"{self.name}: source {tarball}: expected a release tarball "
                             f"named {self.name}-VERSION.tar.gz")
        return match[1]


def _home() -> Path:
    home = paths.cache_dir() / "vmm"
    home.mkdir(parents=True, exist_ok=True)
    return home


def _meta(directory: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((directory / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _verified(build: CargoBuild, directory: Path) -> Path | None:
    """The binary of a published build, while it still has the hash its meta.json records."""
    meta = _meta(directory)
    program = directory / build.name
    if meta is None or not program.is_file():
        return None
    try:
        return program if binary.sha256(program) == meta.get("binary_sha256") else None
    except OSError:
        return None


def cached(build: CargoBuild) -> Path | None:
    """The newest verified build of this VMM in the cache, whatever its source."""
    found = sorted(_home().glob(f"{build.name}-*/meta.json"), key=lambda p: p.stat().st_mtime)
    for meta in reversed(found):
        program = _verified(build, meta.parent)
        if program is not None:
            return program
    return None


def built_from(build: CargoBuild, tarball: Path) -> Path:
    """The VMM built from tarball: the cached build, or a new one (minutes)."""
    if not tarball.is_file():
        raise VmtaxError(f"{build.name}: source {tarball} not found (the release source "
                         f"tarball, {build.name}-VERSION.tar.gz)")
    version = build.version_of(tarball)
    key = binary.sha256(tarball)[:12]
    dest = _home() / f"{build.name}-{version}-{key}"
    program = _verified(build, dest)
    if program is not None:
        return program
    with build_lock(dest):
        if (program := _verified(build, dest)) is not None:
            return program
        shutil.rmtree(dest, ignore_errors=True)   # a build whose binary no longer matches
        _build(build, tarball, version, key, dest)
    program = _verified(build, dest)
    if program is None:
        raise VmtaxError(f"{build.name}: the build in {dest} has no intact {build.name}")
    return program


def _cargo() -> str:
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    if not os.access(cargo, os.X_OK):
        raise VmtaxError(f"building a VMM needs Rust's cargo, which is not installed: "
                         f"{RUSTUP_HINT}")
    return cargo


def _toolchain(src: Path) -> dict[str, str]:
    """The environment that picks the project's pinned toolchain when rustup has it
    installed: rustup would otherwise try to download it (and its musl targets)."""
    try:
        pinned = re.search(r'^channel\s*=\s*"([^"]+)"', (src / "rust-toolchain.toml")
                           .read_text(), re.MULTILINE)
    except OSError:
        return {}
    rustup = shutil.which("rustup") or str(Path.home() / ".cargo" / "bin" / "rustup")
    if pinned is None or not os.access(rustup, os.X_OK):
        return {}
    listed = subprocess.run([rustup, "toolchain", "list"], capture_output=True, text=True)
    for line in listed.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name == pinned[1] or name.startswith(pinned[1] + "-"):
            return {"RUSTUP_TOOLCHAIN": name}
    return {}


def _unpack(tarball: Path, dest: Path) -> None:
    """The one top directory of tarball, unpacked as dest (members that would land outside
    it, links out and devices are refused by tarfile's data filter)."""
    scratch = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    try:
        with tarfile.open(tarball) as archive:
            archive.extractall(scratch, filter="data")
        tops = [p for p in scratch.iterdir() if p.is_dir()]
        if len(tops) != 1:
            raise VmtaxError(f"{tarball}: expected one top directory, found {len(tops)}")
        tops[0].rename(dest)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _release_lock(tarball: Path) -> str:
    """The Cargo.lock the release shipped: cargo rewrites the unpacked one once a [patch]
    replaces a git source, which then no longer names it."""
    with tarfile.open(tarball) as archive:
        for member in archive:
            if member.isfile() and member.name.count("/") == 1 \
                    and member.name.endswith("/Cargo.lock"):
                lock = archive.extractfile(member)
                if lock is not None:
                    return lock.read().decode(errors="replace")
    raise VmtaxError(f"{tarball}: no Cargo.lock at its top (a Rust release source tarball)")


def _patches(lock: str, tarball: Path, deps: Path) -> list[str]:
    """cargo --config arguments pointing each git dependency at its tarball beside the
    source, where there is one."""
    args = []
    for url, commit in sorted(set(_GIT_SOURCE.findall(lock))):
        dep = url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")
        archive = tarball.parent / f"{dep}-{commit[:7]}.tar.gz"
        if not archive.is_file():
            continue   # cargo fetches it from git
        where = deps / archive.name.removesuffix(".tar.gz")
        if not where.is_dir():
            deps.mkdir(exist_ok=True)
            _unpack(archive, where)
        args += ["--config", f'patch."{url}".{dep.replace("-", "_")}.path="{where}"']
    return args


def _build(build: CargoBuild, tarball: Path, version: str, key: str, dest: Path) -> None:
    work = _home() / f".build-{build.name}-{key}"
    work.mkdir(exist_ok=True)
    src = work / "src"
    started = time.monotonic()
    with build_progress.Build(f"{build.title} {version} from {tarball.name}",
                              f"{build.name}-{version}",
                              note="; a VMM takes 5-20 min on 2 cores") as progress:
        if not src.is_dir():
            progress.describe("unpacking its source")
            _unpack(tarball, src)
        lock = _release_lock(tarball)
        argv = [_cargo(), "build", "--release", "-p", build.package, "--bin", build.name,
                *(["--target", build.target] if build.target else []),
                *_patches(lock, tarball, work / "deps")]
        env = {**os.environ, "CARGO_TARGET_DIR": str(work / "target"), **_toolchain(src)}
        crates = len(re.findall(r"^\[\[package\]\]$", lock, re.MULTILINE))
        progress.run(argv, src, f"cargo build of {build.name}", timeout=BUILD_TIMEOUT,
                     steps=CARGO_STEP, key=f"{build.name}-{version}", expected=crates,
                     env=env)
    out = work / "target" / (build.target or "") / "release" / build.name
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        shutil.copy2(out, tmp / build.name)
        rustc = subprocess.run([_cargo(), "--version"], capture_output=True, text=True,
                               env=env).stdout.strip()
        (tmp / "meta.json").write_text(json.dumps({
            "name": build.name, "version": version, "source": str(tarball.resolve()),
            "source_sha256": binary.sha256(tarball), "binary_sha256": binary.sha256(
                tmp / build.name), "cargo": rustc, "argv": argv[1:],
            "seconds": round(time.monotonic() - started, 1)}, indent=1))
        tmp.chmod(0o755)
        publish_dir(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(work, ignore_errors=True)   # sources and objects: GBs


def main(argv: list[str]) -> int:
    """Build each VMM whose release tarball is named (its plugin says how)."""
    from vmtax.core import target as target_mod

    builds = {build.name: build for cls in target_mod.kinds().values()
              if isinstance(build := cls.source_build, CargoBuild)}
    try:
        for arg in argv:
            tarball = Path(arg)
            name = next((n for n in builds if tarball.name.startswith(n + "-")), None)
            if name is None:
                raise VmtaxError(f"{tarball}: no VMM target builds from it (known: "
                                 + ", ".join(sorted(builds)) + ")")
            print(built_from(builds[name], tarball))
    except VmtaxError as exc:
        print(f"vmtax: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # The module's own name, so that its CargoBuild is the one the targets declare with.
    from vmtax.helpers.vmm_build import main as module_main
    sys.exit(module_main(sys.argv[1:]))
