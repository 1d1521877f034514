"""Unit tests of the gVisor runtimes: their argv, their names, what they refuse, and how
runsc gets built by the pinned Go toolchain (with go faked: no toolchain is downloaded,
nothing is compiled)."""

import json
import os
from pathlib import Path

import pytest

from vmtax.core import plugin
from vmtax.core import target as targets
from vmtax.core.errors import VmtaxError
from vmtax.core.types import Job
from vmtax.host.proc import Completed
from vmtax.core.runtime import auto_order
from vmtax.core.target import REALTIME
from vmtax.helpers import go_toolchain
from vmtax.helpers.go_toolchain import GO_VERSION
from vmtax.host import machine
from vmtax.targets import runsc
from vmtax.targets.runsc import GVISOR_VERSION, Runsc, RunscPtrace

FLAGS = ["--network=none", "--ignore-cgroups", "--overlay2=none",
         "--gofer-network-namespace=new"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A private vmtax cache: no test sees or makes a real runsc."""
    path = tmp_path / "cache"
    monkeypatch.setenv("VMTAX_CACHE", str(path))
    monkeypatch.setattr(machine, "cgroup_mounts", lambda: [
        ("/sys/fs/cgroup/cpuset", "cgroup")])
    return path


@pytest.mark.parametrize("cls, platform", [(Runsc, "systrap"), (RunscPtrace, "ptrace")])
def test_launch_argv(tmp_path, cls, platform):
    rt = cls("/c/runsc", tmp_path / "home")
    launch = rt.launch(Job(["sysbench", "cpu", "run"]))
    base = ["/c/runsc", "--root", str(tmp_path / "home" / "state"),
            f"--platform={platform}", *FLAGS]
    assert launch.argv == [*base, "run", "--bundle", str(tmp_path / "home" / "bundle"),
                           launch.container]
    assert launch.undo == [*base, "delete", "--force", launch.container]
    cfg = json.loads((tmp_path / "home" / "bundle" / "config.json").read_text())
    assert cfg["process"]["args"] == ["sysbench", "cpu", "run"]
    assert cfg["root"]["path"] == str(tmp_path / "home" / "rootfs")


def test_bundle_and_root_are_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rt = Runsc("/c/runsc", Path("home"))
    launch = rt.launch(Job(["true"]))
    assert launch.argv[launch.argv.index("--bundle") + 1] == str(tmp_path / "home" / "bundle")
    cfg = json.loads((tmp_path / "home" / "bundle" / "config.json").read_text())
    assert cfg["root"]["path"] == str(tmp_path / "home" / "rootfs")


def test_cpus_by_affinity_not_the_ignored_cgroup(tmp_path):
    rt = Runsc("/c/runsc", tmp_path, [1])
    launch = rt.launch(Job(["true"]))
    assert rt.placement() == "affinity" and launch.preexec is not None
    cfg = json.loads((tmp_path / "bundle" / "config.json").read_text())
    assert "cpu" not in cfg["linux"]["resources"]
    assert Runsc("/c/runsc", tmp_path).placement() is None


def test_finish_deletes_only_a_container_that_is_left(tmp_path, monkeypatch):
    rt = Runsc("/c/runsc", tmp_path)
    launch = rt.launch(Job(["true"]))
    ran = []
    monkeypatch.setattr(runsc.proc, "run", lambda argv, **kw: ran.append(argv))
    assert rt.finish(launch) and ran == []
    # runsc's state: files named after sandbox and container, no directory per container.
    state = rt.state / f"{launch.container}_sandbox:{launch.container}.state"
    state.touch()

    def delete(argv, **kw):
        ran.append(argv)
        state.unlink()
    monkeypatch.setattr(runsc.proc, "run", delete)
    assert rt.finish(launch) and ran == [launch.undo]


def test_target_names():
    assert targets.parse_name("container:runsc") == ("container", {"runtime": "runsc"})
    assert targets.parse_name("container:runsc-ptrace") == (
        "container", {"runtime": "runsc-ptrace"})
    assert {"container:runsc", "container:runsc-ptrace"} <= set(targets.known_names())
    assert "runsc" not in auto_order()
    assert Runsc.packages == RunscPtrace.packages == ("golang-go",)


def test_gvisor_refuses_real_time_scheduling_on_either_platform():
    assert Runsc.refuses == RunscPtrace.refuses == {REALTIME: "gVisor"}
    kind = targets.get("container")

    def refused(runtime):
        return kind.refuses(plugin.build(kind.Options, {"runtime": runtime}, "c"))
    assert refused("runsc") == refused("runsc-ptrace") == {REALTIME: "gVisor"}
    assert refused("runc") == refused("auto") == {}   # auto never picks runsc


def test_go_env_is_private_and_pinned(cache, monkeypatch):
    monkeypatch.setenv("GOROOT", "/usr/local/go")
    monkeypatch.setenv("GOFLAGS", "-tags=x")
    monkeypatch.setenv("GOPROXY", "https://mirror.example")
    gopath = cache / "runsc" / "go"
    env = go_toolchain.go_env(gopath)
    assert env["GOPATH"] == str(gopath)
    assert env["GOMODCACHE"] == str(gopath / "pkg" / "mod")
    assert env["GOCACHE"] == str(gopath / "cache")
    assert env["GOTOOLCHAIN"] == "local" and env["CGO_ENABLED"] == "0"
    assert env["GOFLAGS"].split() == ["-mod=mod", "-modcacherw"]
    assert env["GOPROXY"] == "https://mirror.example" and "GOROOT" not in env
    assert env["PATH"] == os.environ["PATH"]


def test_commands(monkeypatch):
    monkeypatch.setattr(go_toolchain, "go_arch", lambda: "amd64")
    assert go_toolchain.download_command("/usr/bin/go") == [
        "/usr/bin/go", "mod", "download", "-json",
        f"golang.org/toolchain@v0.0.1-go{GO_VERSION}.linux-amd64"]
    assert runsc.build_command("/t/bin/go") == [
        "/t/bin/go", "install",
        f"-ldflags=-X gvisor.dev/gvisor/runsc/version.version={GVISOR_VERSION}",
        f"gvisor.dev/gvisor/runsc@{GVISOR_VERSION}"]


class FakeGo:
    """proc.run standing in for go: the download unpacks a toolchain without file modes,
    the build writes runsc into GOBIN."""

    def __init__(self, fail: str | None = None):
        self.calls: list[tuple[list[str], dict[str, str], str]] = []
        self.fail = fail

    def __call__(self, argv, *, env, cwd, timeout):
        self.calls.append((argv, env, cwd))
        if self.fail and self.fail in argv:
            return Completed(1, "", "go: downloading x\nline 2\nerror: it broke\n", 1.0, False)
        if "download" in argv:
            root = Path(env["GOMODCACHE"]) / "golang.org" / "toolchain@x"
            for name in ("bin/go", "bin/gofmt", "pkg/tool/linux_amd64/compile", "src/a.go"):
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_text("")
                (root / name).chmod(0o444)
            return Completed(0, json.dumps({"Dir": str(root)}), "", 1.0, False)
        Path(env["GOBIN"], "runsc").write_text("#!/bin/sh\n")
        return Completed(0, "", "", 1.0, False)


def test_build_fetches_toolchain_builds_and_publishes(cache, monkeypatch):
    fake = FakeGo()
    monkeypatch.setattr(go_toolchain.proc, "run", fake)
    monkeypatch.setattr(go_toolchain, "bootstrap_go", lambda: "/usr/bin/go")
    assert Runsc.unavailable() is None
    home = cache / "runsc"
    home.mkdir(parents=True, exist_ok=True)
    (home / ".build-stale").mkdir()        # a build that was killed
    binary = runsc.build()
    assert binary == home / GVISOR_VERSION / "runsc" and binary.exists()
    assert Runsc.locate() == RunscPtrace.locate() == str(binary)
    (download, denv, dcwd), (build, benv, bcwd) = fake.calls
    assert download == go_toolchain.download_command("/usr/bin/go")
    toolchain = home / "go" / "pkg" / "mod" / "golang.org" / "toolchain@x"
    assert build == runsc.build_command(str(toolchain / "bin" / "go"))
    assert denv["GOPATH"] == benv["GOPATH"] == str(home / "go")
    scratch = Path(benv["GOBIN"])
    assert scratch.parent == home and scratch.name.startswith(".build-") and bcwd == dcwd
    assert not scratch.exists() and sorted(p.name for p in home.iterdir()) == [
        ".lock", GVISOR_VERSION]
    assert len(fake.calls) == 2 and Runsc.unavailable() is None       # reused


def test_toolchain_programs_made_executable(cache, monkeypatch):
    monkeypatch.setattr(go_toolchain.proc, "run", FakeGo())
    monkeypatch.setattr(go_toolchain, "bootstrap_go", lambda: "/usr/bin/go")
    scratch = cache / "scratch"
    scratch.mkdir(parents=True)
    go = Path(go_toolchain.fetch_toolchain(cache / "go", scratch, "runsc", "runsc"))
    root = go.parent.parent
    for name in ("bin/go", "bin/gofmt", "pkg/tool/linux_amd64/compile"):
        assert os.access(root / name, os.X_OK), name
    assert not os.access(root / "src" / "a.go", os.X_OK)


def test_failed_build_says_why_and_publishes_nothing(cache, monkeypatch):
    monkeypatch.setattr(go_toolchain.proc, "run", FakeGo(fail="install"))
    monkeypatch.setattr(go_toolchain, "bootstrap_go", lambda: "/usr/bin/go")
    with pytest.raises(VmtaxError) as err:
        runsc.build()
    assert str(err.value) == (f"runsc: building gVisor {GVISOR_VERSION} with Go {GO_VERSION} "
                              "failed (exit code 1): go: downloading x | line 2 | "
                              "error: it broke")
    home = cache / "runsc"
    assert sorted(p.name for p in home.iterdir()) == [".lock", "go"]   # kept for a retry


def test_without_go(cache, monkeypatch):
    monkeypatch.setattr(go_toolchain, "bootstrap_go", lambda: None)
    why = Runsc.unavailable()
    assert why == "needs Debian's golang-go to build runsc: apt-get install golang-go"
    assert "first use" in Runsc.host_note()
    with pytest.raises(VmtaxError, match="apt-get install golang-go"):
        Runsc.locate()
    # A runsc built before needs no Go.
    binary = runsc.binary_path()
    binary.parent.mkdir(parents=True)
    binary.write_text("")
    assert Runsc.unavailable() is None and Runsc.locate() == str(binary)
    assert Runsc.host_note() == f"; {binary}"
