"""Every command vmtax prints for the user works as pasted (issue 36, item 6): it carries
--results DIR when the results directory is not the default, quoted as a shell needs it."""

import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import start_vmtax, vmtax

from vmtax.core import hints
from vmtax.core.errors import VmtaxError
from vmtax.results.store import Store

GOLDEN = Path(__file__).parent / "fixtures" / "golden" / "golden.sqlite"


def pasted(line: str, cwd: Path) -> subprocess.CompletedProcess:
    """line run by a shell, as a user pasting it would, with this venv's vmtax on PATH."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "COLUMNS": "100"}
    env.pop("VMTAX_RESULTS", None)
    return subprocess.run(["sh", "-c", line], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_hint_names_the_results_directory_unless_it_is_the_default(monkeypatch):
    monkeypatch.delenv("VMTAX_RESULTS", raising=False)
    assert hints.command("show", "last", "--all", results="results") == "vmtax show last --all"
    assert hints.command("show", "last", results="./results/") == "vmtax show last"
    assert (hints.command("run", "--resume", "r1", results="my results")
            == "vmtax run --resume r1 --results 'my results'")
    assert (hints.command("trend", "it's", results="/a;b")
            == "vmtax trend 'it'\"'\"'s' --results '/a;b'")
    monkeypatch.setenv("VMTAX_RESULTS", "/srv/r")
    assert hints.command("runs", results="/srv/r") == "vmtax runs"
    assert hints.command("runs", results="results") == "vmtax runs --results results"


def golden_copy(tmp_path: Path) -> Path:
    results = tmp_path / "my [results]; x"
    results.mkdir()
    shutil.copy(GOLDEN, results / "vmtax.sqlite")
    return results


def test_the_show_all_hint_works_when_pasted(tmp_path):
    results = golden_copy(tmp_path)
    shown = vmtax("show", "golden-a", "--results", str(results), env={"COLUMNS": "80"},
                  check=True).stdout
    hint = re.search(r"more metric rows: (vmtax .*)$", shown, re.MULTILINE).group(1)
    assert shlex.split(hint)[-2:] == ["--results", str(results)]
    got = pasted(hint, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert "more metric rows" not in got.stdout and len(got.stdout) > len(shown)


def test_an_unknown_run_points_to_the_listing_of_its_own_store(tmp_path):
    results = golden_copy(tmp_path)
    with pytest.raises(VmtaxError) as caught:
        Store(results, readonly=True).load_run("nope")
    hint = re.search(r"`(vmtax [^`]*)` lists them", str(caught.value)).group(1)
    got = pasted(hint, cwd=tmp_path)
    assert got.returncode == 0 and "golden-a" in got.stdout, got.stderr


def test_an_empty_store_says_how_to_start_a_run_there(tmp_path):
    results = tmp_path / "empty one"
    Store(results).db.close()
    said = vmtax("runs", "--results", str(results), check=True).stdout
    assert f"start one with `vmtax run --results '{results}'`" in said


@pytest.mark.live
def test_the_resume_hint_after_ctrl_c_works_when_pasted(tmp_path):
    results = tmp_path / "my results"
    proc = start_vmtax("run", "--targets", "native", "--workloads", "cpu", "--runs", "20",
                       "--warmup", "0", "--time", "1", "--results", str(results))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            db = sqlite3.connect(results / "vmtax.sqlite")
            reps, = db.execute("SELECT count(*) FROM reps").fetchone()
            db.close()
            if reps >= 2:
                break
        except sqlite3.OperationalError:
            pass
        time.sleep(0.2)
    proc.send_signal(2)
    _, err = proc.communicate(timeout=60)
    found = re.search(r"continue it with: (vmtax .*)\)$", err, re.MULTILINE)
    assert found, err
    hint = found.group(1)
    assert shlex.split(hint)[-2:] == ["--results", str(results)]
    got = pasted(hint, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    db = sqlite3.connect(results / "vmtax.sqlite")
    assert db.execute("SELECT status, count(*) FROM runs").fetchone() == ("done", 1)
    assert not (tmp_path / "results").exists()   # the default store was never touched
