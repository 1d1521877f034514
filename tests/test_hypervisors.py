"""E3's plan (plans/hypervisors.toml), its per-class results in `vmtax run`/`show`, their
JSON and the HTML report, with suspicious wins explained; the plan's drop_caches."""

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import warnings_reporter
from test_macro_composite import store_dd_run

from vmtax.analysis.model import analyse
from vmtax.analysis import summary as analysis
from vmtax.cli import main as cli
from vmtax.cli import plan as cli_plan
from vmtax.core.errors import VmtaxError
from vmtax.core.types import JobResult
from vmtax.report import html as htmlreport
from vmtax.results.store import Store
from vmtax.studies import planfile
from vmtax.studies.plan import Plan, TargetSpec, WorkloadSpec
from vmtax.studies.runner import DROP_CACHES, Runner

PLAN = Path(__file__).parents[1] / "plans" / "hypervisors.toml"
E3 = {"bzip2", "compile", "memory", "dd", "rsync", "dbench", "oltp", "iperf3"}


def test_the_plan_is_e3s_method_over_every_class():
    plan = planfile.load(PLAN)
    assert (plan.runs, plan.warmup, plan.drop_caches, plan.baseline) == (3, 1, True, "native")
    assert [t.name for t in plan.targets] == ["native", "container", "vm"]
    vm = plan.targets[2].options
    assert (vm["vcpus"], vm["memory"], vm["accel"]) == (1, "2G", "auto")
    assert plan.targets[1].options["cpus"] == [1]
    assert {w.name for w in plan.workloads} == E3
    assert sorted(w.params["test"] for w in plan.workloads if w.name == "oltp") == \
        ["oltp_read_only", "oltp_read_write"]
    # every workload's headline metric is in a class: CPU, memory, disk I/O, network
    groups = {w.name: w.make(plan.time).metric_spec(w.make(plan.time).primary_metric()).group
              for w in plan.workloads}
    assert set(groups.values()) == {"CPU", "memory", "disk I/O", "network"}, groups
    quick = planfile.load(PLAN, quick=True)
    assert {w.name for w in quick.workloads} == E3 and (quick.runs, quick.warmup) == (3, 0)
    assert next(w for w in quick.workloads if w.name == "compile").params["objects"] == 10
    assert next(w for w in quick.workloads if w.name == "dd").params["size"] == "8M"


def test_drop_caches_is_a_checked_plan_setting_off_by_default():
    text = '[targets.native]\n[[workloads]]\nname = "cpu"\n'
    assert planfile.loads(text).drop_caches is False
    on = planfile.loads("drop_caches = true\n" + text)
    assert on.drop_caches is True and on.to_dict()["drop_caches"] is True
    assert Plan.from_dict(on.to_dict()).drop_caches is True
    shown = cli_plan.describe("p", on, matrix=True)      # what --dry-run prints
    assert "page caches: the host's and each target's dropped" in shown
    assert "page caches" not in cli_plan.describe("p", planfile.loads(text), matrix=True)
    with pytest.raises(VmtaxError) as bad:
        planfile.loads('drop_caches = "yes"\n' + text, "p.toml")
    assert str(bad.value).startswith("p.toml:1: drop_caches: expected") and \
        "\n" not in str(bad.value)


class _Guest:
    """A target whose jobs fail as a container's do when its /proc/sys is read-only."""
    kind, bare_host, remote, shares_host_page_cache = "container", False, False, True

    def __init__(self, exit_code):
        self.exit_code, self.jobs = exit_code, []

    def resume(self):
        pass

    def pause(self):
        pass

    def alive(self):
        return True

    def run(self, job):
        self.jobs.append(job.argv)
        return JobResult(self.exit_code, "", "sh: can't create /proc/sys/vm/drop_caches: "
                         "Read-only file system", 0.01)


def test_a_target_that_cannot_drop_its_cache_is_said_once(tmp_path):
    plan = Plan([TargetSpec("native", "native"), TargetSpec("c", "container")],
                [WorkloadSpec("cpu")], drop_caches=True)
    reporter = warnings_reporter()
    runner = Runner(plan, Store(tmp_path), reporter)
    runner.cannot_drop.add("host")      # the host's own drop is the live test's
    ro, ok = _Guest(1), _Guest(0)
    runner.targets = {"c": ro, "ok": ok}
    for _ in range(3):
        runner._drop_caches("c")
        runner._drop_caches("ok")
    assert ro.jobs == [DROP_CACHES.argv] and ok.jobs == [DROP_CACHES.argv] * 3
    assert reporter.lines == [
        "drop_caches: c cannot drop its page cache: exit status 1: sh: can't create "
        "/proc/sys/vm/drop_caches: Read-only file system; the run goes on (a local "
        "container's page cache is the host's)"]
    runner.plan.drop_caches = False
    runner._drop_caches("ok")
    assert len(ok.jobs) == 3


# -- per-class results and suspicious wins, from a stored run -----------------------------

def _cli(*args: str) -> str:
    """The real CLI in this process: its tables are as wide as a terminal of 80 columns."""
    result = CliRunner().invoke(cli.cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture
def dd_run(tmp_path):
    """A VM whose buffered dd beats native 3 to 1 while its oflag=direct dd does not."""
    results = tmp_path / "results"
    return results, store_dd_run(results, vm_direct=60.0)


def test_show_prints_the_index_recommendation_and_the_page_cache_explanation(dd_run):
    results, run_id = dd_run
    out = _cli("show", run_id, "--results", str(results))
    lines = out.splitlines()
    index = next(line for line in lines if line.split()[:1] == ["index"])
    # the class's index: the geometric mean of dd's two copies, about sqrt(3 * 0.6)
    assert index.split()[1:4] == ["disk", "I/O", "1"] and "[" in index, out
    assert re.match(r"1\.3\d$", index.split()[4]), out
    text = " ".join(out.split())
    # the VM wins beyond noise, on its buffered copy alone: recommended, with the doubt
    assert re.search(r"→ disk I/O: vm \(index 1\.3\d \[1\.\d+–1\.\d+\]\), a suspicious "
                     "win: see its likely cause", text), out
    assert "⚠ suspicious win: vm · dd throughput mode=buffered: host page cache: the " \
           "buffered copy beats native but the oflag=direct copy does not (×0.6" in text, out
    assert max(len(line) for line in lines) <= 80
    data = json.loads(_cli("show", run_id, "--results", str(results), "--json"))["composite"]
    assert data["baseline"] == "native"
    disk = data["classes"][0]
    assert disk["cls"] == "disk I/O" and disk["by_target"]["vm"]["value"] == \
        pytest.approx((3.0 * 0.6) ** 0.5, rel=0.02)
    assert disk["recommendation"].startswith("disk I/O: vm (index 1.3")
    assert len(data["explanations"]) == 1 and "host page cache" in data["explanations"][0]


def test_html_report_has_the_composite_table_and_explains_the_win_in_its_card(dd_run):
    results, run_id = dd_run
    run = Store(results, readonly=True).load_run(run_id)
    html = htmlreport.render_html([htmlreport.build(analyse(run))])
    card = re.search(r'<div class="card" data-class="disk I/O".*?</div>\s*</div>', html,
                     re.DOTALL)
    assert card, html
    assert 'data-recommendation="disk I/O">→ disk I/O: vm (index 1.3' in card[0]
    assert "a suspicious win: see its likely cause" in card[0]
    assert re.search(r'data-explained="disk I/O">.*host page cache: the buffered copy beats '
                     r'native but the oflag=direct copy does not', card[0])
    row = re.search(r'<tr data-class="disk I/O">.*?</tr>', html, re.DOTALL)
    assert row and 'data-target="vm"' in row[0] and re.search(r">1\.3\d+<", row[0]), html
    assert re.search(r'\[1\.\d+–1\.\d+\]', row[0]), row[0]
    # no other list repeats what the card says
    assert html.count("host page cache: the buffered copy") == 1
    summary = analysis.summarize_run(run)
    assert "faster than baseline" in summary.rows[0].cells["vm"].flags
