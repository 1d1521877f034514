"""Read-only directory trees a workload reads in its targets (the compile workload's kernel
source and toolchain, vmtax.helpers.kernel_tree), too large for a root file system or initramfs.

A workload declares them (Workload.trees(): host directories); the runner gathers them into
the TargetContext, and every target shows each at its host path, read-only:
- native: the host directory itself;
- containers: a read-only bind mount of it at that path in the container's rootfs copy,
  made on the host before the first job (journaled, and undone before the copy is removed);
  every runtime uses that directory as the container's root, submounts included;
- VMs: an ext4 image of it, made on the host with `mkfs.ext4 -d` and cached by the tree's
  content hash, attached as a virtio-blk disk with readonly=on (serial vmtax-treeN) and
  mounted read-only by the guest (/vmtax/disk), by the Debian and the minimal kernel alike;
- ssh targets refuse them (the remote bundle carries programs only).
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from vmtax.core import paths
from vmtax.core.errors import TargetError, VmtaxError
from vmtax.host import proc
from vmtax.host.journal import Journal

FORMAT = "1"   # bump when the image layout changes, to invalidate caches
# The virtio-blk serial of the i-th tree disk: how the guest finds it.
SERIAL = "vmtax-tree{}"
# What containers mount file systems of their own on (vmtax.targets.container), hiding a
# tree bound below.
HIDDEN = ("/tmp", "/dev", "/proc", "/sys")


@functools.lru_cache(maxsize=8)
def content_hash(tree: Path) -> str:
    """SHA-256 over every path, mode and file content of the tree (trees are never
    modified once published, so once per process)."""
    h = hashlib.sha256(FORMAT.encode())
    for root, dirs, files in os.walk(tree):
        dirs.sort()
        for name in sorted(files) + [""]:
            path = os.path.join(root, name)
            st = os.lstat(path)
            h.update(f"{os.path.relpath(path, tree)}\0{st.st_mode:o}\0".encode())
            if name and os.path.isfile(path):
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
    return h.hexdigest()


def _size(tree: Path) -> int:
    """Bytes for an ext4 image holding the tree: its data in 4 KiB blocks, an inode each
    (256 B), and room for ext4's own metadata."""
    blocks = inodes = 0
    for root, dirs, files in os.walk(tree):
        inodes += len(dirs) + len(files)
        blocks += len(dirs) + sum(-(-os.lstat(os.path.join(root, f)).st_size // 4096)
                                  for f in files)
    return (blocks * 4096 + inodes * 256) * 5 // 4 + (16 << 20)


def ext4_image(tree: Path, cache: Path | None = None) -> Path:
    """A raw ext4 image of the tree (its files at the image's root), cached by content."""
    base = (cache or paths.cache_dir()) / "tree-images"
    dest = base / f"{tree.name}-{content_hash(tree)[:16]}.img"
    if dest.exists():
        return dest
    base.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}-", dir=base)
    try:
        os.truncate(fd, _size(tree))
        os.close(fd)
        # No journal: the guest never writes to it.
        done = proc.run(["mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-m", "0",
                         "-E", "root_owner=0:0", "-d", str(tree), tmp], timeout=600)
        if done.exit_code != 0:
            raise VmtaxError(f"mkfs.ext4 -d {tree} failed: {done.stderr.strip()[:300]}")
        os.rename(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def bind_readonly(journal: Journal, tree: Path, root: Path) -> int:
    """Show tree read-only at its own path under root (a container's rootfs copy); the
    journal token that unmounts it."""
    hidden = next((d for d in HIDDEN if tree.is_relative_to(d)), None)
    if hidden:
        raise TargetError(f"{tree} is under {hidden}, which containers mount a file system "
                          "of their own on: move it (VMTAX_CACHE)")
    dest = paths.under(root, tree, "a read-only tree for a container")
    dest.mkdir(parents=True, exist_ok=True)
    token = journal.add(type="umount", path=str(dest))
    for argv in (["mount", "--bind", str(tree), str(dest)],
                 ["mount", "-o", "remount,bind,ro", str(dest)]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            journal.undo(token)
            raise TargetError(f"{' '.join(argv)} failed: {done.stderr.strip()[:300]}")
    return token
