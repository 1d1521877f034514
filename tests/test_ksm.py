"""KSM leases against a fake sysfs: the host's settings come back after the last lease,
whoever ends first, also when an owner died and its journal is undone by someone else."""

import json

import pytest

from vmtax.core.errors import VmtaxError
from vmtax.host import journal, ksm

HOST = {"run": 0, "pages_to_scan": 100, "sleep_millisecs": 200}


def fake_sysfs(path, **values):
    path.mkdir()
    for name, value in {**HOST, "pages_sharing": 0, "pages_shared": 0, "full_scans": 0,
                        "pages_scanned": 0, **values}.items():
        (path / name).write_text(f"{value}\n")
    return path


def journal_of(directory, pid):
    directory.mkdir(exist_ok=True)
    return journal.Journal(directory, pid=pid, start=1)


def test_a_lease_turns_ksm_on_and_gives_the_host_its_settings_back(tmp_path):
    sysfs = fake_sysfs(tmp_path / "ksm")
    j = journal_of(tmp_path / "journal", 100)
    lease = ksm.enable(j, 1000, 20, sysfs)
    assert ksm.settings(sysfs) == {"run": 1, "pages_to_scan": 1000, "sleep_millisecs": 20}
    [entry] = j.entries.values()
    assert entry == {"type": "ksm", "undo": "vmtax.host.ksm:end_lease", "path": str(sysfs),
                     "saved": HOST}
    lease.release()
    lease.release()
    assert ksm.settings(sysfs) == HOST
    assert j.entries == {}


def test_the_last_lease_out_restores_whoever_ends_first(tmp_path):
    sysfs = fake_sysfs(tmp_path / "ksm")
    a = journal_of(tmp_path / "journal", 100)
    b = journal_of(tmp_path / "journal", 200)
    lease_a = ksm.enable(a, 1000, 20, sysfs)
    lease_b = ksm.enable(b, 500, 50, sysfs)
    # b saw KSM on, but what it keeps is the host's settings from before a.
    assert [e["saved"] for e in b.entries.values()] == [HOST]
    lease_a.release()
    assert ksm.settings(sysfs)["run"] == 1          # b still holds it
    lease_b.release()
    assert ksm.settings(sysfs) == HOST


def test_a_dead_owners_journal_restores_the_host(tmp_path):
    sysfs = fake_sysfs(tmp_path / "ksm")
    dead = journal_of(tmp_path / "journal", 300)
    ksm.enable(dead, 1000, 20, sysfs)
    # What the guardian or the next start does with a dead owner's journal.
    journal.undo_left(dead.path)
    assert ksm.settings(sysfs) == HOST
    assert not dead.path.exists()


def test_no_ksm_is_one_line(tmp_path):
    with pytest.raises(VmtaxError, match="this kernel has no KSM"):
        ksm.enable(journal_of(tmp_path / "journal", 1), 1000, 20, tmp_path / "missing")


def test_merging_settles_after_two_full_scans_with_stable_sharing(tmp_path):
    sysfs = fake_sysfs(tmp_path / "ksm")
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds
        scans = int(now[0] // 2)           # a full scan every 2 s
        (sysfs / "pages_scanned").write_text(f"{int(now[0] * 100)}\n")
        (sysfs / "full_scans").write_text(f"{scans}\n")
        (sysfs / "pages_sharing").write_text(f"{min(scans, 3) * 1000}\n")

    settled = ksm.wait_merged(0.02, 5.0, 60.0, sysfs, clock=lambda: now[0], sleep=sleep)
    assert settled.settled and settled.counters["pages_sharing"] == 3000
    assert 10 <= settled.seconds <= 15   # sharing stops growing at 6 s, then a window
    # The merge curve: every reading, in order, from none merged to where it settled.
    times = [t for t, _ in settled.curve]
    assert times == sorted(times) and settled.curve[0] == (0.0, 0)
    assert settled.curve[-1] == (round(settled.seconds, 2), 3000)


def test_merging_that_never_settles_times_out(tmp_path):
    sysfs = fake_sysfs(tmp_path / "ksm")
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds
        (sysfs / "full_scans").write_text(f"{int(now[0])}\n")
        (sysfs / "pages_scanned").write_text(f"{int(now[0] * 100)}\n")
        (sysfs / "pages_sharing").write_text(f"{int(now[0] * 1000)}\n")

    settled = ksm.wait_merged(0.02, 5.0, 30.0, sysfs, clock=lambda: now[0], sleep=sleep)
    assert not settled.settled and settled.seconds >= 30


def test_nothing_to_merge_settles_without_full_scans(tmp_path):
    """ksmd counts no full scan while no memory is mergeable (containers' nginx)."""
    sysfs = fake_sysfs(tmp_path / "ksm")
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds

    settled = ksm.wait_merged(0.02, 5.0, 60.0, sysfs, clock=lambda: now[0], sleep=sleep)
    assert settled.settled and settled.seconds < 10


def test_leases_in_other_journals_are_found_by_path(tmp_path):
    sysfs = fake_sysfs(tmp_path / "ksm")
    j = journal_of(tmp_path / "journal", 1)
    other = tmp_path / "journal" / "journal-2-1.json"
    other.write_text(json.dumps({"1": {"type": "ksm", "path": str(sysfs), "saved": HOST},
                                 "2": {"type": "ksm", "path": "/elsewhere", "saved": HOST}}))
    assert [e["path"] for e in ksm.other_leases(j, sysfs)] == [str(sysfs)]


def test_why_ksm_does_nothing_for_containers_depends_on_the_kernel():
    assert ksm.kernel_version("6.1.0-56-amd64") == (6, 1)
    assert ksm.kernel_version("weird") is None
    old = ksm.unmarked_note(["container", "vm"], "6.1.0-56-amd64")
    assert old is not None and "\n" not in old
    assert "MADV_MERGEABLE" in old and "no prctl(PR_SET_MEMORY_MERGE)" in old
    assert "6.1.0-56-amd64" in old
    new = ksm.unmarked_note(["container"], "6.8.0-1-amd64")
    assert new is not None and "has prctl(PR_SET_MEMORY_MERGE)" in new
    assert "vmtax does not set it" in new
    # Guests alone: QEMU marks their RAM, nothing to explain.
    assert ksm.unmarked_note(["vm"], "6.1.0") is None
    assert ksm.unmarked_note([], "6.1.0") is None
    # Read from the kinds' declarations: a runtime is no kind, a lost plugin says nothing.
    assert ksm.unmarked_note(["podman", "gone", ""], "6.1.0") is None
