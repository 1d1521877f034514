"""An LXD instance that fails to start (issue #35, items 2 and 11), against a fake LXD that
behaves as LXD 5.0 did with `memory = "1K"`: the start fails, the instance stays busy with
LXD's own stop of it for a while (its delete refused meanwhile), its profile and pool are in
use while it exists. What is raised is LXD's reason for the failed start; everything is
undone newest first, and what cannot be undone yet stays journaled until it can."""

import json
import socketserver
import threading
from pathlib import Path

import pytest
import test_lxd

from vmtax.core.errors import TargetError
from vmtax.helpers import lxd_api
from vmtax.host import daemon
from vmtax.host.journal import Journal, undone_by
from vmtax.targets import lxd_instance
from vmtax.targets.lxd_instance import LxdInstance

LXC_LOG = (b"lxc vmtax-ab12cd-0001 20261127235050.204 ERROR    sync - ../src/lxc/sync.c:"
           b"sync_wake:47 - Broken pipe - Sync wake failure\n"
           b"lxc vmtax-ab12cd-0001 20261127235050.204 ERROR    lxccontainer - ../src/lxc/"
           b"lxccontainer.c:wait_on_daemonized_start:878 - Received container state "
           b"\"ABORTING\" instead of \"RUNNING\"\n"
           b"lxc vmtax-ab12cd-0001 20261127235055.772 ERROR    start - ../src/lxc/start.c:"
           b"lxc_end:985 - Failed to run lxc.hook.post-stop for container\n")
START_FAILED = ("Failed to run: /usr/bin/lxd forkstart vmtax-ab12cd-0001 /var/lib/lxd/"
                "containers /var/log/lxd/vmtax-ab12cd-0001/lxc.conf: exit status 1")


class FakeLxd(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: Path):
        self.objects = {"/1.0/storage-pools/vmtax-ab12cd", "/1.0/profiles/vmtax-ab12cd"}
        self.busy = 0          # deletes of the instance refused as busy before one succeeds
        self.deleted: list[str] = []
        super().__init__(str(path), Handler)


class Handler(test_lxd.Handler):
    server: FakeLxd  # type: ignore[assignment]

    def _error(self, status: int, error: str) -> None:
        self._answer(status, {"type": "error", "error": error, "error_code": status})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.objects.add(f"/1.0/instances/{body['name']}")
        self._answer(200, {"type": "sync", "metadata": {}})

    def do_PUT(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.busy = max(self.server.busy, 3)   # LXD stops what failed to start
        self._answer(202, {"type": "async", "operation": "/1.0/operations/start"})

    def do_GET(self):
        name = self.path.split("/")[3] if self.path.startswith("/1.0/instances/") else ""
        if self.path.startswith("/1.0/operations/start/wait"):
            self._answer(200, {"type": "sync", "metadata": {
                "status": "Failure", "description": "Starting instance", "err": START_FAILED}})
        elif self.path.endswith("/logs/lxc.log"):
            self._answer(200, LXC_LOG)
        elif self.path.endswith("/state"):
            self._answer(200, {"type": "sync", "metadata": {"status": "Stopped", "pid": 0}})
        elif self.path in self.server.objects or f"/1.0/instances/{name}" in self.server.objects \
                and self.path == f"/1.0/instances/{name}":
            self._answer(200, {"type": "sync", "metadata": {}})
        else:
            self._error(404, "not found")

    def do_DELETE(self):
        objects = self.server.objects
        if self.path.startswith("/1.0/instances/") and self.server.busy:
            self.server.busy -= 1
            self._error(400, "Failed to create instance delete operation: Instance is busy "
                             "running a \"stop\" operation")
        elif self.path.startswith("/1.0/profiles/") and any(
                o.startswith("/1.0/instances/") for o in objects):
            self._error(400, "Profile is currently in use")
        elif self.path.startswith("/1.0/storage-pools/") and any(
                o.startswith("/1.0/profiles/") for o in objects):
            self._error(400, "The storage pool is currently in use")
        else:
            objects.discard(self.path)
            self.server.deleted.append(self.path)
            self._answer(200, {"type": "sync", "metadata": {}})


@pytest.fixture
def fake(tmp_path):
    server = FakeLxd(tmp_path / "lxd.sock")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def made(tmp_path, fake, monkeypatch):
    """A journal listing what a target made in the fake LXD: the daemon (its process
    gone), a pool and a profile; and the instance about to be launched with them."""
    monkeypatch.setattr(lxd_api, "LOGS", tmp_path / "logs")
    (tmp_path / "logs" / "vmtax-ab12cd-0001").mkdir(parents=True)
    journal = Journal(tmp_path / "journal")
    client = lxd_api.Lxd(Path(fake.server_address))
    journal.add(type="daemon", undo=undone_by(daemon.stop), name="lxd", pid=2**22 + 7,
                start=1)
    for kind in ("lxd pool", "lxd profile"):
        lxd_api.journaled(journal, kind, "vmtax-ab12cd", client)
    instance = LxdInstance("l", "vmtax-ab12cd-0001", client, journal, "vmtax-rootfs-x",
                           "vmtax-ab12cd")
    return journal, instance


def test_a_failed_start_says_lxds_reason_and_is_undone_once_lxd_lets_it(made, fake, tmp_path):
    journal, instance = made
    with pytest.raises(TargetError) as failed:
        instance.start()
    assert str(failed.value) == (
        f"l: LXD: Starting instance: {START_FAILED} (LXC: Sync wake failure; Received "
        "container state \"ABORTING\" instead of \"RUNNING\")")
    # Deleted once LXD's own stop of it was over; then LXD's log directory of it.
    assert fake.deleted == ["/1.0/instances/vmtax-ab12cd-0001"]
    assert not (tmp_path / "logs" / "vmtax-ab12cd-0001").exists()
    assert [e["type"] for e in journal.entries.values()] == ["daemon", "lxd pool",
                                                             "lxd profile"]
    assert journal.undo_all() == []
    assert fake.deleted[1:] == ["/1.0/profiles/vmtax-ab12cd", "/1.0/storage-pools/vmtax-ab12cd"]
    assert not journal.path.exists()


def test_what_cannot_be_undone_yet_stays_journaled_and_the_daemon_with_it(made, fake, tmp_path,
                                                                        monkeypatch):
    journal, instance = made
    monkeypatch.setattr(lxd_api, "BUSY_WAIT", 0.3)
    fake.busy = 1000                 # LXD stops it for longer than vmtax waits
    with pytest.raises(TargetError, match="Starting instance"):   # not the undo's failure
        instance.start()
    errors = journal.undo_all()
    assert [e.split(":")[0] for e in errors] == ["lxd instance", "lxd profile", "lxd pool",
                                                 "daemon"]
    assert "lxd left running: 3 change(s) made through it are not undone yet" in errors[-1]
    on_disk = Journal.at(journal.path).entries
    assert [e["type"] for e in on_disk.values()] == ["daemon", "lxd pool", "lxd profile",
                                                     "lxd instance"]
    assert (tmp_path / "logs" / "vmtax-ab12cd-0001").exists()
    # LXD is done with it: the retry (the guardian's, `vmtax cleanup`'s) undoes it all.
    fake.busy = 0
    assert Journal.at(journal.path).undo_all() == []
    assert fake.deleted == ["/1.0/instances/vmtax-ab12cd-0001", "/1.0/profiles/vmtax-ab12cd",
                            "/1.0/storage-pools/vmtax-ab12cd"]
    assert not (tmp_path / "logs" / "vmtax-ab12cd-0001").exists()
    assert not journal.path.exists()


def test_a_start_killed_for_want_of_memory_says_so(made, monkeypatch, tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "6,1,1,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=lxc.payload."
        "vmtax-ab12cd-0001,mems_allowed=0,oom_memcg=/lxc.payload.vmtax-ab12cd-0001,task_memcg="
        "/lxc.payload.vmtax-ab12cd-0001,task=lxd,pid=5118,uid=0\n"
        "6,2,1,-;oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/lxc.payload.vmtax-ab12cd-00012,"
        "task=other,pid=7,uid=0\n")
    assert lxd_instance.oom_killed("/lxc.payload.vmtax-ab12cd-0001", str(kmsg)) == [
        "lxd (pid 5118)"]
    monkeypatch.setattr(lxd_instance, "oom_killed", lambda cgroup: ["lxd (pid 5118)"])
    _, instance = made
    with pytest.raises(TargetError, match=r"\); the kernel's OOM killer killed lxd \(pid 5118\) "
                                          r"in the container's memory cgroup: its memory limit "
                                          r"is too small$"):
        instance.start()
