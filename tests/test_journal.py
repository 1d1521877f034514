import errno
import importlib
import importlib.util
import os
import subprocess
import sys
import time
import types

from vmtax.host import journal, proc


def test_undo_all_removes_dirs_and_the_journal(tmp_path):
    j = journal.Journal(tmp_path)
    made = tmp_path / "made"
    (made / "inside").mkdir(parents=True)
    j.add(type="rmtree", path=str(made))
    assert j.path.exists()
    assert j.undo_all() == []
    assert not made.exists() and not j.path.exists()


def test_rmdir_waits_out_a_busy_directory_and_skips_missing_ones(tmp_path, monkeypatch):
    busy, free = tmp_path / "busy", tmp_path / "free"
    busy.mkdir()
    free.mkdir()
    refusals = iter([True, True])   # like a cgroup whose last task is still exiting
    real_rmdir = os.rmdir

    def rmdir(path):
        if path == str(busy) and next(refusals, False):
            raise OSError(errno.EBUSY, "busy")
        real_rmdir(path)
    monkeypatch.setattr(journal.os, "rmdir", rmdir)
    j = journal.Journal(tmp_path)
    j.add(type="rmdir", paths=[str(tmp_path / "missing"), str(busy), str(free)])
    assert j.undo_all() == []
    assert not busy.exists() and not free.exists() and j.entries == {}


def test_rmdir_of_a_directory_in_use_fails_and_says_so(tmp_path):
    used = tmp_path / "used"
    (used / "inside").mkdir(parents=True)
    j = journal.Journal(tmp_path)
    j.add(type="rmdir", paths=[str(used)])
    errors = j.undo_all()
    assert len(errors) == 1 and "Directory not empty" in errors[0] and used.exists()


def test_forget_drops_entry_without_undoing(tmp_path):
    j = journal.Journal(tmp_path)
    made = tmp_path / "made"
    made.mkdir()
    token = j.add(type="rmtree", path=str(made))
    j.forget(token)
    assert made.exists() and not j.path.exists()


def test_recover_undoes_a_dead_process_journal_and_kills_its_children(tmp_path):
    # A vmtax that died (SIGKILL) left a journal: a child process and a directory.
    child = proc.spawn(["sleep", "60"])
    made = tmp_path / "left"
    made.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    j = journal.Journal(tmp_path, pid=int(dead))
    j.process(child.pid)
    j.add(type="rmtree", path=str(made))
    lines = journal.recover(tmp_path)
    assert lines == [f"undid 2 host change(s) left by vmtax process {dead}"]
    child.wait(timeout=5)
    assert not made.exists()
    assert not list(tmp_path.glob("journal-*.json"))


def test_a_reused_pid_does_not_keep_a_dead_journal_alive(tmp_path):
    made = tmp_path / "left"
    made.mkdir()
    # Our own pid, but a start time that is not ours: the owner is gone.
    journal.Journal(tmp_path, pid=os.getpid(), start=1).add(type="rmtree", path=str(made))
    assert len(journal.recover(tmp_path)) == 1 and not made.exists()


def test_recover_leaves_a_running_owner_alone_whatever_its_name(tmp_path):
    running = proc.spawn([sys.executable, "-c", "import time; time.sleep(30)"])
    made = tmp_path / "theirs"
    made.mkdir()
    journal.Journal(tmp_path, pid=running.pid).add(type="rmtree", path=str(made))
    assert journal.recover(tmp_path) == []
    assert made.exists()
    proc.kill_group(running)


def test_killed_process_is_not_confused_with_a_reused_pid(tmp_path):
    child = proc.spawn(["sleep", "60"])
    j = journal.Journal(tmp_path, pid=999999)
    token = j.add(type="kill", pid=child.pid, start=12345)   # wrong start time: not ours
    j.undo(token)
    time.sleep(0.1)
    assert child.poll() is None
    proc.kill_group(child)


def test_an_entry_is_undone_by_the_function_it_names(tmp_path, monkeypatch):
    # A module of vmtax's that journals a change of its own, undone without the journal
    # knowing it: imported by name, as a fresh `vmtax cleanup` would.
    undone = []
    module = types.ModuleType("vmtax.host.fake_lease")

    def end(j, entry):
        undone.append((j, entry["what"]))
    end.__module__, end.__qualname__ = module.__name__, "end"
    module.end = end
    monkeypatch.setitem(sys.modules, module.__name__, module)
    j = journal.Journal(tmp_path)
    assert journal.undone_by(end) == "vmtax.host.fake_lease:end"
    j.add(type="lease", undo=journal.undone_by(end), what="pages")
    assert j.undo_all() == [] and undone == [(j, "pages")]


def test_an_undo_outside_vmtax_is_neither_imported_nor_run(tmp_path):
    j = journal.Journal(tmp_path)
    j.add(type="lease", undo="os:abort")
    [error] = j.undo_all()
    assert "'os:abort', which is not a function of vmtax" in error and j.entries == {}


def test_a_journal_of_the_previous_version_is_still_undone(tmp_path):
    # Its entries named no undo: their type did ("ksm", "hugepages", "remote").
    sysfs = tmp_path / "ksm"
    sysfs.mkdir()
    for name, value in {"run": 1, "pages_to_scan": 1000, "sleep_millisecs": 20}.items():
        (sysfs / name).write_text(f"{value}\n")
    saved = {"run": 0, "pages_to_scan": 100, "sleep_millisecs": 200}
    (tmp_path / "journal").mkdir()
    dead = journal.Journal(tmp_path / "journal", pid=2**22 + 5, start=1)
    dead.add(type="ksm", path=str(sysfs), saved=saved)
    assert len(journal.recover(tmp_path / "journal")) == 1
    assert {n: int((sysfs / n).read_text()) for n in saved} == saved


def test_every_moved_undo_path_names_a_function_this_vmtax_has():
    # A journal written before a move names the old path; the old module is gone, so the
    # table is all that undoes it.
    for old, new in journal.MOVED.items():
        module, _, function = new.partition(":")
        handler = getattr(importlib.import_module(module), function)
        assert journal.undone_by(handler) == new and journal._handler(old) is handler
        assert importlib.util.find_spec(old.partition(":")[0]) is None, old
