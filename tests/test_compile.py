"""The compile workload's kernel tree: kbuild's .cmd files (real ones from Debian's 6.1
tinyconfig build, dependency lists shortened) turned into vmtax.mk, the subset choice, and
the workload's jobs."""

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from vmtax.core.errors import TargetError
from vmtax.guest import kernel_cache
from vmtax.helpers import kernel_tree
from vmtax.helpers.kernel_tree import ObjectCommand, makefile, parse_cmd, recipe, select
from vmtax.host import trees
from vmtax.host.journal import Journal
from vmtax.workloads import compile as compile_mod
from vmtax.workloads.compile import Compile

FIXTURES = Path(__file__).parent / "fixtures" / "compile"


def cmd(name: str) -> ObjectCommand:
    parsed = parse_cmd((FIXTURES / name).read_text())
    assert parsed is not None
    return parsed


def test_parse_reads_the_object_its_source_command_and_files():
    main = cmd("main.o.cmd")
    assert (main.obj, main.source) == ("init/main.o", "init/main.c")
    assert main.command.startswith("gcc -Wp,-MMD,init/.main.o.d -nostdinc -I./arch/x86/include")
    assert main.command.endswith("-c -o init/main.o init/main.c")
    # Files the compile read; the config markers ($(wildcard ...)) are not files.
    assert main.deps == ("include/linux/compiler-version.h", "include/linux/kconfig.h",
                         "include/generated/autoconf.h", "include/kunit/resource.h")
    head = cmd("head_32.o.cmd")
    assert head.source == "arch/x86/kernel/head_32.S"
    assert head.deps == ("include/linux/compiler-version.h", "arch/x86/include/asm/segment.h")


def test_parse_skips_archives_and_host_tools():
    assert parse_cmd((FIXTURES / "built-in.a.cmd").read_text()) is None
    assert parse_cmd((FIXTURES / "fixdep.cmd").read_text()) is None
    assert parse_cmd("") is None


def test_recipe_is_the_kernels_command_writing_into_O():
    main = cmd("main.o.cmd")
    line = recipe(main)
    assert line.startswith("$(CC) -nostdinc ") and line.endswith(" -c -o $@ init/main.c")
    assert "-MMD" not in line
    assert "-DKBUILD_BASENAME='\"main\"'" in line and "-I./include " in line
    # What kbuild chains after the compile (objtool on 64-bit builds) is not compiling.
    chained = ObjectCommand(main.obj, main.source, main.command
                            + " ; ./tools/objtool/objtool --hacks=jump_label init/main.o",
                            main.deps)
    assert recipe(chained) == line
    with pytest.raises(Exception, match="does not write it with -o"):
        recipe(ObjectCommand("a.o", "a.c", "gcc -c a.c", ()))


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_makefile_builds_all_or_the_picked_objects(tmp_path):
    objects = [cmd("head_32.o.cmd"), cmd("main.o.cmd")]
    text = makefile(objects, "12.2.0")
    assert text.count("\n\t$(CC) ") == 2
    (tmp_path / "vmtax.mk").write_text(text)

    def dry(*args):
        done = subprocess.run(["make", "-n", "-s", "-f", "vmtax.mk", "O=/x", *args],
                              cwd=tmp_path, capture_output=True, text=True, check=True)
        return done.stdout.splitlines()

    assert dry("dirs") == ["mkdir -p /x/arch/x86/kernel /x/init"]
    both = dry()
    assert [line.split()[-3:] for line in both] == [
        ["-o", "/x/arch/x86/kernel/head_32.o", "arch/x86/kernel/head_32.S"],
        ["-o", "/x/init/main.o", "init/main.c"]]
    assert all(line.startswith(f"{tmp_path.parent}/toolchain/bin/gcc -nostdinc ")
               for line in both)
    assert dry("PICK=init/main.o", "pick") == both[1:]


def test_select_spreads_a_stable_subset():
    objects = [f"o{i:03d}.o" for i in range(100)]
    assert select(objects, 0) == objects and select(objects, 500) == objects
    assert select(objects, 4) == ["o000.o", "o025.o", "o050.o", "o075.o"]
    assert select(objects, 4) == select(list(objects), 4)
    assert len(set(select(objects, 99))) == 99


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A built tree's manifest, without building one."""
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"objects": [f"o{i}.o" for i in range(10)], "cpu_seconds": 20.0}))
    monkeypatch.setattr(compile_mod, "_tree", lambda: tmp_path)
    monkeypatch.setattr(compile_mod, "_built_manifest",
                        lambda: kernel_tree.manifest(tmp_path))
    return tmp_path


def test_compile_runs_make_in_the_tree(tree):
    everything = Compile.make({"jobs": 2})
    assert everything.trees() == (tree,)
    job = everything.run_job()
    assert job.argv[4:] == ["vmtax", "2", "all", ""]
    assert job.env["TREE"] == str(tree) and job.env["MAKE_BIN"] == shutil.which("make")
    assert everything.run_seconds() == 10.0
    some = Compile.make({"objects": 3})
    assert some.run_job().argv[4:] == ["vmtax", "1", "pick", "o0.o o3.o o6.o"]
    assert some.run_seconds() == 6.0 and some.run_job().timeout > 100 * 6.0


def test_compile_declares_what_the_targets_carry():
    assert Compile.binaries == ("make",)
    assert {"linux-source", "gcc", "binutils", "make"} <= set(Compile.packages)
    with pytest.raises(Exception, match="objects"):
        Compile.make({"objects": -1})


# -- read-only trees in targets (vmtax.host.trees) ------------------------------------------------

def test_guests_get_each_tree_as_a_read_only_disk_known_by_its_serial():
    from vmtax.guest.qemu import VmConfig, qemu_argv
    cfg = VmConfig(qemu="qemu", accel="tcg", machine="microvm", cpu="max", vcpus=1,
                   memory="1G", kernel=Path("/k"), initramfs=Path("/i"), append="",
                   agent_socket=Path("/a"), qmp_socket=Path("/q"), console_log=Path("/c"),
                   disk=Path("/w/scratch.img"), trees=((Path("/c/t,1.img"), "/t"),))
    argv = qemu_argv(cfg)
    drives = [argv[i + 1] for i, a in enumerate(argv) if a in ("-drive", "-device")]
    # After the scratch disk, which the guest finds as /dev/vda.
    assert drives[-4:] == [
        "if=none,id=scratch,format=raw,file=/w/scratch.img,cache=none",
        "virtio-blk-device,drive=scratch",
        "if=none,id=tree0,format=raw,file=/c/t,,1.img,readonly=on",
        "virtio-blk-device,drive=tree0,serial=vmtax-tree0"]


@pytest.mark.skipif(shutil.which("mkfs.ext4") is None, reason="e2fsprogs is not installed")
def test_tree_images_are_cached_by_content(tmp_path):
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f.h").write_text("#define X 1\n")
    first = trees.ext4_image(tree, tmp_path / "cache")
    assert first.stat().st_size > 0 and trees.ext4_image(tree, tmp_path / "cache") == first
    listing = subprocess.run(["debugfs", "-R", "ls -l /sub", str(first)], capture_output=True,
                             text=True)
    assert "f.h" in listing.stdout
    (tree / "sub" / "f.h").write_text("#define X 2\n")
    trees.content_hash.cache_clear()
    assert trees.ext4_image(tree, tmp_path / "cache") != first


def test_containers_refuse_a_tree_their_own_mounts_would_hide(tmp_path):
    with pytest.raises(TargetError, match="under /tmp, which containers mount"):
        trees.bind_readonly(Journal(tmp_path), Path("/tmp/tree"), tmp_path / "rootfs")
    assert not (tmp_path / "rootfs").exists()


def test_workloads_need_no_tree_unless_they_say_so():
    from vmtax.workloads.dd import Dd
    assert Dd.make({}).trees() == ()


def test_ssh_targets_refuse_trees_before_connecting(tmp_path):
    from vmtax.core import target as targets
    ctx = targets.TargetContext(work_dir=tmp_path, journal=None, trees=(Path("/c/tree"),))
    target = targets.create("far", "ssh", {"host": "bench@nowhere.invalid"}, ctx)
    with pytest.raises(TargetError, match="ssh targets cannot carry read-only trees yet"):
        target.prepare()


def test_a_second_builder_waits_for_the_first_and_finds_its_build(tmp_path):
    """Two processes wanting the kernel tree at once: the second waits for the lock, and a
    publish that loses the race keeps the winner's complete build."""
    dest = tmp_path / "tree"
    order = []

    def first():
        with kernel_cache.build_lock(dest):
            order.append("first in")
            time.sleep(0.3)
            built = tmp_path / ".a"
            built.mkdir()
            (built / kernel_tree.MANIFEST).write_text("{}")
            kernel_cache.publish_dir(built, dest, kernel_tree.MANIFEST)
            order.append("first out")

    thread = threading.Thread(target=first)
    thread.start()
    time.sleep(0.1)
    with kernel_cache.build_lock(dest):
        order.append("second in")
    thread.join()
    assert order == ["first in", "first out", "second in"]
    late = tmp_path / ".b"
    late.mkdir()
    kernel_cache.publish_dir(late, dest, kernel_tree.MANIFEST)   # lost the race: no error
    assert not late.exists() and (dest / kernel_tree.MANIFEST).exists()
