"""The minimal guest kernel's configuration and cache key (the build and a boot of it:
tests/test_minimal_kernel_live.py)."""

import hashlib
import json
from pathlib import Path

import pytest

from vmtax.core.errors import VmtaxError
from vmtax.guest import image, minimal_kernel


def test_everything_a_guest_needs_is_asked_for_built_in():
    lines = minimal_kernel.config_lines()
    for needed in ("PVH", "VIRTIO_MENU", "VIRTIO_MMIO", "VIRTIO_PCI", "VIRTIO_CONSOLE",
                   "VIRTIO_BLK", "VIRTIO_NET", "EXT4_FS", "BLK_DEV_INITRD", "DEVTMPFS",
                   "SERIAL_8250_CONSOLE", "ACPI", "HUGETLBFS", "SYSVIPC"):
        assert f"CONFIG_{needed}=y" in lines
    assert not any(line.endswith("=m") for line in lines)   # nothing as a module
    # What costs boot time under TCG and no guest uses is asked away.
    for unwanted in ("LEGACY_PTYS", "SERIO", "VT", "IPV6"):
        assert f"# CONFIG_{unwanted} is not set" in lines
    assert "CONFIG_SERIAL_8250_NR_UARTS=1" in lines


def test_options_dropped_by_olddefconfig_are_named():
    config = "\n".join(minimal_kernel.config_lines()).replace("CONFIG_VIRTIO_MMIO=y\n", "")
    assert minimal_kernel.check_config(config) == ["VIRTIO_MMIO"]
    assert minimal_kernel.check_config("\n".join(minimal_kernel.config_lines())) == []


def test_options_selected_back_or_settings_changed_are_named():
    config = "\n".join(minimal_kernel.config_lines())
    config = config.replace("CONFIG_SERIAL_8250_NR_UARTS=1", "CONFIG_SERIAL_8250_NR_UARTS=4")
    assert minimal_kernel.check_config(config + "\nCONFIG_LEGACY_PTYS=y\n") == [
        "LEGACY_PTYS=n", "SERIAL_8250_NR_UARTS=1"]


def test_the_cache_key_follows_source_content_and_configuration(tmp_path, monkeypatch):
    tarball = tmp_path / "linux-source-6.1.tar.xz"
    tarball.write_bytes(b"source one")
    first = minimal_kernel.cache_key(tarball)
    assert minimal_kernel.cache_key(tarball) == first
    tarball.write_bytes(b"source two")
    second = minimal_kernel.cache_key(tarball)
    assert second != first
    monkeypatch.setattr(minimal_kernel, "CONFIG", (*minimal_kernel.CONFIG, "IPV6"))
    third = minimal_kernel.cache_key(tarball)
    assert third not in (first, second)
    monkeypatch.setattr(minimal_kernel, "SOURCE_EDITS", {})
    assert minimal_kernel.cache_key(tarball) not in (first, second, third)


def test_source_edits_are_made_where_their_text_is_and_skipped_elsewhere(tmp_path, monkeypatch):
    (tmp_path / "arch").mkdir()
    (tmp_path / "arch" / "a.c").write_text("int x = 0;\nint y;\n")
    (tmp_path / "arch" / "twice.c").write_text("int z;\nint z;\n")
    monkeypatch.setattr(minimal_kernel, "SOURCE_EDITS", {
        "x": ("arch/a.c", "int x = 0;\n", "int x = 1;\n"),
        "gone": ("arch/a.c", "int w;\n", "int v;\n"),
        "ambiguous": ("arch/twice.c", "int z;\n", "int q;\n"),
        "no file": ("arch/none.c", "", "int n;\n")})
    assert minimal_kernel.edit_source(tmp_path) == ["x"]
    assert (tmp_path / "arch" / "a.c").read_text() == "int x = 1;\nint y;\n"
    assert (tmp_path / "arch" / "twice.c").read_text() == "int z;\nint z;\n"
    assert not (tmp_path / "arch" / "none.c").exists()


def test_no_linux_source_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(minimal_kernel, "SOURCE_GLOB", str(tmp_path / "none-*.tar.xz"))
    with pytest.raises(VmtaxError, match="apt-get install linux-source") as info:
        minimal_kernel.minimal_kernel(tmp_path)
    assert "\n" not in str(info.value)
    assert minimal_kernel.cached(tmp_path) is None


def test_a_built_kernel_is_taken_from_the_cache(tmp_path, monkeypatch):
    tarball = tmp_path / "src" / "linux-source-6.1.tar.xz"
    tarball.parent.mkdir()
    tarball.write_bytes(b"source")
    monkeypatch.setattr(minimal_kernel, "SOURCE_GLOB", str(tarball.parent / "*.tar.xz"))
    dest = tmp_path / "kernels" / f"minimal-{minimal_kernel.cache_key(tarball)}"
    dest.mkdir(parents=True)
    (dest / "vmlinux").write_bytes(b"\x7fELF")
    (dest / "meta.json").write_text(json.dumps({"path": "vmlinux", "version": "6.1.0",
                                                "sha256": hashlib.sha256(b"\x7fELF").hexdigest(),
                                                "modules": {}, "hz": 1000,
                                                "params": ["lapic_timer_period"]}))

    def no_build(*args, **kwargs):
        raise AssertionError("built again")
    monkeypatch.setattr(minimal_kernel, "build", no_build)
    kernel = minimal_kernel.minimal_kernel(tmp_path)
    assert isinstance(kernel, image.Kernel)
    assert (kernel.path, kernel.modules, kernel.modules_dir, kernel.hz, kernel.params) == (
        dest / "vmlinux", {}, None, 1000, ("lapic_timer_period",))
    assert minimal_kernel.cached(tmp_path) == dest
    assert Path(kernel.path).read_bytes() == b"\x7fELF"
