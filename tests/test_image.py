"""Guest image builder: cpio writer, kernel extraction, module selection, caching."""

import gzip
import hashlib
import io
import json
import lzma
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from vmtax.core.errors import VmtaxError
from vmtax.guest import image
from vmtax.guest.image import (
    CpioEntry,
    GuestImage,
    extract_vmlinux,
    kernel_version,
    tree_entries,
    user_kernel,
    write_cpio,
)

ELF = b"\x7fELF\x02\x01\x01" + b"\0" * 57 + b"Linux version 6.1.0-99-test (me@host) (gcc) #1 SMP\0"


def entries():
    return [CpioEntry("bin", stat.S_IFDIR | 0o755),
            CpioEntry("bin/hello", stat.S_IFREG | 0o755, b"#!/bin/sh\necho hi\n"),
            CpioEntry("bin/sh", stat.S_IFLNK | 0o777, b"/bin/busybox"),
            CpioEntry("data", stat.S_IFREG | 0o644, b"x" * 4097),
            CpioEntry("dev", stat.S_IFDIR | 0o755),
            CpioEntry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)),
            CpioEntry("empty", stat.S_IFREG | 0o600)]


def test_cpio_lists_with_cpio_tool(tmp_path):
    archive = tmp_path / "a.cpio"
    with open(archive, "wb") as f:
        write_cpio(f, entries())
    listing = subprocess.run(["cpio", "-itv", "-F", str(archive)], capture_output=True,
                             text=True, check=True).stdout.splitlines()
    names = [line.split()[-1] if "->" not in line else line.split()[-3] for line in listing]
    assert names == ["bin", "bin/hello", "bin/sh", "data", "dev", "dev/console", "empty"]
    modes = [line.split()[0] for line in listing]
    assert modes == ["drwxr-xr-x", "-rwxr-xr-x", "lrwxrwxrwx", "-rw-r--r--", "drwxr-xr-x",
                     "crw-------", "-rw-------"]
    assert all(" root " in line for line in listing)
    assert "bin/sh -> /bin/busybox" in listing[2]


def test_cpio_extracts_identical_contents(tmp_path):
    archive = tmp_path / "a.cpio"
    with open(archive, "wb") as f:
        write_cpio(f, [e for e in entries() if not stat.S_ISCHR(e.mode)])
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["cpio", "-id", "--no-absolute-filenames", "-F", str(archive)], cwd=out,
                   check=True, capture_output=True)
    assert (out / "bin/hello").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert os.access(out / "bin/hello", os.X_OK)
    assert os.readlink(out / "bin/sh") == "/bin/busybox"
    assert (out / "data").read_bytes() == b"x" * 4097
    assert (out / "empty").read_bytes() == b""


def test_cpio_is_deterministic_and_aligned(tmp_path):
    first, second = io.BytesIO(), io.BytesIO()
    write_cpio(first, entries())
    src = tmp_path / "file"
    src.write_bytes(b"#!/bin/sh\necho hi\n")
    os.utime(src, (12345, 12345))
    from_path = [CpioEntry(e.name, e.mode, src) if e.name == "bin/hello" else e
                 for e in entries()]
    write_cpio(second, from_path)
    assert first.getvalue() == second.getvalue()
    data = first.getvalue()
    assert data.startswith(b"070701") and len(data) % 4 == 0
    assert data.rstrip(b"\0").endswith(b"TRAILER!!!")
    mtime_field = data[6 + 8 * 5:6 + 8 * 6]
    assert mtime_field == b"00000000"


def test_tree_entries(tmp_path):
    root = tmp_path / "root"
    (root / "d/sub").mkdir(parents=True)
    (root / "d/sub/f").write_text("hi")
    (root / "d/link").symlink_to("sub/f")
    got = tree_entries(root)
    assert sorted(got) == ["d", "d/link", "d/sub", "d/sub/f"]
    assert got["d/link"].data == b"sub/f" and stat.S_ISLNK(got["d/link"].mode)
    assert got["d/sub/f"].data == root / "d/sub/f"


# --- kernels -----------------------------------------------------------------------------

def test_extract_vmlinux_from_xz_bzimage():
    blob = b"MZ" + b"\x00" * 1000 + b"\xfd7zXZ\x00 decoy" + lzma.compress(ELF) + b"\0" * 64
    assert extract_vmlinux(blob) == ELF


def test_extract_vmlinux_from_gzip():
    assert extract_vmlinux(b"boot" * 100 + gzip.compress(ELF) + b"tail") == ELF


def test_extract_vmlinux_passthrough_and_failure():
    assert extract_vmlinux(ELF) is ELF
    assert extract_vmlinux(b"MZ not a kernel") is None
    assert extract_vmlinux(b"MZ" + lzma.compress(b"not an elf")) is None


def test_kernel_version():
    assert kernel_version(ELF) == "6.1.0-99-test"
    header = bytearray(0x400)
    header[0x202:0x206] = b"HdrS"
    header[0x20E:0x210] = (0x100).to_bytes(2, "little")
    header[0x300:0x320] = b"6.9.1-custom (root@box) #2\0"
    assert kernel_version(bytes(header)) == "6.9.1-custom"
    assert kernel_version(b"nothing") is None


def test_user_kernel_missing(tmp_path):
    with pytest.raises(VmtaxError, match="kernel /no/such/vmlinuz not found"):
        user_kernel("/no/such/vmlinuz", tmp_path)


def test_user_kernel_bzimage_is_extracted_and_cached(tmp_path):
    src = tmp_path / "bzImage"
    src.write_bytes(b"MZ" + b"\0" * 600 + lzma.compress(ELF))
    kernel = user_kernel(src, tmp_path / "cache")
    assert kernel.path.read_bytes() == ELF and kernel.path != src
    assert kernel.version == "6.1.0-99-test"
    assert kernel.modules == {} and kernel.modules_dir is None
    again = user_kernel(src, tmp_path / "cache")
    assert again == kernel


def test_user_kernel_elf_used_as_is(tmp_path):
    src = tmp_path / "vmlinux"
    src.write_bytes(ELF)
    kernel = user_kernel(src, tmp_path / "cache")
    assert kernel.path == src.resolve()


def test_a_kernel_vmtax_built_given_by_its_path_is_the_one_it_built(tmp_path):
    built = tmp_path / "cache" / "kernels" / "minimal-0123456789abcdef"
    built.mkdir(parents=True)
    (built / "vmlinux").write_bytes(ELF)
    (built / "meta.json").write_text(json.dumps({
        "path": "vmlinux", "version": "6.1.192", "sha256": hashlib.sha256(ELF).hexdigest(),
        "modules": {}, "hz": 1000,
        "params": ["lapic_timer_period"]}))
    kernel = user_kernel(built / "vmlinux", tmp_path / "cache")
    # Its HZ and boot parameters, as by name (a copy elsewhere is only a user's kernel).
    assert (kernel.hz, kernel.params, kernel.path) == (
        1000, ("lapic_timer_period",), built / "vmlinux")
    elsewhere = tmp_path / "vmlinux"
    elsewhere.write_bytes(ELF)
    assert user_kernel(elsewhere, tmp_path / "cache").params == ()


def test_insmod_order_skips_crc32c_intel_and_builtins(monkeypatch, tmp_path):
    shown = ("insmod /m/lib/modules/v/kernel/arch/x86/crypto/crc32c-intel.ko \n"
             "insmod /m/lib/modules/v/kernel/crypto/crc32c_generic.ko \n"
             "builtin mbcache\n"
             "insmod /m/lib/modules/v/kernel/fs/ext4/ext4.ko \n")

    def fake_run(argv, **kwargs):
        assert argv[:5] == ["modprobe", "-d", "/m", "-S", "v"]
        return subprocess.CompletedProcess(argv, 0, shown, "")
    monkeypatch.setattr(image.subprocess, "run", fake_run)
    assert [p.name for p in image._insmod_order(Path("/m"), "v", "ext4")] == [
        "crc32c_generic.ko", "ext4.ko"]


def test_select_modules_phases(monkeypatch, tmp_path):
    root = tmp_path / "tree"
    deps = {"virtio_mmio": ["virtio_ring", "virtio", "virtio_mmio"],
            "virtio_pci": ["virtio_ring", "virtio", "virtio_pci"],
            "virtio_console": ["virtio_ring", "virtio", "virtio_console"],
            "virtio_blk": ["virtio_ring", "virtio", "virtio_blk"],
            "crc32c_generic": ["crc32c_generic"], "ext4": ["crc32c_generic", "jbd2", "ext4"],
            "virtio_net": ["virtio_ring", "virtio", "failover", "net_failover", "virtio_net"],
            "virtio_scsi": ["virtio_ring", "virtio", "scsi_mod", "virtio_scsi"],
            "sd_mod": ["scsi_mod", "sd_mod"], "nvme": ["nvme_core", "nvme"],
            "vmw_vsock_virtio_transport": ["virtio_ring", "virtio", "vsock",
                                           "vmw_vsock_virtio_transport_common",
                                           "vmw_vsock_virtio_transport"]}
    for mods in deps.values():
        for m in mods:
            (root / f"{m}.ko").parent.mkdir(parents=True, exist_ok=True)
            (root / f"{m}.ko").write_text(m)
    monkeypatch.setattr(image, "_insmod_order",
                        lambda r, v, m: [root / f"{d}.ko" for d in deps[m]])
    phases = image.select_modules(root, "v", tmp_path / "out")
    assert phases == {
        "boot-mmio": ["virtio_ring.ko", "virtio.ko", "virtio_mmio.ko", "virtio_console.ko"],
        "boot-pci": ["virtio_ring.ko", "virtio.ko", "virtio_pci.ko", "virtio_console.ko"],
        "disk": ["virtio_blk.ko", "crc32c_generic.ko", "jbd2.ko", "ext4.ko"],
        "net": ["failover.ko", "net_failover.ko", "virtio_net.ko"],
        "scsi": ["scsi_mod.ko", "virtio_scsi.ko", "sd_mod.ko"],
        "nvme": ["nvme_core.ko", "nvme.ko"],
        # The agent's channel under Firecracker and Cloud Hypervisor, after boot's phase.
        "vsock": ["vsock.ko", "vmw_vsock_virtio_transport_common.ko",
                  "vmw_vsock_virtio_transport.ko"]}
    assert (tmp_path / "out/ext4.ko").read_text() == "ext4"


def test_module_error_is_one_line(monkeypatch):
    monkeypatch.setattr(image.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(
        argv, 1, "", "modprobe: FATAL: Module virtio_console not found.\n"))
    with pytest.raises(VmtaxError) as err:
        image._insmod_order(Path("/m"), "v", "virtio_console")
    assert "\n" not in str(err.value) and "virtio_console" in str(err.value)


# --- the image ---------------------------------------------------------------------------

def listing(path: Path) -> list[str]:
    return subprocess.run(["cpio", "-it", "-F", str(path)], capture_output=True, text=True,
                          check=True).stdout.split()


def test_guest_image_initramfs(tmp_path):
    kernel = tmp_path / "vmlinux"
    kernel.write_bytes(ELF)
    img = GuestImage([], kernel, cache=tmp_path / "cache")
    assert img.kernel() == kernel.resolve()
    initramfs = img.initramfs()
    names = listing(initramfs)
    for name in ("init", "vmtax/agent", "vmtax/disk", "dev/console", "bin/busybox", "bin/sh",
                 "tmp", "work", "proc"):
        assert name in names
    assert ".complete" not in names
    assert names == sorted(names)
    fp = img.fingerprint()
    assert fp == {"kernel_version": "6.1.0-99-test", "kernel_sha256": fp["kernel_sha256"],
                  "initramfs": initramfs.stem, "binaries": []}
    assert len(fp["kernel_sha256"]) == 16

    # A second image over the same inputs reuses the cache, quickly.
    mtime = initramfs.stat().st_mtime_ns
    start = time.monotonic()
    again = GuestImage([], kernel, cache=tmp_path / "cache")
    assert again.initramfs() == initramfs and again.kernel() == img.kernel()
    assert time.monotonic() - start < 0.5
    assert initramfs.stat().st_mtime_ns == mtime

    # A changed input (the kernel) gives another initramfs.
    kernel.write_bytes(ELF + b"v2")
    changed = GuestImage([], kernel, cache=tmp_path / "cache").initramfs()
    assert changed != initramfs


def test_guest_image_includes_binaries_and_libraries(tmp_path):
    kernel = tmp_path / "vmlinux"
    kernel.write_bytes(ELF)
    names = listing(GuestImage(["sysbench"], kernel, cache=tmp_path / "cache").initramfs())
    assert any(n.endswith("bin/sysbench") for n in names)
    assert any("libc.so" in n for n in names)
