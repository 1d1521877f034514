"""The views of stored runs only render what analysis computed (issue #39): traced with
scripts/callpath.py on the golden database, no renderer (report) calls into analysis or
results, and `vmtax report A B` analyses each run once and compares them once.

import-linter cannot say this: report imports analysis's and results' types (RunModel,
Row, DensityPoint) by design; what it must not do is call them to compute again."""

import importlib.util
import shutil
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
_spec = importlib.util.spec_from_file_location("callpath", ROOT / "scripts" / "callpath.py")
callpath = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(callpath)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    directory = tmp_path_factory.mktemp("results")
    shutil.copy(ROOT / "tests" / "fixtures" / "golden" / "golden.sqlite",
                directory / "vmtax.sqlite")
    return directory


def test_the_html_report_analyses_each_run_once_then_only_renders(results, tmp_path):
    crossings = callpath.trace(["report", "golden-a", "golden-b", "--html",
                                str(tmp_path / "r.html"), "--results", str(results)])
    assert (tmp_path / "r.html").stat().st_size > 0
    assert callpath.renderer_calls(crossings) == []
    into_analysis = Counter(callee for _, callee in crossings
                            if callee.startswith("vmtax.analysis."))
    assert into_analysis == {"vmtax.analysis.model:analyse": 2,
                             "vmtax.analysis.model:compare": 1}


@pytest.mark.parametrize("argv", [["show", "golden-a"], ["show", "golden-a", "--all"],
                                  ["show", "golden-a", "--json"],
                                  ["compare", "golden-a", "golden-b"],
                                  ["export", "golden-a", "--format", "markdown"]])
def test_the_other_views_only_render(results, argv):
    crossings = callpath.trace([*argv, "--results", str(results)])
    assert crossings and callpath.renderer_calls(crossings) == []
