"""The lxd target without LXD: its options, its image, its journal entries, and its REST
client against a fake LXD on a unix socket (the process boundary)."""

import http.server
import json
import os
import socketserver
import tarfile
import threading
from pathlib import Path

import pytest

from vmtax.core import plugin
from vmtax.core import target as targets
from vmtax.core.errors import VmtaxError
from vmtax.helpers import lxd_api
from vmtax.host.journal import Journal
from vmtax.targets import lxd


def options(**values):
    return plugin.build(lxd.LxdOptions, values, "lxd", strict=False, kind="lxd")


def test_a_target_kind_that_makes_instances():
    cls = targets.get("lxd")
    assert cls is lxd.LxdTarget and cls.makes_instances()
    assert "lxd" in targets.known_names()
    assert set(cls.small_options) <= set(plugin.option_infos(lxd.LxdOptions))


def test_profile_config_from_the_options():
    assert lxd.lxd_size("512M") == "512MiB" and lxd.lxd_size("2g") == "2GiB"
    config = options(cpus=1, memory="512M").profile_config()
    assert config["limits.cpu"] == "1" and config["limits.memory"] == "512MiB"
    assert config["security.privileged"] == "false" and "dev/shm tmpfs" in config["raw.lxc"]
    # A set of one CPU is a range: "1" alone is LXD's count of one.
    assert options(pin=[1]).profile_config()["limits.cpu"] == "1-1"
    assert "limits.cpu" not in options().profile_config()


def test_limits_cpu_is_a_knob_every_candidate_of_which_passes_its_check():
    info = plugin.option_infos(lxd.LxdOptions)["cpus"]
    assert info.tune
    for value in info.tune:
        info.check(value)


@pytest.mark.parametrize("values, message", [
    (dict(cpus=1, pin=[0]), "lxd: pin: expected either cpus (a count) or pin (a set), not "
                            "both: both are limits.cpu, got [0]"),
    (dict(cpus=4096), "lxd: cpus: expected at most the 2 CPUs vmtax may use, got 4096"),
    (dict(memory="lots"), "lxd: memory: expected a size like \"2G\", got 'lots'"),
    (dict(storage="zfs"), "lxd: storage: expected one of \"dir\", got 'zfs'"),
])
def test_options_that_do_not_fit_are_one_line_naming_the_option(values, message,
                                                                 monkeypatch):
    monkeypatch.setattr(lxd.os, "sched_getaffinity", lambda pid: {0, 1})
    with pytest.raises(VmtaxError) as raised:
        options(**values)
    assert str(raised.value) == message


def test_unavailable_without_lxd(monkeypatch):
    monkeypatch.setattr(lxd.shutil, "which", lambda name: None)
    assert lxd.LxdTarget.unavailable() == ("lxd and lxc not installed "
                                           "(apt-get install lxd lxd-client)")


def test_the_image_is_the_rootfs_with_an_idle_inittab_and_metadata(tmp_path):
    source = tmp_path / "0123456789abcdef"
    (source / "bin").mkdir(parents=True)
    (source / "bin/busybox").write_bytes(b"\x7fELF")
    (source / "etc").mkdir()
    (source / ".complete").write_text("0123\n")
    lxd.write_image(source, tmp_path / "meta.tar", tmp_path / "rootfs.tar")
    with tarfile.open(tmp_path / "meta.tar") as tar:
        metadata = tar.extractfile("metadata.yaml").read().decode()
    assert "architecture: " in metadata and "creation_date: " in metadata
    with tarfile.open(tmp_path / "rootfs.tar") as tar:
        names = tar.getnames()
        assert tar.extractfile("etc/inittab").read().decode() == lxd.INITTAB
    assert "bin/busybox" in names and ".complete" not in names
    assert lxd.image_alias(source) == f"vmtax-rootfs-0123456789abcdef-{lxd.IMAGE_FORMAT}"


def test_an_undo_entry_names_only_what_vmtax_makes(tmp_path):
    journal = Journal(tmp_path / "run")
    with pytest.raises(ValueError, match="not something vmtax makes in LXD"):
        lxd_api.undo(journal, {"type": "lxd instance", "name": "production-db"})
    with pytest.raises(ValueError, match="not something vmtax makes in LXD"):
        lxd_api.undo(journal, {"type": "lxd network", "name": "vmtax-x"})
    # No daemon answers: LXD keeps the instance in its database, so the entry stays
    # journaled (the undo fails) until a daemon answers and it is deleted.
    with pytest.raises(lxd_api.LxdError, match="instance vmtax-ab12cd-0001 stays in its "
                                               "database until LXD runs"):
        lxd_api.undo(journal, {"type": "lxd instance", "name": "vmtax-ab12cd-0001",
                               "socket": str(tmp_path / "none.sock")})


# -- the REST client against a fake LXD ---------------------------------------------------

class FakeLxd(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Answers the calls the client makes: exec (its output recorded, its return code),
    an operation's wait (running until `finished`), the log files, deletes."""
    daemon_threads = True

    def __init__(self, path: Path, return_code: int = 0, finishes: bool = True):
        self.calls: list[tuple[str, str, object]] = []
        self.logs = {"/1.0/instances/c/logs/exec_1.stdout": b"out\n",
                     "/1.0/instances/c/logs/exec_1.stderr": b"err\n"}
        self.return_code = return_code
        self.finishes = finishes       # False: runs until a kill
        super().__init__(str(path), Handler)


class Handler(http.server.BaseHTTPRequestHandler):
    server: FakeLxd

    def log_message(self, *args):
        pass

    def _answer(self, status: int, body: dict | bytes) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length)) if length else None

    def do_POST(self):
        body = self._body()
        self.server.calls.append(("POST", self.path, body))
        if body["command"][0] == "kill":
            self.server.finishes = True
        self._answer(202, {"type": "async", "operation": "/1.0/operations/1",
                           "metadata": {"status": "Running"}})

    def do_GET(self):
        self.server.calls.append(("GET", self.path, None))
        if self.path.startswith("/1.0/operations/1/wait"):
            if not self.server.finishes:
                self._answer(200, {"type": "sync", "metadata": {"status": "Running"}})
                return
            self._answer(200, {"type": "sync", "metadata": {
                "status": "Success", "metadata": {
                    "return": self.server.return_code,
                    "output": {"1": "/1.0/instances/c/logs/exec_1.stdout",
                               "2": "/1.0/instances/c/logs/exec_1.stderr"}}}})
        elif self.path in self.server.logs:
            self._answer(200, self.server.logs[self.path])
        else:
            self._answer(404, {"type": "error", "error": "not found", "error_code": 404})

    def do_DELETE(self):
        self.server.calls.append(("DELETE", self.path, None))
        self.server.logs.pop(self.path, None)
        self._answer(200, {"type": "sync", "metadata": {}})


@pytest.fixture
def fake(tmp_path, request):
    server = FakeLxd(tmp_path / "lxd.sock", **getattr(request, "param", {}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_exec_sends_the_environment_in_the_body_and_reads_back_the_output(fake):
    client = lxd_api.Lxd(Path(fake.server_address))
    done = client.exec("c", ["sysbench", "cpu", "run"], {"PASSWORD": "s3cret"}, "/work", 10)
    assert (done.exit_code, done.stdout, done.stderr, done.timed_out) == (0, "out\n", "err\n",
                                                                         False)
    method, path, body = fake.calls[0]
    assert (method, path) == ("POST", "/1.0/instances/c/exec")
    assert body["environment"] == {"PASSWORD": "s3cret"} and body["cwd"] == "/work"
    assert body["record-output"] and not body["wait-for-websocket"]
    assert not fake.logs   # read, then deleted


@pytest.mark.parametrize("fake", [{"return_code": 3}], indirect=True)
def test_a_failing_command_is_its_exit_code(fake):
    done = lxd_api.Lxd(Path(fake.server_address)).exec("c", ["false"], {}, "/", 10)
    assert done.exit_code == 3 and not done.timed_out


@pytest.mark.parametrize("fake", [{"finishes": False}], indirect=True)
def test_a_job_past_its_timeout_is_killed_with_everything_but_init(fake):
    done = lxd_api.Lxd(Path(fake.server_address)).exec("c", ["sleep", "99"], {}, "/", 1)
    assert done.timed_out and done.exit_code is None
    kills = [body for method, _, body in fake.calls
             if method == "POST" and body["command"][0] == "kill"]
    assert [k["command"] for k in kills] == [["kill", "-KILL", "-1"]]


def test_an_lxd_error_is_one_line(fake):
    with pytest.raises(lxd_api.LxdError, match=r"^LXD: GET /1.0/instances/x/state: not found$"):
        lxd_api.Lxd(Path(fake.server_address)).state("x")


def test_no_daemon_is_one_line_naming_the_socket(tmp_path):
    with pytest.raises(lxd_api.LxdError, match=r"LXD at .*none\.sock: GET /1\.0 failed"):
        lxd_api.Lxd(tmp_path / "none.sock").server()


# -- plain LXC, the lxd:lxc variant --------------------------------------------------------

def test_lxc_is_a_variant_of_the_same_kind():
    kind, options_ = targets.parse_name("lxd:lxc")
    assert (kind, options_) == ("lxd", {"manager": "lxc"})
    assert set(lxd.LxdTarget.variants()) == {"lxd", "lxc"}


@pytest.mark.parametrize("layout, cpu_key, memory_key", [
    ("hybrid", "lxc.cgroup.cpuset.cpus", "lxc.cgroup.memory.limit_in_bytes"),
    ("unified", "lxc.cgroup2.cpuset.cpus", "lxc.cgroup2.memory.max"),
])
def test_lxc_config_has_the_limits_on_the_hosts_cgroup_layout(layout, cpu_key, memory_key,
                                                              monkeypatch):
    monkeypatch.setattr(lxd.host, "cgroup_layout", lambda: layout)
    monkeypatch.setattr(lxd.os, "sched_getaffinity", lambda pid: {0, 1})
    lines = options(manager="lxc", cpus=1, memory="512m").lxc_config((Path("/opt/tree"),))
    assert f"{cpu_key} = 0" in lines and f"{memory_key} = 512M" in lines
    assert "lxc.net.0.type = empty" in lines and lxd.SHM in lines
    assert "lxc.mount.entry = /opt/tree opt/tree none bind,ro,create=dir 0 0" in lines
    pinned = options(manager="lxc", pin=[1]).lxc_config()
    assert f"{cpu_key} = 1" in pinned and not any("memory" in line for line in pinned)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_an_unprivileged_rootfs_is_shifted_once(tmp_path):
    from vmtax.targets import lxd_instance

    root = tmp_path / "rootfs"
    (root / "work/deep").mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "bin/busybox").write_bytes(b"")
    (root / "bin/sh").symlink_to("busybox")
    lxd_instance._shift_ids(root)
    for path in [root, root / "work", root / "work/deep", root / "bin/busybox", root / "bin/sh"]:
        st = path.lstat()
        assert (st.st_uid, st.st_gid) == (lxd_instance.ID_BASE, lxd_instance.ID_BASE), path


def test_an_lxc_undo_entry_names_only_what_vmtax_starts(tmp_path):
    from vmtax.targets import lxd_instance

    journal = Journal(tmp_path / "run")
    with pytest.raises(ValueError, match="not one vmtax starts"):
        lxd_instance.stop_lxc(journal, {"name": "web", "lxcpath": "/var/lib/lxc"})
    with pytest.raises(ValueError, match="not one vmtax starts"):
        lxd_instance.stop_lxc(journal, {"name": "vmtax-ab", "lxcpath": "/var/lib/lxc"})
