"""Guest kernel choice for E2: "debian", "debian-rt" or a file, as an option value and as
the kernel image.py prepares."""

import hashlib
import json
import os
import time

import pytest
from test_image import ELF

from vmtax.core import plugin
from vmtax.core.errors import VmtaxError
from vmtax.core.option_types import DEBIAN_KERNEL_NAMES, GuestKernel
from vmtax.guest import image


class KernelOptions(plugin.Options):
    kernel: GuestKernel = plugin.option("debian", "guest kernel")


def test_option_takes_the_names_and_files_and_says_what_else(tmp_path):
    vmlinux = tmp_path / "vmlinux"
    vmlinux.write_bytes(ELF)
    for value in ("debian", "debian-rt", "minimal", str(vmlinux)):
        assert plugin.build(KernelOptions, {"kernel": value}, "vm").kernel == value
    assert plugin.build(KernelOptions, {}, "vm").kernel == "debian"
    with pytest.raises(VmtaxError, match=r'vm: kernel: expected "debian" \(Debian\'s kernel\), '
                       r'"debian-rt" \(its PREEMPT_RT kernel\), "minimal" \(built by vmtax\) or '
                       r"the path of a vmlinux or bzImage file, got 'debian-lts'"):
        plugin.build(KernelOptions, {"kernel": "debian-lts"}, "vm")
    assert DEBIAN_KERNEL_NAMES == tuple(image.DEBIAN_KERNELS)


def _built(cache, name, age):
    """A prepared Debian kernel in the cache, as _build_debian_kernel leaves it: its record
    claims the sha256 its file has (a cached kernel is used only then)."""
    kdir = cache / "kernels" / f"{name}_6.1.192-2_amd64-70000000-f{image.FORMAT}"
    kdir.mkdir(parents=True)
    vmlinux = ELF + name.encode()
    (kdir / "vmlinux").write_bytes(vmlinux)
    (kdir / "meta.json").write_text(json.dumps(
        {"path": "vmlinux", "version": name.removeprefix("linux-image-"),
         "sha256": hashlib.sha256(vmlinux).hexdigest(),
         "modules": {}, "hz": 250}))
    stamp = time.time() - age
    os.utime(kdir / "meta.json", (stamp, stamp))


def test_each_debian_choice_finds_its_own_flavour_in_the_cache(tmp_path):
    # The RT kernel prepared last must not become the general-purpose one.
    _built(tmp_path, "linux-image-6.1.0-56-amd64", age=100)
    _built(tmp_path, "linux-image-6.1.0-56-rt-amd64", age=10)
    assert image.guest_kernel("debian", tmp_path).version == "6.1.0-56-amd64"
    assert image.guest_kernel("debian-rt", tmp_path).version == "6.1.0-56-rt-amd64"
    assert image.GuestImage([], None, cache=tmp_path).kernel_info().version == "6.1.0-56-amd64"
    assert image.GuestImage([], "debian-rt", cache=tmp_path).kernel_info().version == (
        "6.1.0-56-rt-amd64")


def test_a_path_is_a_user_kernel(tmp_path):
    vmlinux = tmp_path / "vmlinux"
    vmlinux.write_bytes(ELF)
    assert image.guest_kernel(str(vmlinux), tmp_path / "cache").version == "6.1.0-99-test"
    with pytest.raises(VmtaxError, match="kernel debian-lts not found"):
        image.guest_kernel("debian-lts", tmp_path / "cache")


@pytest.mark.live
def test_apt_resolves_the_rt_meta_package():
    package = image._apt_kernel_package(image.DEBIAN_KERNELS["debian-rt"])
    assert package.startswith("linux-image-") and package.endswith("-rt-amd64")
