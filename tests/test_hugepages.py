"""Host huge-page reservation against a fake sysfs and procfs: exact counts, what the kernel
grants, giving back (normal, failure, crash), and the sizes guests and sysbench need."""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from vmtax.core.errors import VmtaxError
from vmtax.host import hugepages, journal
from vmtax.host.hugepages import Pool


class Kernel:
    """A fake sysfs pool that grants at most `limit` pages, as a fragmented host does."""

    def __init__(self, root: Path, size: str = "2M", value: int = 0, limit: int = 10**6):
        self.dir = hugepages.pool_dir(size, root)
        self.dir.mkdir(parents=True)
        self.nr = self.dir / "nr_hugepages"
        self.nr.write_text(f"{value}\n")
        self.limit = limit

    @property
    def value(self) -> int:
        return int(self.nr.read_text())

    @property
    def surplus(self) -> int:
        path = self.dir / "surplus_hugepages"
        return int(path.read_text()) if path.exists() else 0


class FakePool(Pool):
    def __init__(self, kernel: Kernel, j: journal.Journal, size: str = "2M", **kwargs):
        self.kernel = kernel
        self.mounts: list[Path] = []
        super().__init__(j, size, kernel.dir.parent, mount=self._mount, **kwargs)

    def _write(self, pages: int) -> None:
        # Surplus pages (in use, above the size set) stay counted until they are freed.
        super()._write(min(pages, self.kernel.limit) + self.kernel.surplus)

    def _mount(self, j, size):
        directory = Path(tempfile.mkdtemp(prefix="mnt-", dir=self.kernel.dir.parent))
        self.mounts.append(directory)
        return directory, [j.add(type="rmtree", path=str(directory))]


@pytest.fixture
def j(tmp_path):
    (tmp_path / "journal").mkdir()
    return journal.Journal(tmp_path / "journal")


@pytest.fixture
def kernel(tmp_path):
    return Kernel(tmp_path / "sys", value=0)


def test_reserve_journals_the_lease_first_then_raises_by_exactly_the_pages(kernel, j):
    pool = FakePool(kernel, j, compact=Path("/nonexistent"))
    seen = []
    original_write = pool._write

    def spy(pages):
        seen.append(dict(j.entries))
        original_write(pages)
    pool._write = spy
    res = pool.reserve(512)
    assert (res.requested, res.granted, kernel.value) == (512, 512, 512)
    # What this run adds was in the journal before the first write reached the kernel.
    assert {"type": "hugepages", "undo": "vmtax.host.hugepages:end_lease",
            "path": str(kernel.nr), "added": 512} in seen[0].values()
    assert res.mountpoint == pool.mounts[0] and res.mountpoint.is_dir()
    res.release()
    assert kernel.value == 0
    assert j.entries == {} and not pool.mounts[0].exists()
    res.release()   # idempotent
    assert kernel.value == 0 and pool.held == 0


def test_guests_share_a_pool_and_one_mount(kernel, j):
    pool = FakePool(kernel, j)
    a, b = pool.reserve(256), pool.reserve(128)
    assert kernel.value == 384 and len(pool.mounts) == 1
    assert b.mountpoint == a.mountpoint
    a.release()
    assert kernel.value == 128 and pool.mounts[0].exists()
    b.release()
    assert kernel.value == 0 and not pool.mounts[0].exists() and j.entries == {}


def test_pages_reserved_by_others_are_kept(tmp_path, j):
    kernel = Kernel(tmp_path / "sys", value=10)
    pool = FakePool(kernel, j)
    res = pool.reserve(5)
    assert kernel.value == 15
    kernel.nr.write_text("22\n")     # someone else reserves 7 more meanwhile
    res.release()
    assert kernel.value == 17        # only our 5 go back


def test_fewer_granted_than_asked_fails_and_gives_back(tmp_path, j):
    kernel = Kernel(tmp_path / "sys", value=4, limit=300)
    compact = tmp_path / "compact_memory"
    compact.write_text("")
    pool = FakePool(kernel, j, compact=compact)
    with pytest.raises(VmtaxError) as err:
        pool.reserve(512)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("the kernel granted only 296 of the 512 2 MiB huge pages asked "
                              f"for ({kernel.nr})")
    assert compact.read_text() == "1\n"     # compaction was tried before giving up
    assert kernel.value == 4 and pool.held == 0
    assert j.entries == {} and not pool.mounts[0].exists()


def test_compaction_can_make_up_the_difference(tmp_path, j):
    kernel = Kernel(tmp_path / "sys", value=0, limit=100)
    compact = tmp_path / "compact_memory"
    compact.write_text("")
    pool = FakePool(kernel, j, compact=compact)
    original = pool._write

    def write(pages):
        if compact.read_text():   # after compaction the kernel finds room
            kernel.limit = 10**6
        original(pages)
    pool._write = write
    res = pool.reserve(150)
    assert (res.granted, kernel.value) == (150, 150)
    res.release()
    assert kernel.value == 0


def test_a_failure_of_a_second_guest_keeps_the_first(tmp_path, j):
    kernel = Kernel(tmp_path / "sys", value=0, limit=300)
    pool = FakePool(kernel, j, compact=Path("/nonexistent"))
    first = pool.reserve(200)
    with pytest.raises(VmtaxError, match="granted only 100 of the 200"):
        pool.reserve(200)
    assert kernel.value == 200 and pool.held == 200 and pool.mounts[0].exists()
    first.release()
    assert kernel.value == 0 and j.entries == {}


def test_after_a_crash_the_journal_puts_the_value_back(tmp_path):
    (tmp_path / "journal").mkdir()
    kernel = Kernel(tmp_path / "sys", value=3)
    # The journal of a vmtax process that died (no such pid and start time runs).
    dead = journal.Journal(tmp_path / "journal", pid=2**22 + 1, start=1)
    pool = FakePool(kernel, dead)
    pool.reserve(64)
    assert kernel.value == 67
    lines = journal.recover(tmp_path / "journal")
    assert len(lines) == 1 and "undid 2 host change(s)" in lines[0]
    assert kernel.value == 3 and not pool.mounts[0].exists()


def test_concurrent_runs_a_finished_and_b_killed_give_the_pool_back(tmp_path):
    """Issue 16's reproduction: A reserves, B reserves on top, A finishes, B is killed
    and recovered: the pool is what it was before A, not what B found."""
    (tmp_path / "journal").mkdir()
    kernel = Kernel(tmp_path / "sys", value=3)
    a = journal.Journal(tmp_path / "journal", pid=2**22 + 1, start=1)
    b = journal.Journal(tmp_path / "journal", pid=2**22 + 2, start=1)
    pool_a, pool_b = FakePool(kernel, a), FakePool(kernel, b)
    reservation = pool_a.reserve(256)
    pool_b.reserve(256)
    assert kernel.value == 515
    reservation.release()
    assert kernel.value == 259 and a.entries == {}
    assert journal.recover(tmp_path / "journal") == [
        f"undid 2 host change(s) left by vmtax process {2**22 + 2}"]
    assert kernel.value == 3


def test_a_dead_runs_lease_never_takes_what_other_leases_hold(tmp_path):
    (tmp_path / "journal").mkdir()
    kernel = Kernel(tmp_path / "sys", value=0)
    live = journal.Journal(tmp_path / "journal")
    dead = journal.Journal(tmp_path / "journal", pid=2**22 + 1, start=1)
    FakePool(kernel, live).reserve(100)
    FakePool(kernel, dead).reserve(50)
    kernel.nr.write_text("120\n")     # someone lowered the pool meanwhile
    journal.recover(tmp_path / "journal")
    assert kernel.value == 100          # the live run keeps its 100
    kernel.nr.write_text("30\n")
    journal.Journal(tmp_path / "journal", pid=2**22 + 3, start=1).add(
        type="hugepages", path=str(kernel.nr), added=10)
    journal.recover(tmp_path / "journal")
    assert kernel.value == 30           # below what the live run holds: left, not raised


def test_surplus_pages_of_a_dying_guest_do_not_count(tmp_path, j):
    """Lowered while a killed QEMU still holds pages, the kernel counts them as surplus
    until they are freed: they are not part of the pool the next change starts from."""
    kernel = Kernel(tmp_path / "sys", value=256)
    (kernel.dir / "surplus_hugepages").write_text("256\n")
    res = FakePool(kernel, j).reserve(64)
    assert kernel.value == 256 + 64
    res.release()
    assert kernel.value == 256


def test_pool_changes_wait_for_the_pools_lock(kernel, j):
    """A change waits while another process holds the pool's lock (flock on nr_hugepages)."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time; f = open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('locked', flush=True); time.sleep(0.5)"), str(kernel.nr)],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "locked\n"
    started = time.monotonic()
    FakePool(kernel, j).reserve(1)
    assert time.monotonic() - started > 0.3
    holder.wait()


def test_a_missing_page_size_is_one_line(tmp_path, j):
    Kernel(tmp_path / "sys")    # 2 MiB only
    pool = Pool(j, "1G", tmp_path / "sys")
    with pytest.raises(VmtaxError, match=r"^this host has no 1 GiB huge pages \(.*hugepages-"
                                         r"1048576kB is missing\)$"):
        pool.reserve(1)
    assert j.entries == {}


def test_the_shared_pool_is_one_per_journal_and_size(j, tmp_path):
    other = journal.Journal(tmp_path / "journal", pid=2**22 + 2, start=1)
    assert hugepages.pool(j, "2M") is hugepages.pool(j, "2M")
    assert hugepages.pool(j, "2M") is not hugepages.pool(j, "1G")
    assert hugepages.pool(j, "2M") is not hugepages.pool(other, "2M")


def test_mount_failure_leaves_nothing(j, monkeypatch):
    from vmtax.host import proc
    made = []

    def fake_run(argv, **kwargs):
        made.append(Path(argv[-1]))
        assert argv[:5] == ["mount", "-t", "hugetlbfs", "-o", "pagesize=2M,mode=0700"]
        return proc.Completed(32, "", "mount: permission denied\n", 0.0, False)
    monkeypatch.setattr(hugepages.proc, "run", fake_run)
    with pytest.raises(VmtaxError, match=r"^mounting hugetlbfs \(2 MiB pages\) on .* failed: "
                                         r"mount: permission denied$"):
        hugepages.mount_hugetlbfs(j, "2M")
    assert not made[0].exists() and j.entries == {}


# -- what the host can give --------------------------------------------------------------

def meminfo(tmp_path, available_kb: int) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       25000000 kB\nMemAvailable:   {available_kb} kB\n"
                    "HugePages_Total:       0\nHugepagesize:       2048 kB\n")
    return path


def test_capacity(tmp_path):
    kernel = Kernel(tmp_path / "sys")
    info = meminfo(tmp_path, 4 << 20)    # 4 GiB available
    assert hugepages.capacity_problem({"2M": 1536}, kernel.dir.parent, info) is None
    assert hugepages.capacity_problem({"2M": 1537}, kernel.dir.parent, info) == (
        "1537 2 MiB huge pages (3.0 GiB) do not fit in the 4.0 GiB this host has available "
        "while keeping 1.0 GiB for itself")
    assert hugepages.capacity_problem({"1G": 1}, kernel.dir.parent, info) == (
        f"this host has no 1 GiB huge pages ({tmp_path}/sys/hugepages-1048576kB is missing)")


def test_capacity_needs_write_access(tmp_path, monkeypatch):
    kernel = Kernel(tmp_path / "sys")
    monkeypatch.setattr(hugepages.os, "access", lambda path, mode: False)
    assert hugepages.capacity_problem({"2M": 1}, kernel.dir.parent,
                                      meminfo(tmp_path, 4 << 20)) == (
        f"reserving huge pages needs root (write access to {kernel.nr})")


def test_meminfo_of_this_host():
    info = hugepages.meminfo()
    assert info["MemAvailable"] > 0 and "HugePages_Total" in info


def test_pages_needed():
    assert hugepages.pages_needed(1 << 30, "2M") == 512
    assert hugepages.pages_needed(4 << 30, "1G") == 4
    with pytest.raises(VmtaxError, match=r"^guest memory of 1.5 GiB is not a whole number "
                                         r"of 1 GiB huge pages$"):
        hugepages.pages_needed(3 << 29, "1G")


def test_no_pool_is_left_open(kernel, j):
    """Every path out of reserve leaves held and the journal consistent."""
    pool = FakePool(kernel, j)
    res = pool.reserve(1)
    assert pool.held == 1 and len(j.entries) == 2
    res.release()
    assert pool.held == 0 and j.entries == {} and os.listdir(j.dir) == []
