"""A program is known by its content: a rebuild at the same path is another program."""

import os

from vmtax.host import binary


def test_a_rebuild_at_the_same_path_has_another_identity(tmp_path):
    program = tmp_path / "qemu-system-x86_64"
    program.write_bytes(b"stock build")
    before = binary.identity(program)
    stat = program.stat()
    program.write_bytes(b"patched bld")   # same size
    os.utime(program, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    after = binary.identity(program)
    assert before["path"] == after["path"] and before["size"] == after["size"]
    assert before["sha256"] != after["sha256"]


def test_a_link_is_known_by_the_file_it_names(tmp_path):
    program = tmp_path / "firecracker-1.16.1"
    program.write_bytes(b"vmm")
    link = tmp_path / "firecracker"
    link.symlink_to(program.name)
    assert binary.identity(link) == binary.identity(program)
    assert binary.identity(link)["path"] == str(program)


def test_an_unreadable_file_has_no_hash(tmp_path):
    assert binary.identity(tmp_path / "missing")["sha256"] is None
