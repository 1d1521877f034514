"""drop_caches for real: a run with it leaves none of a file's pages in the host's page
cache (in a TCG guest: test_macro_live's guest runs with it too)."""

import shutil
import subprocess

import pytest
from conftest import vmtax

pytestmark = pytest.mark.live


def _resident_pages(path) -> int:
    out = subprocess.run(["fincore", "--noheadings", "--raw", "--output", "PAGES", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def test_drop_caches_empties_the_hosts_page_cache_between_repetitions(tmp_path):
    if shutil.which("fincore") is None:
        pytest.skip("not installed: util-linux's fincore")
    cached = tmp_path / "cached.bin"
    cached.write_bytes(bytes(range(256)) * 4096 * 4)     # 4 MiB
    cached.read_bytes()
    assert _resident_pages(cached) > 0
    plan = tmp_path / "drop.toml"
    plan.write_text('runs = 1\nwarmup = 0\ndrop_caches = true\n[targets.native]\n'
                    '[[workloads]]\nname = "dd"\nparams = { size = "1M" }\n')
    run = vmtax("run", str(plan), "--results", str(tmp_path / "results"), "--json",
                timeout=300)
    assert run.returncode == 0, run.stderr
    assert "drop_caches" not in run.stderr
    assert _resident_pages(cached) == 0
    assert '"drop_caches": true' in run.stdout       # recorded in the run's plan
