"""No trusted file another user can plant (issue #29): the runtime directory and its
journals are vmtax's user's own or refused in one line, every journal entry is checked
before it acts, and a journal that cannot be written stops a run before it changes the
host."""

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import vmtax, wait_for

from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.host import journal

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="making another user's files needs root")
OTHER_UID = 4344


def plant(directory: Path, sentinel: Path) -> None:
    """A dead process's journal whose undo would create sentinel, as another user left it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "journal-1-0.json").write_text(json.dumps(
        {"1": {"type": "argv", "argv": ["sh", "-c", f"id > {sentinel}"]}}))


@root_only
@pytest.mark.parametrize("args", [["cleanup"], ["run", "--targets", "native", "--workloads",
                                                "cpu", "--runs", "1", "--time", "1"],
                                  ["runs"]])
def test_a_runtime_directory_another_user_made_is_refused_in_one_line(tmp_path, args):
    runtime, sentinel = tmp_path / "planted", tmp_path / "p"
    plant(runtime, sentinel)
    for path in (runtime, runtime / "journal-1-0.json"):
        os.chown(path, OTHER_UID, OTHER_UID)
    results = [] if args[0] == "cleanup" else ["--results", str(tmp_path / "r")]
    res = vmtax(*args, *results, env={"VMTAX_RUNTIME": str(runtime)})
    assert res.returncode == 2 and res.stderr.splitlines() == [
        f"vmtax: error: runtime directory {runtime} is owned by uid {OTHER_UID}, not by uid 0 "
        "that runs vmtax: vmtax will not trust it (remove it, or set VMTAX_RUNTIME to a "
        "directory of your own)"]
    assert not sentinel.exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize("how, problem", [
    ("group-writable", "is writable by others (mode 770)"),
    ("world-writable", "is writable by others (mode 777)"),
    ("symlink", "is a symbolic link"),
    ("file", "is not a directory"),
    ("in an open directory", "which others can write to (mode 777)"),
])
def test_a_runtime_directory_others_can_change_is_refused(tmp_path, monkeypatch, how, problem):
    runtime = tmp_path / "rt"
    if how == "symlink":
        (tmp_path / "real").mkdir(mode=0o700)
        runtime.symlink_to(tmp_path / "real")
    elif how == "file":
        runtime.write_text("")
    elif how == "in an open directory":
        (tmp_path / "open").mkdir()
        os.chmod(tmp_path / "open", 0o777)
        runtime = tmp_path / "open" / "rt"
        runtime.mkdir(mode=0o700)
    else:
        runtime.mkdir()
        os.chmod(runtime, 0o770 if how == "group-writable" else 0o777)
    monkeypatch.setenv("VMTAX_RUNTIME", str(runtime))
    problem = re.escape(problem)
    with pytest.raises(VmtaxError, match=f"^runtime directory {runtime} .*{problem}"):
        paths.runtime_dir()
    with pytest.raises(VmtaxError, match=problem):
        journal.Journal()
    with pytest.raises(VmtaxError, match=problem):
        journal.left_behind_warning()


def test_the_runtime_directory_is_made_private(tmp_path, monkeypatch):
    monkeypatch.setenv("VMTAX_RUNTIME", str(tmp_path / "a" / "b"))
    made = paths.runtime_dir()
    assert [oct(p.stat().st_mode & 0o777) for p in (made.parent, made)] == ["0o700"] * 2
    assert paths.runtime_env()["VMTAX_RUNTIME"] == str(made)


def test_a_journal_file_that_is_a_symlink_or_damaged_is_refused(tmp_path):
    runtime = Path(os.environ["VMTAX_RUNTIME"])
    (tmp_path / "elsewhere.json").write_text("{}")
    (runtime / "journal-7-1.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(VmtaxError, match="journal-7-1.json: cannot be read"):
        journal.left_behind()
    (runtime / "journal-7-1.json").unlink()
    (runtime / "journal-7-1.json").write_text("{not json")
    with pytest.raises(VmtaxError, match="journal-7-1.json is damaged"):
        journal.recover()
    res = vmtax("cleanup")
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1, res.stderr


@pytest.mark.parametrize("entry, refusal", [
    ({"type": "argv", "argv": ["sh", "-c", "touch SENTINEL"]}, "is not one vmtax journals"),
    ({"type": "argv", "argv": ["env", "X=1", "sh", "-c", "touch SENTINEL"]},
     "is not one vmtax journals"),
    ({"type": "argv", "argv": ["ip", "netns", "exec", "x", "touch", "SENTINEL"]},
     "is not one vmtax journals"),
    ({"type": "argv", "argv": "touch SENTINEL"}, "is not a list of strings"),
    ({"type": "kill", "pid": -1, "start": 5}, "is not one vmtax journals"),
    ({"type": "kill", "pid": 1, "start": 5}, "is not one vmtax journals"),
    ({"type": "write", "path": "SENTINEL", "value": "x"}, "not a setting vmtax changes"),
    ({"type": "rmtree", "path": "/etc"}, "is not one vmtax journals"),
    ({"type": "rmtree", "path": "HOME"}, "holds the home or runtime directory"),
    ({"type": "rmtree", "path": "LINK"}, "is a symbolic link"),
    ({"type": "umount", "path": "/proc/sys/fs"}, "is not something vmtax does"),
    ({"type": "shell", "command": "touch SENTINEL"}, "unknown journal entry type 'shell'"),
    ({"type": "lease", "undo": "subprocess:getoutput"}, "not a function of vmtax"),
])
def test_an_entry_vmtax_does_not_write_is_refused(tmp_path, monkeypatch, entry, refusal):
    sentinel, home, kept = tmp_path / "sentinel", tmp_path / "home", tmp_path / "kept"
    home.mkdir()
    kept.mkdir()
    (tmp_path / "link").symlink_to(kept)
    monkeypatch.setenv("HOME", str(home))
    names = {"SENTINEL": str(sentinel), "HOME": str(home), "LINK": str(tmp_path / "link")}
    entry = json.loads(json.dumps(entry).replace("SENTINEL", str(sentinel)))
    entry = {k: names.get(v, v) if isinstance(v, str) else v for k, v in entry.items()}
    dead = journal.Journal(pid=2**22 + 3, start=1)
    dead.add(**entry)
    [line] = journal.recover()
    assert line.startswith(f"undid 1 host change(s) left by vmtax process {2**22 + 3} (1 failed")
    assert refusal in line
    assert not sentinel.exists() and home.exists() and kept.exists()


@root_only
def test_a_tree_another_user_owns_is_not_removed(tmp_path):
    theirs = tmp_path / "vmtax-serving-1"
    (theirs / "inside").mkdir(parents=True)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    j = journal.Journal()
    j.add(type="rmtree", path=str(theirs))
    [error] = j.undo_all()
    assert f"is owned by uid {OTHER_UID}: not a directory vmtax made" in error
    assert (theirs / "inside").exists()


@pytest.mark.parametrize("argv", [
    ["ip", "netns", "delete", "vmtax-0a1b2c"],
    ["ip", "-n", "vmtax-0a1b2c", "link", "delete", "vmtax-br"],
    ["/usr/sbin/runc", "--root", "/tmp/x/state", "delete", "-f", "vmtax-1"],
    ["/usr/bin/crun", "--root", "/tmp/x/state", "--systemd-cgroup", "delete", "-f", "c"],
    ["/usr/bin/runsc", "--root", "/tmp/x", "--network", "none", "delete", "--force", "c"],
    ["/usr/bin/env", "CONTAINERS_CONF=/tmp/x/containers.conf", "/usr/bin/podman", "--root",
     "/tmp/x", "rm", "--force", "--time=0", "--ignore", "c"],
])
def test_the_commands_vmtax_journals_are_accepted(argv):
    assert journal._check_argv(argv) == argv


def test_a_directory_is_journaled_before_it_is_made_never_someone_elses(tmp_path, monkeypatch):
    names = iter(["taken", "free"])
    monkeypatch.setattr(journal, "_suffix", lambda: next(names))
    (tmp_path / "vmtax-serving-taken").mkdir()
    j = journal.Journal()
    made, token = j.make_dir(tmp_path, "vmtax-serving-")
    assert made == tmp_path / "vmtax-serving-free" and oct(made.stat().st_mode & 0o777) == "0o700"
    assert list(j.entries.values()) == [{"type": "rmtree", "path": str(made)}]
    j.undo_all()
    assert not made.exists() and (tmp_path / "vmtax-serving-taken").exists()


def test_the_serving_client_gets_vmtax_runtime_settings():
    from vmtax.core import workload as workloads
    from vmtax.core.types import Endpoint

    serving = workloads.get("serving").make({}, 2, strict=False)
    job = serving.client_job(Endpoint(address="10.0.0.2", port=8080))
    assert job.env["VMTAX_RUNTIME"] == os.environ["VMTAX_RUNTIME"]


def full_disk(monkeypatch) -> None:
    """Every write of a journal fails as on a full disk."""
    real_open = open

    def open_full(path, mode="r", *args, **kwargs):
        if "w" in mode and "journal-" in str(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_open(path, mode, *args, **kwargs)
    monkeypatch.setattr("builtins.open", open_full)


def test_a_journal_that_cannot_be_written_records_nothing_and_says_so(tmp_path, monkeypatch):
    j = journal.Journal()
    kept = j.add(type="rmtree", path=str(tmp_path / "first"))
    before = j.path.read_text()
    full_disk(monkeypatch)
    with pytest.raises(VmtaxError, match=r"^cannot write the undo journal .*journal-\d+-\d+"
                       r"\.json \(No space left on device\); stopped before changing the host$"):
        j.make_dir(tmp_path, "vmtax-x-")
    assert list(tmp_path.glob("vmtax-x-*")) == [] and list(j.entries) == [kept]
    assert j.path.read_text() == before and not list(j.dir.glob("*.tmp"))
    j.undo_all()                   # undoing works on a full disk: the last one removes the file
    assert j.entries == {} and not j.path.exists()


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A full 8 KiB tmpfs, unmounted after the test."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "full"
    mount.mkdir(mode=0o700)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k,mode=0700", "vmtax-test",
                       str(mount)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with open(mount / "filler", "wb") as f:
            try:
                f.write(b"x" * 65536)
            except OSError:
                pass
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_run_with_a_full_runtime_directory_stops_before_changing_the_host(tmp_path,
                                                                           tiny_tmpfs):
    results = tmp_path / "r"
    res = vmtax("run", "--targets", "native", "--workloads", "cpu", "--runs", "1", "--warmup",
                "0", "--time", "1", "--results", str(results),
                env={"VMTAX_RUNTIME": str(tiny_tmpfs)}, timeout=120)
    assert res.returncode == 2, res.stderr
    [line] = res.stderr.splitlines()
    assert line.startswith(f"vmtax: error: cannot write the undo journal {tiny_tmpfs}/journal-")
    assert line.endswith("(No space left on device); stopped before changing the host")
    assert not list(results.glob(".work-*"))


@pytest.mark.live
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser")
                    or not os.path.exists(f"/usr/bin/python{sys.version_info[0]}."
                                          f"{sys.version_info[1]}"),
                    reason="needs root, runuser and a system Python of this version")
def test_as_nobody_a_planted_default_runtime_directory_runs_nothing(tmp_path):
    """The issue's attack: another user pre-creates nobody's default runtime directory
    (/tmp/vmtax-65534/vmtax) with a journal; nobody's `vmtax cleanup` refuses it. The
    venv's Python lives under /root, which nobody cannot read: the system Python of the
    same version runs vmtax's sources with the venv's packages."""
    nobody = 65534
    planted = Path(f"/tmp/vmtax-{nobody}")
    if os.path.lexists(planted):
        pytest.skip(f"{planted} exists already")
    sentinel = Path(f"/tmp/vmtax-planted-{os.getpid()}")
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, nobody, nobody)
    os.chmod(tmp_path, 0o755)
    try:
        plant(planted / "vmtax", sentinel)
        for path in (planted, planted / "vmtax", planted / "vmtax" / "journal-1-0.json"):
            os.chown(path, OTHER_UID, OTHER_UID)
            os.chmod(path, 0o777 if path.is_dir() else 0o666)
        site = next(p for p in sys.path if p.endswith("site-packages"))
        src = str(Path(__file__).resolve().parent.parent / "src")
        res = subprocess.run(
            ["runuser", "-u", "nobody", "--", "env", "-i", "PATH=/usr/bin:/bin", f"HOME={home}",
             f"PYTHONPATH={src}:{site}", f"/usr/bin/python{sys.version_info[0]}."
             f"{sys.version_info[1]}", "-m", "vmtax", "cleanup"],
            capture_output=True, text=True, timeout=120, cwd="/")
        assert res.returncode == 2 and res.stderr.splitlines() == [
            f"vmtax: error: runtime directory {planted}/vmtax is owned by uid {OTHER_UID}, not "
            f"by uid {nobody} that runs vmtax: vmtax will not trust it (remove it, or set "
            "VMTAX_RUNTIME to a directory of your own)"], res.stderr
        assert not sentinel.exists()
    finally:
        shutil.rmtree(planted, ignore_errors=True)
        sentinel.unlink(missing_ok=True)


def test_a_killed_serving_client_leaves_nothing(tmp_path):
    """The client's scratch directory is unpredictable, in the runtime directory, and
    undone by the client's guardian at once when the client is killed."""
    runtime = Path(os.environ["VMTAX_RUNTIME"])
    vegeta = tmp_path / "vegeta"
    vegeta.write_text("#!/bin/sh\nexec sleep 60\n")
    vegeta.chmod(0o755)
    spec = {"mode": "workers", "vegeta": str(vegeta), "base": "http://127.0.0.1:9",
            "endpoints": [{"name": "x", "path": "/", "method": "GET"}], "requests": 1,
            "workers": 1, "request_timeout": 1}
    client = subprocess.Popen([sys.executable, "-m", "vmtax.helpers.serving_client",
                               json.dumps(spec)], stderr=subprocess.PIPE, text=True,
                              env={"PATH": os.environ["PATH"], **paths.runtime_env()})
    assert wait_for(lambda: list(runtime.glob("vmtax-serving-*/targets")), 30)
    [scratch] = runtime.glob("vmtax-serving-*")
    assert len(scratch.name) == len("vmtax-serving-") + 12
    client.kill()
    client.communicate()
    assert wait_for(lambda: not scratch.exists() and not list(runtime.glob("journal-*")), 10)


def test_a_runtime_command_other_than_a_delete_is_refused():
    with pytest.raises(journal.Refused):
        journal._check_argv(["runc", "exec", "c", "sh", "-c", "id", "delete", "-f", "x", "y"])
    with pytest.raises(journal.Refused):
        journal._check_argv(["podman", "run", "--rm", "x", "sh", "-c", "rm -rf /"])
    with pytest.raises(journal.Refused):
        journal._check_argv(["runc", "exec", "c", "sh", "-c", "id", "delete", "-f", "x"])


def test_a_runtime_directory_opened_to_others_mid_run_takes_no_more_entries(tmp_path):
    j = journal.Journal()
    os.chmod(j.dir, 0o777)
    with pytest.raises(VmtaxError, match=re.escape("is writable by others (mode 777)")):
        j.add(type="rmtree", path=str(tmp_path / "x"))
    assert j.entries == {} and not j.path.exists()
