"""The cached rootfs: built once however many builders want it at the same time."""

import threading
import time

from vmtax.guest import rootfs


def slow_populate(calls):
    def populate(root, files):
        calls.append(root)
        time.sleep(0.2)   # long enough for the other builders to arrive
        (root / "bin").mkdir()
        (root / "bin/busybox").write_text("")
    return populate


def test_parallel_builders_of_one_rootfs_take_turns(tmp_path, monkeypatch):
    """Four guests starting on a cold cache (density) once failed: one builder removed and
    replaced the rootfs another had just published (ENOTEMPTY on the rename)."""
    calls = []
    monkeypatch.setattr(rootfs, "populate", slow_populate(calls))
    results, errors = [], []

    def build():
        try:
            results.append(rootfs.build([], tmp_path))
        except BaseException as exc:
            errors.append(exc)
    threads = [threading.Thread(target=build) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(set(results)) == 1 and len(calls) == 1
    built = results[0]
    assert (built / ".complete").exists()
    assert {p.name for p in built.parent.iterdir()} == {built.name, f".{built.name}.lock"}


def test_an_unfinished_rootfs_left_by_a_crash_is_rebuilt(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(rootfs, "populate", slow_populate(calls))
    dest = rootfs.build([], tmp_path)
    (dest / ".complete").unlink()
    (dest / "half-written").write_text("")
    assert rootfs.build([], tmp_path) == dest and len(calls) == 2
    assert (dest / ".complete").exists() and not (dest / "half-written").exists()
