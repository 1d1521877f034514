"""vmtax lab's host side against a fake lab (its QEMU is the process boundary): a session's
commands and their outputs, a lab that hangs (no heartbeat, no output) or whose kernel dies
noticed and its command carried on in a new lab, at most `restarts` times, the lab's runs
brought home after kill -9, and a resumed run's repetitions merged into the host's store."""

import json
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from vmtax.core.errors import VmtaxError
from vmtax.core.types import Metric
from vmtax.guest import lab
from vmtax.host.journal import Journal
from vmtax.results.store import Store
from vmtax.studies import lab as study
from vmtax.studies import lab_watch


def _leave(share: Path, outputs: list[tuple[bytes, bytes, int | None]]) -> None:
    """What a lab leaves in its share for commands that printed (stdout, stderr) and ended
    with an exit status (None: cut short), as vmtax.guest.lab writes it."""
    records, out, err = [], b"", b""
    for stdout, stderr, rc in outputs:
        ended = rc is not None
        records.append({"argv": [], "rc": rc,
                        "out": [len(out), len(out) + len(stdout) if ended else None],
                        "err": [len(err), len(err) + len(stderr) if ended else None]})
        out, err = out + stdout, err + stderr
    (share / lab.OUT_LOG).write_bytes(out)
    (share / lab.ERR_LOG).write_bytes(err)
    (share / lab.COMMANDS).write_text(json.dumps(records))
    if all(rc is not None for _, _, rc in outputs):
        (share / lab.RC).write_text(str(outputs[-1][2]))


@pytest.fixture
def fake_lab(tmp_path, monkeypatch):
    """study.run against labs that behave as each call of the list `labs` says: a function
    (share, commands) -> the Popen standing in for its QEMU. Returns run(commands, **config)
    -> (outcome, what was said, stdout echoed, stderr echoed, the commands of each lab)."""
    monkeypatch.setattr(study, "check", lambda config: lab.Machine())
    monkeypatch.setattr(study, "find_qemu", lambda qemu: "qemu")
    monkeypatch.setattr(study, "make_scratch_disk", lambda path, *args: path.write_bytes(b""))
    monkeypatch.setattr(lab, "lab_kernel", lambda cache, package=None: SimpleNamespace(
        modules_tree=tmp_path, version="6.1"))
    monkeypatch.setattr(lab, "lab_argv", lambda *args: ["qemu"])
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(lab_watch, "POLL", 0.02)
    labs: list = []
    jobs: list[list[list[str]]] = []

    def spawn(argv, log):
        share = log.parent
        commands = [c[3:] for c in json.loads((share / lab.JOB).read_text())["commands"]]
        jobs.append(commands)
        (share / lab.STARTED).write_text("1")
        return labs[len(jobs) - 1](share, commands)

    monkeypatch.setattr(lab, "spawn", spawn)

    def run(commands, **config):
        said: list[str] = []
        out: list[bytes] = []
        err: list[bytes] = []
        outcome = study.run(commands, study.LabConfig(**config), results=tmp_path / "results",
                            journal=Journal(tmp_path / "journal"),
                            echo=(out.append, err.append), say=said.append)
        assert not list(tmp_path.glob("vmtax-lab-*"))    # the share, undone
        return outcome, said, b"".join(out), b"".join(err), jobs

    run.labs = labs
    run.results = tmp_path / "results"
    return run


def _exited(share: Path) -> subprocess.Popen:
    return subprocess.Popen(["true"])


def _run_begun(share: Path) -> str:
    store = Store(share / lab.RESULTS)
    run_id = store.new_run({"runs": 1}, {"lab": lab.LAB_LABEL}, "0")
    store.close()
    return run_id


def test_a_sessions_commands_run_in_turn_each_with_its_own_output(fake_lab):
    def one_lab(share, commands):
        _leave(share, [(b"table\n", b"progress\n", 0), (b"", b"vmtax: error: no run\n", 2)])
        return _exited(share)
    fake_lab.labs.append(one_lab)
    outcome, said, out, err, jobs = fake_lab([["run", "--targets", "native"],
                                              ["exits", "last"], ["show", "last"]])
    assert jobs == [[["run", "--targets", "native"], ["exits", "last"], ["show", "last"]]]
    first, second, third = outcome.commands
    assert (first.exit_code, first.stdout, first.stderr) == (0, b"table\n", b"progress\n")
    # The failing command's own one-line error, on stderr; the session stops there.
    assert (second.exit_code, second.stdout, second.stderr) == (
        2, b"", b"vmtax: error: no run\n")
    assert third.exit_code is None and outcome.exit_code == 2
    assert out == b"table\n" and err == b"progress\nvmtax: error: no run\n"
    assert "lab: vmtax exits last" in said


def test_a_lab_whose_kernel_dies_mid_run_is_booted_again_to_resume_the_run(fake_lab):
    """Found in CI: the lab's kernel panicked 278 s into a run (a stack overflow in an
    interrupt, under TCG's emulated SVM). What it stored stays in the share; a new lab
    resumes that run, keeping its output flags, and the host imports it finished."""
    def dies(share, commands):
        _run_begun(share)
        (share / lab.CONSOLE_LOG).write_text(
            "BUG: TASK stack guard page was hit at 0000\n"
            "Kernel panic - not syncing: corrupted stack end detected inside scheduler\n")
        _leave(share, [(b"[1/2] done\n", b"", None)])
        return _exited(share)

    def resumes(share, commands):
        store = Store(share / lab.RESULTS)
        [run] = store.list_runs()
        store.finish_run(run["id"], "done")
        store.close()
        _leave(share, [(b"[2/2] done; the report\n", b"", 0)])
        return _exited(share)
    fake_lab.labs.extend([dies, resumes])
    outcome, said, out, _, jobs = fake_lab([["run", "plan.toml", "--json"], ["show", "last"]])
    [run_id] = outcome.run_ids
    assert out == b"[1/2] done\n[2/2] done; the report\n"   # once, whole
    assert jobs == [[["run", "plan.toml", "--json"], ["show", "last"]],
                    [["run", "--resume", run_id, "--json"], ["show", "last"]]]
    assert outcome.commands[0].stdout == out and outcome.commands[0].exit_code == 0
    assert outcome.exit_code == 0
    [fault] = outcome.faults
    assert fault == ("its kernel panicked: Kernel panic - not syncing: corrupted stack end "
                     "detected inside scheduler (after BUG: TASK stack guard page was hit "
                     "at 0000)")
    told = next(line for line in said if fault in line)
    assert f"booting a new lab for vmtax run --resume {run_id} --json" in told
    assert "lab-console-" in told
    assert Store(fake_lab.results).list_runs()[0]["status"] == "done"
    assert (fake_lab.results / told.split("all of it: ")[1].split(")")[0]).is_file()


def test_a_lab_that_stops_is_noticed_within_the_hang_timeout_and_its_command_goes_on(
        fake_lab):
    """Found in CI: a lab hung after boot, one vCPU spinning, its console silent from 45 s
    of uptime on, and vmtax waited for ever. No heartbeat and no output for hang_timeout
    seconds: its QEMU is killed, its console kept, and a new lab runs the command."""
    stopped: list[subprocess.Popen] = []

    def hangs(share, commands):
        (share / lab.HEARTBEAT).write_text("3.0")   # then never again
        _leave(share, [(b"preparing\n", b"", None)])
        stopped.append(subprocess.Popen(["sleep", "60"]))
        return stopped[-1]

    def goes_on(share, commands):
        _leave(share, [(b"booted\n", b"", 0)])
        return _exited(share)
    fake_lab.labs.extend([hangs, goes_on])
    started = time.monotonic()
    outcome, said, out, _, jobs = fake_lab([["boot", "--target", "vm:kvm"]], hang_timeout=1.0)
    assert time.monotonic() - started < 10
    assert stopped[0].poll() is not None      # killed, not left running
    assert jobs[1] == [["boot", "--target", "vm:kvm"]] and outcome.exit_code == 0
    assert outcome.faults[0].startswith("hung: no heartbeat and no output for 1 s")
    assert out == b"preparing\nbooted\n"


def test_a_beating_lab_is_not_a_hung_one_however_quiet(tmp_path, monkeypatch):
    """A command may print nothing for minutes (a guest booting under TCG): a lab whose
    heartbeat goes on is watched until its QEMU exits."""
    monkeypatch.setattr(lab_watch, "POLL", 0.02)
    (tmp_path / lab.STARTED).write_text("1")
    beating = subprocess.Popen(["sh", "-c", f"for i in 1 2 3 4 5 6; do echo $i > "
                                f"{tmp_path / lab.HEARTBEAT}; sleep 0.25; done"])
    ended = lab_watch.watch(beating, tmp_path, print, print, print, 0.6, [])
    assert ended.how == "exited" and ended.qemu_status == 0


def test_a_lab_hung_while_booting_is_caught_by_the_watchdog(tmp_path, monkeypatch):
    """Found in CI: a lab's QEMU busy for 15 minutes without a console line. Its vmtax
    never wrote STARTED: the watch gives up at BOOT_TIMEOUT, with QEMU still running."""
    monkeypatch.setattr(lab_watch, "BOOT_TIMEOUT", 0.3)
    hung = subprocess.Popen(["sleep", "30"])
    try:
        loads: list[float] = []
        assert lab_watch.watch(hung, tmp_path, print, print, print, 60, loads).how == \
            "boot hang"
        assert hung.poll() is None and len(loads) == 1   # the host's load, sampled
    finally:
        hung.kill()
        hung.wait()


def test_a_fault_again_after_the_last_restart_fails_in_one_line(fake_lab):
    def dies(share, commands):
        _run_begun(share)
        (share / lab.CONSOLE_LOG).write_text("Kernel panic - not syncing: Fatal exception\n")
        return _exited(share)
    fake_lab.labs.extend([dies, dies])
    with pytest.raises(VmtaxError) as failed:
        fake_lab([["run", "plan.toml"]], restarts=1)
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith("lab: its kernel panicked: Kernel panic - not syncing: Fatal "
                              "exception, 2 times; the last lab's console: ")
    assert Path(message.rsplit(": ", 1)[1]).read_text().startswith("Kernel panic")


def _rep(store: Store, run_id: str, idx: int) -> None:
    store.add_rep(run_id, target="vm:kvm", workload="cpu", params={}, phase="measure",
                  idx=idx, status="ok", argv=["sysbench"], started=1.0,
                  metrics=[Metric("events_per_sec", 100.0 + idx, "events/s", True)])


def test_a_run_resumed_in_a_new_lab_gets_what_the_hosts_copy_lacks(tmp_path):
    """kill -9 of `vmtax lab` brought 2 repetitions home; `vmtax lab run --resume` finished
    the run in a lab seeded with them. Brought home again, the host's copy gets the other
    two and the status; a second import changes nothing."""
    lab_store = Store(tmp_path / "lab")
    run_id = lab_store.new_run({"runs": 4}, {"lab": lab.LAB_LABEL}, "0")
    for idx in (0, 1):
        _rep(lab_store, run_id, idx)
    host = Store(tmp_path / "host")
    assert host.import_runs(tmp_path / "lab") == [run_id]
    assert host.load_run(run_id).status == "interrupted"
    seeded = Store(tmp_path / "seeded")
    assert seeded.import_runs(tmp_path / "host", only=run_id) == [run_id]
    seeded.reopen_run(run_id)
    for idx in (2, 3):
        _rep(seeded, run_id, idx)
    seeded.finish_run(run_id, "done")
    assert host.import_runs(tmp_path / "seeded") == [run_id]
    run = host.load_run(run_id)
    assert run.status == "done"
    assert sorted(r.idx for r in run.reps) == [0, 1, 2, 3]
    assert host.import_runs(tmp_path / "seeded") == []


def test_kill_9_of_the_lab_brings_its_runs_home_before_its_share_goes(tmp_path):
    """What a guardian (or the next vmtax) does with a killed `vmtax lab`'s journal: the
    lab's QEMU first, then the runs in the share into the host's store, then the share."""
    journal = Journal(tmp_path / "journal")
    share, _ = journal.make_dir(tmp_path, "vmtax-lab-")
    journal.add(type="lab-results", undo="vmtax.studies.lab:keep_results", share=str(share),
                results=str(tmp_path / "results"))
    qemu = subprocess.Popen(["sleep", "60"])
    journal.process(qemu.pid)
    run_id = _run_begun(share)
    store = Store(share / lab.RESULTS)
    _rep(store, run_id, 0)
    store.close()
    assert Journal.at(journal.path).undo_all() == []
    qemu.wait(timeout=5)
    assert not share.exists()
    [run] = Store(tmp_path / "results").list_runs()
    assert run["id"] == run_id and run["status"] == "interrupted"
