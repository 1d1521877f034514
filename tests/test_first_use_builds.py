"""What vmtax builds on first use instead of at set-up: which linux-source it builds from
(6.1 or 6.12, VMTAX_LINUX_SOURCE), the 6.12 kbuild format the compile tree reads, the build
steps' progress and its one-line failures, and where set-up stops."""

import json
import re
import sys
from pathlib import Path

import pytest

from vmtax.core.errors import VmtaxError
from vmtax.guest import minimal_kernel
from vmtax.helpers import kernel_tree, serving_tools
from vmtax.host import build_progress
from vmtax.workloads.serving import Serving

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "compile"


@pytest.fixture
def sources(tmp_path, monkeypatch):
    """Debian 12 with linux-source-6.12 installed next to 6.1."""
    for version in ("6.1", "6.12"):
        (tmp_path / f"linux-source-{version}.tar.xz").write_bytes(version.encode())
    monkeypatch.setattr(minimal_kernel, "SOURCE_GLOB", str(tmp_path / "linux-source-*.tar.xz"))
    monkeypatch.delenv(minimal_kernel.SOURCE_ENV, raising=False)
    return tmp_path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VMTAX_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_newest_source_is_6_12_not_6_1_by_its_version_number(sources):
    # As text, "6.1.tar.xz" and "6.12.tar.xz" sort by chance; "6.9" would come after "6.12".
    (sources / "linux-source-6.9.tar.xz").write_bytes(b"6.9")
    assert minimal_kernel.source_tarball().name == "linux-source-6.12.tar.xz"
    assert minimal_kernel.source_version(Path("linux-source-6.12.tar.xz")) == (6, 12)


def test_vmtax_linux_source_picks_a_version_or_a_tarball(sources, monkeypatch, tmp_path):
    monkeypatch.setenv("VMTAX_LINUX_SOURCE", "6.1")
    assert minimal_kernel.source_tarball() == sources / "linux-source-6.1.tar.xz"
    elsewhere = tmp_path / "mine" / "linux-source-6.12.tar.xz"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"x")
    monkeypatch.setenv("VMTAX_LINUX_SOURCE", str(elsewhere))
    assert minimal_kernel.source_tarball() == elsewhere
    # The compile tree builds from the same choice.
    assert kernel_tree.tarball() == elsewhere


@pytest.mark.parametrize("wanted, message", [
    ("6.6", "VMTAX_LINUX_SOURCE=6.6: linux-source-6.6 is not installed (installed: 6.1, "
            "6.12); apt-get install linux-source-6.6"),
    ("/nowhere/linux.tar.xz", "VMTAX_LINUX_SOURCE=/nowhere/linux.tar.xz: no such file"),
])
def test_a_source_that_is_not_there_is_one_line(sources, monkeypatch, wanted, message):
    monkeypatch.setenv("VMTAX_LINUX_SOURCE", wanted)
    for source_of in (minimal_kernel.source_tarball, kernel_tree.tarball):
        with pytest.raises(VmtaxError) as info:
            source_of()
        assert str(info.value) == message


def test_set_up_asks_for_the_releases_linux_source_not_6_1():
    # linux-source-6.1 does not exist on Debian 13; `linux-source` is each release's own.
    assert "linux-source" in minimal_kernel.PACKAGES
    assert not any(p.startswith("linux-source-") for p in kernel_tree.PACKAGES)


def test_the_compile_tree_reads_linux_6_12s_savedcmd_files():
    """Linux 6.3 renamed cmd_OBJ to savedcmd_OBJ in .o.cmd files: 6.12's tree found no
    object at all ("no compiled objects found")."""
    parsed = kernel_tree.parse_cmd((FIXTURES / "main-6.12.o.cmd").read_text())
    assert parsed is not None
    assert (parsed.obj, parsed.source) == ("init/main.o", "init/main.c")
    assert parsed.command.startswith("gcc -Wp,-MMD,init/.main.o.d -nostdinc ")
    assert parsed.deps == ("include/linux/compiler-version.h", "include/linux/kconfig.h",
                           "include/generated/autoconf.h", "include/kunit/resource.h")
    assert kernel_tree.recipe(parsed).endswith(" -c -o $@ init/main.c")
    # 6.1's spelling still reads.
    assert kernel_tree.parse_cmd((FIXTURES / "main.o.cmd").read_text()).obj == "init/main.o"


def _script(tmp_path: Path, text: str) -> list[str]:
    script = tmp_path / "step.py"
    script.write_text(text)
    return [sys.executable, str(script)]


KBUILD_OUTPUT = """import sys
for name in ("scripts/basic/fixdep", "init/main.o", "init/version.o", "kernel/fork.o"):
    kind = "HOSTCC" if name.startswith("scripts") else "CC"
    print(f"  {kind:<7} {name}")
print("make[1]: Entering directory")
print("  LD      vmlinux")
"""


def test_a_build_counts_kbuilds_steps_and_remembers_them_for_the_next_bar(cache, tmp_path):
    with build_progress.Build("test kernel", "test-kernel") as build:
        build.run(_script(tmp_path, KBUILD_OUTPUT), tmp_path, "make vmlinux", timeout=60,
                  steps=build_progress.KBUILD_STEP, key="test-kernel 6.12", expected=3)
    assert json.loads((cache / build_progress.STEPS_FILE).read_text()) == {
        "test-kernel 6.12": 5}
    log = (cache / "logs" / "test-kernel.log").read_text()
    assert "  CC      kernel/fork.o" in log and "make[1]: Entering directory" in log


def test_the_time_left_is_the_pace_of_the_steps_so_far():
    assert build_progress.time_left(0, 100, 5.0) == ""
    assert build_progress.time_left(10, 100, 20.0) == "~3 min left"
    assert build_progress.time_left(50, 100, 20.0) == "~20 s left"
    assert build_progress.time_left(5, None, 20.0) == ""


def test_a_failed_step_is_one_line_naming_the_log(cache, tmp_path):
    fails = _script(tmp_path, "import sys\nprint('  CC init/main.o')\n"
                              "print('init/main.c:1: error: it broke', file=sys.stderr)\n"
                              "sys.exit(2)\n")
    with pytest.raises(VmtaxError) as info:
        with build_progress.Build("test kernel", "test-kernel") as build:
            build.run(fails, tmp_path, "make vmlinux", timeout=60,
                      steps=build_progress.KBUILD_STEP, key="k")
    log = cache / "logs" / "test-kernel.log"
    assert str(info.value) == f"test kernel: make vmlinux failed (exit code 2); log: {log}"
    assert "error: it broke" in log.read_text()
    assert not (cache / build_progress.STEPS_FILE).exists()   # a failed count is not learnt


def test_a_step_past_its_time_or_a_missing_tool_is_one_line(cache, tmp_path):
    with build_progress.Build("test kernel", "test-kernel") as build:
        with pytest.raises(VmtaxError, match=r"^test kernel: make vmlinux took longer than "
                                             r"0.5 s; log: \S+test-kernel.log$"):
            build.run(_script(tmp_path, "import time\ntime.sleep(30)\n"), tmp_path,
                      "make vmlinux", timeout=0.5)
        with pytest.raises(VmtaxError, match="^test kernel: no-such-make is not installed$"):
            build.run(["no-such-make"], tmp_path, "make vmlinux", timeout=5)


def test_a_build_inside_vmtax_runs_progress_is_a_task_of_its_display(cache, tmp_path):
    from rich.console import Console
    from rich.progress import Progress, TextColumn

    shown = Progress(TextColumn("{task.description} {task.fields[eta]}"),
                     console=Console(file=open(tmp_path / "out", "w")))
    seen = []
    with build_progress.shown_in(shown):
        with build_progress.Build("test kernel", "test-kernel") as build:
            build.describe("unpacking")
            seen = [t.description for t in shown.tasks]
    assert seen == ["test kernel: unpacking"] and shown.tasks == []


def test_serving_builds_its_tools_before_targets_start_not_in_the_plan_check(monkeypatch):
    built = []
    monkeypatch.setattr(serving_tools, "build", lambda: built.append(True))
    monkeypatch.setattr(serving_tools, "built", lambda: False)
    workload = Serving.make({}, time=2)
    # Not built is no problem where Go can build them...
    monkeypatch.setattr("vmtax.helpers.go_toolchain.bootstrap_go", lambda: "/usr/bin/go")
    assert [p for p in workload.host_problems() if "vegeta" in p[1]] == []
    # ... it is where it cannot.
    monkeypatch.setattr("vmtax.helpers.go_toolchain.bootstrap_go", lambda: None)
    assert ("endpoints", "Go to build its server and vegeta on first use "
            "(apt-get install golang-go)") in workload.host_problems()
    workload.server_job()
    assert built == []          # a job is only a description
    workload.build_on_host()
    assert built == [True]


def test_set_up_builds_nothing_make_test_builds_what_live_tests_use():
    bootstrap = (ROOT / "scripts" / "bootstrap.sh").read_text()
    code = [line for line in bootstrap.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if re.search(r"python -m vmtax\.", line)]
    makefile = (ROOT / "Makefile").read_text()
    builds = makefile[makefile.index("\nbuilds:"):].split("\n\n")[0]
    for module in ("vmtax.guest.minimal_kernel", "vmtax.helpers.kernel_tree",
                   "vmtax.helpers.serving_tools"):
        assert f"-m {module}" in builds
    assert re.search(r"^test: .*\bbuilds\b", makefile, re.MULTILINE)
    assert not re.search(r"^run: .*\bbuilds\b", makefile, re.MULTILINE)
