"""docs/plugins.md's three examples, installed as a third-party package (an entry point in
a dist-info on PYTHONPATH, as pip would leave it) and run as its readers would: the page
cannot drift from the contract."""

import json
import os
import re
import sys
from pathlib import Path

import pytest
from conftest import vmtax

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"
DD_STDERR = ("256+0 records in\n256+0 records out\n"
             "268435456 bytes (268 MB, 256 MiB) copied, 0.0512 s, 5.2 GB/s\n")


def examples() -> dict[str, str]:
    """File name -> source of each `<!-- plugin file: NAME -->` code block."""
    return dict(re.findall(r"<!-- plugin file: (\S+) -->\n```python\n(.*?)```",
                           GUIDE.read_text(), re.S))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A directory on PYTHONPATH holding the examples and their entry points."""
    site = tmp_path_factory.mktemp("site")
    for name, source in examples().items():
        (site / name).write_text(source)
    info = site / "vmtax_guide_examples-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vmtax-guide-examples\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text(
        "[vmtax.plugins]\n" + "".join(f"{Path(n).stem} = {Path(n).stem}\n" for n in examples()))
    return site


def _env(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site),
                                                        os.environ.get("PYTHONPATH")]))}


def test_the_guide_has_a_workload_a_collector_and_a_target():
    assert set(examples()) == {"memcopy.py", "loadavg.py", "niced.py"}


@pytest.mark.parametrize("group, name", [("workloads", "memcopy"), ("collectors", "loadavg"),
                                         ("targets", "niced")])
def test_vmtax_lists_each_example(site, group, name):
    done = vmtax("list", group, "--json", env=_env(site))
    assert done.returncode == 0, done.stderr
    listed = {p["name"]: p for p in json.loads(done.stdout)}
    assert name in listed
    assert listed[name]["description"]


def test_the_workload_parses_dd_on_stderr(site, monkeypatch):
    monkeypatch.syspath_prepend(str(site))
    memcopy = __import__("memcopy")
    workload = memcopy.MemCopy.make({"size": 256})
    assert workload.report_stream == "stderr"
    [metric] = workload.parse(DD_STDERR)
    assert (metric.name, metric.unit) == ("speed", "MB/s")
    assert metric.value == pytest.approx(268435456 / 0.0512 / 1e6)
    sys.modules.pop("memcopy")


def test_the_plan_form_checks(site, tmp_path):
    plan = re.search(r"## The plan form\n\n```toml\n(.*?)```", GUIDE.read_text(), re.S)[1]
    (tmp_path / "guide.toml").write_text(plan)
    done = vmtax("plan", str(tmp_path / "guide.toml"), "--dry-run", env=_env(site))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "memcopy" in done.stdout and "niced" in done.stdout


@pytest.mark.live
def test_the_examples_run(site, tmp_path):
    done = vmtax("run", "--targets", "native,niced", "--workloads", "memcopy",
                 "--collect", "loadavg", "--runs", "2", "--warmup", "0",
                 "--results", str(tmp_path), env=_env(site), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    shown = vmtax("show", "last", "--json", "--results", str(tmp_path), env=_env(site))
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert '"speed"' in text and '"load average"' in text and "niced" in text
