"""A new plugin needs no test edit: a throwaway target kind and collector, installed through
an entry point as docs/plugins.md's examples are, and the tests that list or check the
registered plugins (marked plugin_lists) rerun with them present. Their names sort first and
the target declares every fact a test might count, so a list written into a test breaks."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

TARGET = '''
"""a-throwaway: a target kind that only checks that plugins need no test edits."""
from typing import Any

from vmtax.core import plugin
from vmtax.core.target import Target
from vmtax.core.types import Job, JobResult


class ThrowawayOptions(plugin.Options):
    throwaway_level: int = plugin.option(1, "How thrown away", ge=0, cli=True)


class Throwaway(Target):
    name = "a-throwaway"
    description = "A target kind that runs nothing"
    Options = ThrowawayOptions
    shares_host_page_cache = ksm_mergeable = guest_clock = True
    small_options = {"throwaway_level": 0}

    def prepare(self) -> None:
        pass

    def run(self, job: Job) -> JobResult:
        return JobResult(0, "", "", 0.0)

    def cleanup(self) -> None:
        pass

    def fingerprint(self) -> dict[str, Any]:
        return {}
'''

COLLECTOR = '''
"""a-throwaway: a collector that only checks that plugins need no test edits."""
from vmtax.core.collector import Collector, Subject
from vmtax.core.types import Metric, MetricSpec


class ThrowawayCollector(Collector):
    name = "a-throwaway"
    description = "A collector that records nothing"
    metrics = (MetricSpec("nothing", "units", False, "Nothing at all"),)

    def start(self, subject: Subject) -> None:
        pass

    def stop(self) -> list[Metric]:
        return [self.metric("nothing", 0.0)]

    def abort(self) -> None:
        pass
'''

LISTING_TESTS = ["test_planfile.py", "test_session.py", "test_cli.py", "test_plan.py",
                 "test_collectors.py"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    (site / "throwaway_target.py").write_text(TARGET)
    (site / "throwaway_collector.py").write_text(COLLECTOR)
    info = site / "vmtax_throwaway-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vmtax-throwaway\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[vmtax.plugins]\n"
                                           "throwaway_target = throwaway_target\n"
                                           "throwaway_collector = throwaway_collector\n")
    return site


def _env(site: Path) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "VMTAX_UNIT_ONLY": "1"}


def test_the_throwaway_plugins_are_registered(site):
    code = ("from vmtax.core import plugin; "
            "print(plugin.get('target', 'a-throwaway').__module__, "
            "plugin.get('collector', 'a-throwaway').__module__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env(site), check=True)
    assert done.stdout.split() == ["throwaway_target", "throwaway_collector"]


def test_the_plugin_lists_in_tests_come_from_the_registry(site):
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-m", "plugin_lists", *(f"tests/{t}" for t in LISTING_TESTS)],
                          capture_output=True, text=True, env=_env(site), cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "deselected" in done.stdout


def test_a_new_kind_s_command_line_option_is_a_run_flag_with_no_cli_edit(site):
    """Issue 46.5: a target kind that marks an option cli=True gets its `vmtax run` flag,
    with its doc, default and the kinds that take it, from its declaration alone."""
    done = subprocess.run([sys.executable, "-m", "vmtax", "run", "--help"],
                          capture_output=True, text=True, env={**_env(site), "COLUMNS": "200"},
                          check=True)
    assert re.search(r"--throwaway-level \[LABEL=\]VALUE\s+How thrown away\. "
                     r"\[default: 1, for a-throwaway\]", done.stdout), done.stdout
