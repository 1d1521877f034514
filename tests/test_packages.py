"""Debian packages on a plugin's first use (issue 48.18): `make run` installs only what the
default plan needs; a plan's other plugins get theirs when it first runs, no service
started meanwhile."""

import os
import stat

import pytest
from conftest import vmtax

from vmtax.core.errors import VmtaxError
from vmtax.host import packages
from vmtax.host.journal import Journal


def test_the_default_plan_needs_none_of_the_heavy_plugins_packages():
    """Chromium, LXD, libvirt, MariaDB and Docker are not needed for the first table."""
    default = vmtax("list", "packages", "--plan", "default", check=True).stdout.split()
    every = set(vmtax("list", "packages", check=True).stdout.split())
    assert {"qemu-system-x86", "sysbench", "runc", "busybox-static"} <= set(default)
    assert not {"docker.io", "lxd", "libvirt-daemon-system", "mariadb-server", "chromium",
                "ffmpeg", "golang-go", "libclang-dev"} & set(default)
    assert set(default) < every
    docker = vmtax("list", "packages", "--plan", "plans/docker.toml", check=True).stdout.split()
    assert "docker.io" in docker and "lxd" not in docker


def test_what_a_target_builds_brings_its_packages_where_it_is_declared(tmp_path):
    """make deps installs `vmtax list packages` before make builds: a VMM's cargo build
    (Firecracker's bindgen needs libclang, its seccomp libseccomp) and the minimal guest
    kernel get their packages from the build's own declaration, and a plan's microVM
    target gets its guest image's (cpio, e2fsprogs) as vm does."""
    from vmtax.core import target as targets
    from vmtax.guest import minimal_kernel

    every = set(vmtax("list", "packages", check=True).stdout.split())
    for kind in ("firecracker", "cloud-hypervisor"):
        assert set(targets.get(kind).source_build.packages) <= set(targets.get(kind).packages)
    assert {"libclang-dev", "libseccomp-dev", *minimal_kernel.PACKAGES} <= every
    plan = tmp_path / "microvms.toml"
    plan.write_text('[targets.fc]\nkind = "firecracker"\nkernel = "minimal"\n'
                    '[targets.ch]\nkind = "cloud-hypervisor"\n[[workloads]]\nname = "cpu"\n')
    needed = set(vmtax("list", "packages", "--plan", str(plan), check=True).stdout.split())
    assert {"libclang-dev", "cpio", "e2fsprogs", *minimal_kernel.PACKAGES} <= needed
    default = set(vmtax("list", "packages", "--plan", "default", check=True).stdout.split())
    assert not set(minimal_kernel.PACKAGES) - {"xz-utils"} & default


def test_what_is_missing_is_asked_of_dpkg():
    assert packages.missing(["coreutils", "vmtax-no-such-package"]) == [
        "vmtax-no-such-package"]


@pytest.fixture
def fake_apt(tmp_path, monkeypatch):
    """apt-get on PATH that records its arguments and whether policy-rc.d was in place."""
    policy = tmp_path / "policy-rc.d"
    log = tmp_path / "apt.log"
    apt = tmp_path / "bin" / "apt-get"
    apt.parent.mkdir()
    apt.write_text(f'#!/bin/sh\necho "$* policy=$(test -x {policy} && echo yes)" >> {log}\n')
    apt.chmod(apt.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{apt.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(packages, "POLICY", policy)
    return policy, log


@pytest.mark.skipif(os.geteuid() != 0, reason="installing is root's")
def test_a_first_use_installs_with_no_service_started_and_says_so(tmp_path, fake_apt):
    policy, log = fake_apt
    journal = Journal(tmp_path / "journal")
    said = []
    packages.install(["docker.io"], journal, said.append, "container:docker")
    assert said == ["installing the Debian packages container:docker needs, on its first "
                    "use: docker.io (apt-get)"]
    assert log.read_text().splitlines() == [
        "update -qq policy=yes", "install -y -qq --no-install-recommends docker.io policy=yes"]
    assert not policy.exists() and journal.entries == {}


def test_a_user_who_cannot_install_is_told_what_to_run(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(VmtaxError) as err:
        packages.install(["docker.io", "iperf3"], Journal(tmp_path / "j"), print, "this plan")
    assert str(err.value) == ("this plan needs Debian packages that are not installed: "
                              "docker.io iperf3; install them: sudo apt-get install docker.io "
                              "iperf3")
