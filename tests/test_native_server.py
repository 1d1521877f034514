"""A server on the bare host (issue #35, item 10): its scratch directory in the host's
memory is journaled before it is made, so a kill -9 leaves nothing `cleanup` cannot undo."""

import os
import socket
import sys

import pytest

from vmtax.core import target as target_registry
from vmtax.core.target import TargetContext
from vmtax.core.types import Job
from vmtax.host import machine
from vmtax.host.journal import Journal

# Notes where the server was told to keep its files, and whether that already existed,
# then listens until it is stopped.
SERVER = """
import os, socket, sys
memory = os.environ.get("VMTAX_MEMORY_DIR", "")
open(sys.argv[1], "w").write(memory + "\\n" + str(os.path.isdir(memory)))
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((os.environ["VMTAX_LISTEN"], int(sys.argv[2])))
s.listen()
s.accept()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(machine.fs_type("/dev/shm") != "tmpfs", reason="no tmpfs at /dev/shm")
def test_the_server_memory_directory_is_journaled_and_goes_with_the_server(tmp_path):
    journal = Journal(tmp_path / "journal")
    (tmp_path / "work").mkdir()
    native = target_registry.create("native", "native", {},
                                    TargetContext(work_dir=tmp_path / "work", journal=journal))
    native.prepare()
    seen = tmp_path / "seen"
    endpoint = native.start_server(
        Job([sys.executable, "-c", SERVER, str(seen), str(port := _free_port())], timeout=30),
        port)
    try:
        memory, existed = seen.read_text().split("\n")
        assert memory.startswith("/dev/shm/vmtax-serve-") and existed == "True"
        listed = [e for e in journal.entries.values() if e.get("path") == memory]
        assert listed == [{"type": "rmtree", "path": memory}]
        on_disk = Journal(tmp_path / "journal").entries.values()   # as the guardian reads it
        assert {"type": "rmtree", "path": memory} in on_disk
    finally:
        native.stop_server(endpoint)
        native.cleanup()
    assert not os.path.exists(memory)
    assert not journal.entries
