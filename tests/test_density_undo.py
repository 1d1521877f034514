"""A density run's journal at scale (issue #37: kill -9 with 200 guests up, nothing left
within 10 s): undone whole, a namespace takes its devices with it and directory trees wait
for the processes' kills, then go deepest first, several at a time (live:
scripts/torture_density.py)."""

import subprocess

from vmtax.host import daemon, journal


def guest_journal(tmp_path, guests):
    """A journal shaped like a density run's: a namespace, then per guest a run
    directory, a disk directory under the session's work directory, and a tap."""
    j = journal.Journal(tmp_path / "runtime")
    j.add(type="argv", argv=["ip", "netns", "delete", "vmtax-ab12cd"])
    work = tmp_path / "results" / ".work-1"
    work.mkdir(parents=True)
    j.add(type="rmtree", path=str(work))
    trees = [work]
    for i in range(guests):
        for tree in (tmp_path / f"vmtax-vm-{i}", work / f"vm-{i}"):
            tree.mkdir()
            (tree / "scratch.img").write_bytes(b"\0" * 4096)
            j.add(type="rmtree", path=str(tree))
            trees.append(tree)
        j.add(type="argv", argv=["ip", "-n", "vmtax-ab12cd", "link", "delete", f"vtab{i}"])
    return j, trees


def test_a_namespace_takes_its_devices_and_every_tree_goes(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(journal.subprocess, "run",
                        lambda argv, **kw: ran.append(argv) or subprocess.CompletedProcess(argv, 0))
    j, trees = guest_journal(tmp_path, 20)
    writes = []
    real_write = journal.Journal._write
    monkeypatch.setattr(journal.Journal, "_write",
                        lambda self: writes.append(len(self.entries)) or real_write(self))
    assert j.undo_all() == []
    # One `ip`: the namespace's deletion, not one per device.
    assert ran == [["ip", "netns", "delete", "vmtax-ab12cd"]]
    assert not any(t.exists() for t in trees) and not j.path.exists() and j.entries == {}
    # One write for the namespace, one for its 20 devices, one per depth of trees (the
    # work directory's guests', the work directory, the run directories): 5, not 61.
    assert len(writes) == 5, writes


def test_a_namespace_that_stays_has_its_devices_deleted_by_name(tmp_path, monkeypatch):
    ran = []

    def run(argv, **kw):
        if argv[:3] == ["ip", "netns", "delete"]:
            raise subprocess.TimeoutExpired(argv, 30)   # a hung `ip`
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0)
    monkeypatch.setattr(journal.subprocess, "run", run)
    j, _ = guest_journal(tmp_path, 3)
    [error] = j.undo_all()
    assert "network namespace" in error
    assert ran == [["ip", "-n", "vmtax-ab12cd", "link", "delete", f"vtab{i}"]
                   for i in (2, 1, 0)]
    # Only the namespace is left, to retry.
    assert [e["argv"] for e in j.entries.values()] == [["ip", "netns", "delete",
                                                        "vmtax-ab12cd"]]


def test_a_tree_goes_after_every_newer_entry(tmp_path, monkeypatch):
    """A tree is removed after what was made in it later (a mount), never before."""
    order = []
    monkeypatch.setattr(journal.subprocess, "run",
                        lambda argv, **kw: order.append(argv[0]) or
                        subprocess.CompletedProcess(argv, 0))
    real_rmtree = journal.shutil.rmtree
    monkeypatch.setattr(journal.shutil, "rmtree",
                        lambda path, **kw: order.append("rmtree") or real_rmtree(path, **kw))
    j = journal.Journal(tmp_path / "runtime")
    tree = tmp_path / "tree"
    (tree / "mnt").mkdir(parents=True)
    j.add(type="rmtree", path=str(tree))
    j.add(type="umount", path=str(tree / "mnt"))
    assert j.undo_all() == []
    assert order == ["umount", "rmtree"] and not tree.exists()


def test_trees_wait_for_kills_but_not_for_an_older_daemon_or_command(tmp_path, monkeypatch):
    """A tree goes before every older entry but a process's kill, as one by one: CI saw a
    daemon (dockerd, lxd) take over 5 s to stop once its trees were left for last."""
    done = []
    real_undo = journal._undo

    def undo(entry, j):
        done.append(entry.get("path") or entry["type"])
        if entry["type"] == "rmtree":
            real_undo(entry, j)
    monkeypatch.setattr(journal, "_undo", undo)
    j = journal.Journal(tmp_path / "runtime")
    j.add(type="argv", argv=["ip", "link", "delete", "vmtax-br0"])   # older than the trees
    j.add(type="kill", pid=4_000_000, start=1)
    older, newer = tmp_path / "a", tmp_path / "b"
    for tree in (older, newer):
        tree.mkdir()
        j.add(type="rmtree", path=str(tree))
        j.add(type="kill", pid=4_000_000, start=1)
    assert j.undo_all() == []
    # The kills as they come, newest first; the trees, together, before the older `ip`.
    assert done[:3] == ["kill"] * 3
    assert set(done[3:5]) == {str(older), str(newer)} and done[5:] == ["argv"]
    assert not older.exists() and not newer.exists()


def test_a_daemon_sees_no_newer_change_left_once_its_namespaces_are_gone(tmp_path, monkeypatch):
    """A daemon's stop refuses while a newer change is listed (daemon._still_needed). A
    namespace's devices, which go with it, were still listed then: a clean-clone CI's
    kill -9 left dockerd and lxd running."""
    ran, needed = [], []
    real_undo = journal._undo

    def undo(entry, j):
        if entry["type"] == "daemon":
            needed.append((entry["name"], daemon._still_needed(j, entry)))
        else:
            real_undo(entry, j)
    monkeypatch.setattr(journal, "_undo", undo)
    monkeypatch.setattr(journal.subprocess, "run",
                        lambda argv, **kw: ran.append(argv) or subprocess.CompletedProcess(argv, 0))
    j = journal.Journal(tmp_path / "runtime")
    j.add(type="argv", argv=["ip", "netns", "delete", "vmtax-old"])
    j.add(type="daemon", name="dockerd", pid=4_000_000, start=1)
    # The older namespace's device is newer than the daemon: it goes by name before it.
    j.add(type="argv", argv=["ip", "-n", "vmtax-old", "link", "delete", "veth0"])
    j.add(type="argv", argv=["ip", "netns", "delete", "vmtax-new"])
    j.add(type="argv", argv=["ip", "-n", "vmtax-new", "link", "delete", "veth1"])
    assert j.undo_all() == []
    assert needed == [("dockerd", 0)]
    assert ran == [["ip", "netns", "delete", "vmtax-new"],
                   ["ip", "-n", "vmtax-old", "link", "delete", "veth0"],
                   ["ip", "netns", "delete", "vmtax-old"]]
    assert j.entries == {}
