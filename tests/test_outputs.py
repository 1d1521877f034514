"""The files vmtax writes for a user are written, never replaced (vmtax.host.outputs, issue
#45 defects 1 and 11): a device node, a FIFO or a link given as FILE is written through, a
directory refused in one line; a regular file is replaced atomically, and a kill leaves no
temporary file that `vmtax cleanup` does not remove."""

import os
import stat
import threading

import pytest
from click.testing import CliRunner
from test_history import add_run

from vmtax.cli.main import cli
from vmtax.core.errors import VmtaxError
from vmtax.host import journal, outputs
from vmtax.results.store import Store

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")


def null_node(path):
    """A character device like /dev/null, made where the test wants it."""
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return path


def state(path):
    st = os.lstat(path)
    return (stat.S_IFMT(st.st_mode), st.st_ino, st.st_rdev,
            os.readlink(path) if stat.S_ISLNK(st.st_mode) else None)


def test_a_new_file_is_written_whole_and_nothing_else(tmp_path):
    outputs.write_file(tmp_path / "t.csv", b"new")
    assert (tmp_path / "t.csv").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runtime", "t.csv"]


def test_a_regular_file_is_replaced_atomically_and_leaves_no_temporary_name(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("old")
    before = os.stat(path).st_ino
    outputs.write_file(path, b"new")
    assert path.read_bytes() == b"new" and os.stat(path).st_ino != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runtime", "t.csv"]
    assert not list((tmp_path / "runtime").glob("journal-*"))   # the name is forgotten


@root_only
def test_a_device_node_is_written_through_never_replaced(tmp_path):
    node = null_node(tmp_path / "null")
    before = state(node)
    outputs.write_file(node, b"x" * 100_000)
    assert state(node) == before and stat.S_ISCHR(os.lstat(node).st_mode)


def test_a_link_is_written_through_and_stays_a_link(tmp_path):
    mine = tmp_path / "mine.txt"
    mine.write_text("the user's own\n")
    link = tmp_path / "link"
    link.symlink_to(mine)
    before, target = state(link), os.stat(mine).st_ino
    outputs.write_file(link, b"new")
    assert state(link) == before and os.stat(mine).st_ino == target
    assert mine.read_bytes() == b"new"


def test_a_fifo_is_written_to_its_reader_and_one_no_one_reads_is_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(VmtaxError, match=r"^cannot write .*/fifo: it is a FIFO that no one "
                                         r"reads$"):
        outputs.write_file(fifo, b"data")
    # A reader first, then the writer: more than a pipe holds, read as it comes.
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer = threading.Thread(target=outputs.write_file, args=(fifo, b"data" * 50_000))
    writer.start()
    got = b""
    while writer.is_alive() or len(got) < 200_000:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            chunk = b""
        got += chunk
        if not chunk and not writer.is_alive():
            break
    writer.join()
    os.close(fd)
    assert got == b"data" * 50_000 and stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("make, message", [
    (lambda p: p.mkdir(), "it is a directory; expected a file"),
    (lambda p: p.symlink_to(p.parent / "nowhere"), "it is a symbolic link to nothing"),
])
def test_what_cannot_be_written_through_is_refused_and_kept(tmp_path, make, message):
    path = tmp_path / "out"
    make(path)
    before = state(path)
    with pytest.raises(VmtaxError, match=f"^cannot write {path}: {message}$"):
        outputs.write_file(path, b"x")
    assert state(path) == before and not (tmp_path / "nowhere").exists()


def test_a_temporary_name_a_kill_left_is_removed_by_cleanup_and_only_that(tmp_path):
    """The window between a temporary name and its rename is journaled: a vmtax killed
    there leaves a journal of a dead process whose undo removes the file."""
    runtime = tmp_path / "runtime"
    left = tmp_path / ".t.csv.0123abcd.tmp"
    left.write_text("half")
    mine = tmp_path / "mine.csv"
    mine.write_text("the user's")
    dead = journal.Journal(runtime, pid=2**22 + 7, start=1)
    dead.add(type="unlink", path=str(left))
    dead.add(type="unlink", path=str(mine))    # not a name vmtax gives: refused
    assert "2 temporary files" in journal.left_behind_warning(runtime)
    [line] = journal.recover(runtime)
    assert "(1 failed" in line and "not something vmtax does" in line
    assert not left.exists() and mine.read_text() == "the user's"


def test_the_temporary_name_is_journaled_while_it_exists(tmp_path, monkeypatch):
    path = tmp_path / "t.csv"
    path.write_text("old")
    seen = []

    def rename(src, dst, **kwargs):
        seen.append([e["path"] for j in (journal.Journal(),) for e in j.entries.values()])
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(VmtaxError, match="No space left on device"):
        outputs.write_file(path, b"new")
    [[journaled]] = seen
    assert journaled.startswith(str(tmp_path / ".t.csv.")) and journaled.endswith(".tmp")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == [
        "runtime", "t.csv"]


@pytest.fixture
def named(tmp_path):
    results = tmp_path / "results"
    store = Store(results)
    for seed in range(3):
        add_run(store, "nightly", {"native": 1000, "vm:tcg": 200}, seed=seed)
    store.close()
    return str(results)


@root_only
def test_no_output_option_deletes_or_replaces_a_device_or_a_link_of_the_users(tmp_path,
                                                                             named):
    """Every option that writes a FILE (export's five formats, compare --junit, report
    --html, --png and --svg, trend --html, publish's pages): given a device node and a link
    to a file of the user's, each stays what it was, and the user's file stays there."""
    runner = CliRunner()
    mine = tmp_path / "mine.txt"
    mine.write_text("the user's own\n")

    def invoke(*args):
        done = runner.invoke(cli, [*args, "--results", named], catch_exceptions=False)
        assert done.exit_code == 0, done.output

    commands = [["export", "last", f"--{fmt}", "{}"]
                for fmt in ("csv", "json", "jsonl", "benchstat", "markdown")]
    commands += [["compare", "last~1", "last", "--junit", "{}"], ["report", "last", "--html", "{}"],
                 ["trend", "nightly", "--html", "{}"]]
    for n, command in enumerate(commands):
        for path in (null_node(tmp_path / f"null-{n}"), tmp_path / f"link-{n}"):
            if path.name.startswith("link"):
                path.symlink_to(mine)
            before = state(path)
            invoke(*[str(path) if a == "{}" else a for a in command])
            assert state(path) == before, command
            assert mine.exists()
    # Figures into a directory whose figure files are devices: written through; links out
    # of the directory: refused (paths.under), in one line.
    figures = tmp_path / "figures"
    invoke("report", "last", "--html", str(tmp_path / "r.html"), "--png", str(figures))
    for figure in figures.iterdir():
        figure.unlink()
        null_node(figure)
    before = {f: state(f) for f in figures.iterdir()}
    invoke("report", "last", "--html", str(tmp_path / "r.html"), "--png", str(figures))
    assert {f: state(f) for f in before} == before
    for figure in figures.iterdir():
        figure.unlink()
        figure.symlink_to(mine)
    before = {f: state(f) for f in figures.iterdir()}
    done = runner.invoke(cli, ["report", "last", "--html", str(tmp_path / "r.html"), "--png",
                               str(figures), "--results", named])
    assert isinstance(done.exception, VmtaxError) and "leads outside" in str(done.exception)
    assert {f: state(f) for f in before} == before and mine.exists()
