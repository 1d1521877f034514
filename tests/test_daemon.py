"""host.daemon: a daemon started when none answers, journaled and stopped by the journal;
one already running is used and left alone."""

import socket
import sys
import time

import pytest

from vmtax.core.errors import VmtaxError
from vmtax.host import daemon
from vmtax.host.journal import Journal
from vmtax.host.proc import running

SERVE = ("import socket, sys, time\n"
         "time.sleep(float(sys.argv[2]))\n"
         "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()\n"
         "while True: s.accept()[0].close()\n")


def _daemon(tmp_path, delay=0.2, argv=None):
    sock = tmp_path / "d.sock"
    return daemon.Daemon("fake", tuple(argv or (sys.executable, "-c", SERVE, str(sock),
                                                str(delay))), sock)


def test_started_journaled_and_stopped_by_the_journal(tmp_path):
    journal = Journal(tmp_path / "run")
    fake = _daemon(tmp_path)
    assert daemon.ensure(journal, fake, tmp_path / "logs", timeout=20)
    (entry,) = journal.entries.values()
    assert entry["type"] == "daemon" and running(entry["pid"], entry["start"])
    assert daemon.answers(fake.socket)
    journal.undo_all()
    assert not running(entry["pid"], entry["start"]) and not journal.entries


def test_one_already_running_is_left_alone(tmp_path):
    mine = Journal(tmp_path / "mine")
    fake = _daemon(tmp_path, delay=0)
    daemon.ensure(mine, fake, tmp_path / "logs", timeout=20)
    theirs = Journal(tmp_path / "theirs")
    assert daemon.ensure(theirs, fake, tmp_path / "logs") is False
    assert not theirs.entries
    theirs.undo_all()
    assert daemon.answers(fake.socket)
    mine.undo_all()


def test_a_daemon_that_never_answers_is_one_line_naming_its_log(tmp_path):
    journal = Journal(tmp_path / "run")
    silent = _daemon(tmp_path, argv=(sys.executable, "-c", "import time; time.sleep(60)"))
    start = time.monotonic()
    with pytest.raises(VmtaxError, match=r"fake did not answer on .*d\.sock within 1 s; "
                                         r"its log: .*fake\.log"):
        daemon.ensure(journal, silent, tmp_path / "logs", timeout=1)
    assert time.monotonic() - start < 5
    journal.undo_all()


def test_a_daemon_that_exits_says_its_status(tmp_path):
    journal = Journal(tmp_path / "run")
    dead = _daemon(tmp_path, argv=(sys.executable, "-c", "raise SystemExit(3)"))
    with pytest.raises(VmtaxError, match="fake exited with status 3"):
        daemon.ensure(journal, dead, tmp_path / "logs", timeout=20)
    journal.undo_all()


def test_answers_is_false_for_a_missing_socket(tmp_path):
    assert not daemon.answers(tmp_path / "none.sock")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "bound.sock"))   # bound, not listening: refuses
        assert not daemon.answers(tmp_path / "bound.sock")


USER = ("import sys, time\n"
        "from pathlib import Path\n"
        "from vmtax.host import daemon\n"
        "from vmtax.host.journal import Journal\n"
        "journal = Journal(Path(sys.argv[1]))\n"
        "d = daemon.Daemon('fake', tuple(sys.argv[3:]), Path(sys.argv[2]))\n"
        "print(daemon.ensure(journal, d, Path(sys.argv[1]) / 'logs', timeout=20), flush=True)\n"
        "sys.stdin.readline()\n"
        "journal.undo_all()\n")


def _user(tmp_path, name, fake):
    import subprocess
    proc = subprocess.Popen([sys.executable, "-c", USER, str(tmp_path / name), str(fake.socket),
                             *fake.argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    return proc, proc.stdout.readline().strip()


def test_a_shared_daemon_stops_with_its_last_user_whoever_started_it(tmp_path):
    fake = _daemon(tmp_path, delay=0)
    first, started = _user(tmp_path, "first", fake)
    second, found = _user(tmp_path, "second", fake)
    assert (started, found) == ("True", "False")
    first.communicate("\n", timeout=30)     # the one that started it ends first
    assert daemon.answers(fake.socket)      # the second still uses it
    second.communicate("\n", timeout=30)
    assert not daemon.answers(fake.socket)


def test_a_killed_user_leaves_the_daemon_to_the_other(tmp_path):
    fake = _daemon(tmp_path, delay=0)
    first, _ = _user(tmp_path, "first", fake)
    second, _ = _user(tmp_path, "second", fake)
    second.kill()
    second.wait()
    first.communicate("\n", timeout=30)     # the last user: the daemon stops
    assert not daemon.answers(fake.socket)
