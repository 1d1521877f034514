"""The guardian undoes a run's journal the moment its owner dies, however it dies; what a
dead vmtax left is reported by the read commands and undone by `vmtax cleanup`."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import vmtax, wait_for

from vmtax.host import hugepages, journal, proc

# An owner like `vmtax run`: a journaled payload in a session of its own (as runc starts
# a container's), out of reach of PR_SET_PDEATHSIG and of the owner's process group.
OWNER = textwrap.dedent("""
    import subprocess, sys, time
    from pathlib import Path
    from vmtax.host import guardian
    from vmtax.host import journal
    j = journal.Journal()
    with guardian.guard(j.path):
        payload = subprocess.Popen(["sleep", "60"], start_new_session=True)
        j.process(payload.pid)
        Path(sys.argv[1]).mkdir()
        j.add(type="rmtree", path=sys.argv[1])
        print(payload.pid, flush=True)
        if sys.argv[2] == "wait":
            time.sleep(60)
        if sys.argv[2] == "stdin":     # ends when told, leaving its journal to the guardian
            sys.stdin.readline()
        else:
            j.undo_all()
    print("done", flush=True)
""")


def guardians(journal_dir: Path) -> list[int]:
    """Guardian processes of journals in journal_dir (this test's runtime directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vmtax.host.guardian" in cmdline and any(
                arg.startswith(str(journal_dir).encode()) for arg in cmdline):
            found.append(int(entry.name))
    return found


def start_owner(tmp_path, mode: str) -> tuple[subprocess.Popen, int]:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path / "made"), mode],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    return owner, int(owner.stdout.readline())


def gone(pid: int) -> bool:
    return not proc.running(pid, proc.process_start_time(pid))


@pytest.mark.parametrize("kill", ["owner", "owners_process_group"])
def test_a_killed_owners_journal_is_undone_at_once(tmp_path, kill):
    runtime = Path(os.environ["VMTAX_RUNTIME"])
    owner, payload = start_owner(tmp_path, "wait")
    watchers = guardians(runtime)
    assert len(watchers) == 1
    guardian = watchers[0]
    # Its own session: no terminal, and a kill of the owner's group does not reach it.
    assert os.getsid(guardian) == guardian != os.getsid(owner.pid)
    if kill == "owner":
        owner.kill()
    else:
        os.killpg(owner.pid, signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 5
    while not (gone(payload) and gone(guardian)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(payload) and gone(guardian)
    assert not (tmp_path / "made").exists()
    assert list(runtime.glob("journal-*")) == []


def test_after_a_normal_end_the_guardian_is_gone_and_undid_nothing_more(tmp_path):
    runtime = Path(os.environ["VMTAX_RUNTIME"])
    owner, payload = start_owner(tmp_path, "end")
    assert owner.stdout.readline() == "done\n"
    assert guardians(runtime) == []        # `guard` waited for it
    owner.wait(timeout=5)
    assert list(runtime.glob("journal-*")) == []


def test_a_journal_left_twice_is_undone_once(tmp_path):
    """A guardian and a starting vmtax may find the same dead journal at once: a lease
    given back twice would take pages that are not its own."""
    sysfs = tmp_path / "sys"
    nr = hugepages.pool_dir("2M", sysfs) / "nr_hugepages"
    nr.parent.mkdir(parents=True)
    nr.write_text("15\n")                                    # 5 were there before
    runtime = Path(os.environ["VMTAX_RUNTIME"])
    journal.Journal(runtime, pid=2**22 + 1, start=1).add(type="hugepages", path=str(nr),
                                                         added=10)
    with journal._undoing(runtime):
        undoers = [threading.Thread(target=journal.recover) for _ in range(2)]
        for undoer in undoers:
            undoer.start()
        time.sleep(0.2)
        assert nr.read_text() == "15\n"     # both wait for the lock
    for undoer in undoers:
        undoer.join()
    assert nr.read_text() == "5\n"


def dead_journal(tmp_path) -> Path:
    made = tmp_path / "left"
    made.mkdir()
    j = journal.Journal(Path(os.environ["VMTAX_RUNTIME"]), pid=2**22 + 1, start=1)
    j.add(type="rmtree", path=str(made))
    return made


def test_left_behind_names_dead_owners_only(tmp_path):
    runtime = Path(os.environ["VMTAX_RUNTIME"])
    assert journal.left_behind_warning() is None
    journal.Journal().add(type="rmtree", path=str(tmp_path / "mine"))   # alive: ours
    assert journal.left_behind_warning() is None
    dead_journal(tmp_path)
    assert journal.left_behind_warning() == (
        f"vmtax process {2**22 + 1} died leaving 1 directory in place; `vmtax cleanup` undoes "
        "them, as does the next `vmtax run`")
    assert [j.pid for j in journal.left_behind(runtime)] == [2**22 + 1]


def test_left_behind_creates_no_runtime_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("VMTAX_RUNTIME", str(tmp_path / "none"))
    assert journal.left_behind_warning() is None and not (tmp_path / "none").exists()


@pytest.mark.parametrize("args", [["runs"], ["show", "last"], ["doctor"],
                                  ["plan", "PLAN"]])
def test_read_commands_warn_about_what_a_dead_run_left(tmp_path, args):
    dead_journal(tmp_path)
    plan = tmp_path / "plan.toml"
    plan.write_text('[targets.native]\n[[workloads]]\nname = "cpu"\n')
    res = vmtax(*[str(plan) if a == "PLAN" else a for a in args],
                *(["--results", str(tmp_path / "r")] if args[0] in ("runs", "show") else []))
    warnings = [line for line in res.stderr.splitlines() if "warning" in line]
    assert warnings == [f"vmtax: warning: vmtax process {2**22 + 1} died leaving 1 directory "
                        "in place; `vmtax cleanup` undoes them, as does the next `vmtax run`"], \
        res.stderr


def test_cleanup_undoes_what_a_dead_run_left(tmp_path):
    made = dead_journal(tmp_path)
    res = vmtax("cleanup")
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"undid 1 host change(s) left by vmtax process {2**22 + 1}\n"
    assert not made.exists()
    res = vmtax("cleanup")
    assert (res.returncode, res.stdout) == (0, "nothing to clean up\n")
    assert "warning" not in vmtax("runs", "--results", str(tmp_path / "r")).stderr


def test_a_stopped_guardian_is_killed_and_its_journal_undone_by_vmtax(tmp_path):
    """A guardian stopped (SIGSTOP) would hang vmtax at its end: vmtax kills it, undoes the
    journal itself and says so in one line."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path / "made"), "stdin"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    payload = int(owner.stdout.readline())
    [guardian] = guardians(Path(os.environ["VMTAX_RUNTIME"]))
    os.kill(guardian, signal.SIGSTOP)
    started = time.monotonic()
    out, err = owner.communicate("end\n", timeout=30)
    assert time.monotonic() - started < 10 and out == "done\n"
    assert err.splitlines() == [
        f"vmtax: warning: the guardian of this run (pid {guardian}) was stopped: killed it; "
        f"undid 2 host change(s) left by vmtax process {owner.pid}"]
    assert gone(guardian) and wait_for(lambda: gone(payload), 5)
    assert not (tmp_path / "made").exists()


def test_what_a_killed_run_and_its_killed_guardian_left_is_named_and_cleaned_up(tmp_path):
    runtime = Path(os.environ["VMTAX_RUNTIME"])
    owner, payload = start_owner(tmp_path, "wait")
    [guardian] = guardians(runtime)
    os.kill(guardian, signal.SIGKILL)
    owner.kill()
    owner.wait()
    warning = (f"vmtax: warning: vmtax process {owner.pid} died leaving 1 directory, 1 process "
               "in place; `vmtax cleanup` undoes them, as does the next `vmtax run`")
    for args in (["list", "workloads"], ["runs", "--results", str(tmp_path / "r")]):
        assert warning in vmtax(*args).stderr.splitlines()
    checks = {c["name"]: c for c in json.loads(vmtax("doctor", "--json").stdout)["checks"]}
    assert not checks["undo journal"]["ok"] and f"process {owner.pid} died leaving" in \
        checks["undo journal"]["detail"]
    res = vmtax("cleanup")
    assert res.stdout == f"undid 2 host change(s) left by vmtax process {owner.pid}\n"
    assert wait_for(lambda: gone(payload), 5) and not (tmp_path / "made").exists()
    assert vmtax("doctor", "--json").returncode == 0


def test_a_plugin_s_own_kind_of_change_is_named_in_words(tmp_path):
    j = journal.Journal(Path(os.environ["VMTAX_RUNTIME"]), pid=2**22 + 1, start=1)
    for name in ("a", "b"):
        j.add(type="libvirt-domain", undo="vmtax.host.libvirt:destroy_domain", name=name)
    j.add(type="daemon", undo="vmtax.host.daemon:stop", name="libvirtd", pid=2**22 + 2)
    assert journal.left_behind_warning().startswith(
        f"vmtax process {2**22 + 1} died leaving 1 daemon, 2 libvirt domains in place")
