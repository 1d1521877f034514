"""An undo that fails is kept in the journal until a retry succeeds, and never hides why a
study failed (issue #35, item 2: a failed LXD start was reported as the undo's "Profile is
currently in use", and the journal was dropped, so `cleanup` found nothing to clean up)."""

import pytest

from vmtax.core.errors import VmtaxError
from vmtax.host import journal
from vmtax.results.store import Store
from vmtax.studies import session


def test_a_failed_undo_stays_journaled_until_a_retry_succeeds(tmp_path):
    used = tmp_path / "used"
    (used / "inside").mkdir(parents=True)
    j = journal.Journal(tmp_path / "run", pid=2**22 + 5, start=1)   # a dead vmtax's
    j.add(type="rmdir", paths=[str(used)])
    j.add(type="lease", undo="os:abort")         # refused: no retry would carry it out
    errors = j.undo_all()
    assert len(errors) == 2 and "Directory not empty" in errors[1]
    assert list(journal.Journal.at(j.path).entries.values()) == [
        {"type": "rmdir", "paths": [str(used)]}]
    assert journal.left_behind(tmp_path / "run")
    assert "1 failed, 1 kept to retry" in journal.undo_left(j.path)
    assert j.path.exists()
    (used / "inside").rmdir()
    assert journal.undo_left(j.path) == f"undid 1 host change(s) left by vmtax process {j.pid}"
    assert not used.exists() and not j.path.exists()


class Target:
    kind, bare_host = "native", False

    def __init__(self, own, used):
        self.own, self.used = own, used

    def cleanup(self):
        self.own.undo(self.token)     # raises while the directory is in use

    def make(self):
        self.token = self.own.add(type="rmdir", paths=[str(self.used)])


@pytest.fixture
def study(tmp_path):
    own = journal.Journal(tmp_path / "run")
    used = tmp_path / "used"
    (used / "inside").mkdir(parents=True)
    target = Target(own, used)
    target.make()
    return own, target


def test_why_a_study_failed_is_raised_not_the_undo_that_failed(tmp_path, study):
    own, target = study
    with pytest.raises(RuntimeError, match="the start failed"):
        with session.session(Store(tmp_path / "results"), own) as s:
            s.targets["t"] = target
            raise RuntimeError("the start failed")
    assert [e["type"] for e in own.entries.values()] == ["rmdir"]   # kept to retry


def test_a_study_that_leaves_a_change_in_place_says_so(tmp_path, study):
    own, target = study
    with pytest.raises(VmtaxError, match=r"^1 host change\(s\) could not be undone, first "
                                         r"cgroup: .*Directory not empty.*; kept in the undo "
                                         r"journal: vmtax's guardian retries at exit"):
        with session.session(Store(tmp_path / "results"), own) as s:
            s.targets["t"] = target
    assert [e["type"] for e in own.entries.values()] == ["rmdir"]
