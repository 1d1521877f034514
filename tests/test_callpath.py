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
                                  ["composite", "golden-a"],
                                  ["export", "golden-a", "--format", "markdown"]])
def test_the_other_views_only_render(results, argv):
    crossings = callpath.trace([*argv, "--results", str(results)])
    assert crossings and callpath.renderer_calls(crossings) == []


# Every module of report/ renders: it may import analysis's and results' types and
# constants, but call none of their functions. Statically, so it also holds for what the
# golden database has none of (a density, boot or tune run's figures, profiles, fleets,
# a published site, a trend's page).
RENDERERS = sorted(p.stem for p in (ROOT / "src" / "vmtax" / "report").glob("*.py"))


def calls_into_analysis_or_results(source: str) -> list[tuple[int, str]]:
    """(line, dotted name) of each call of a function that source imports from
    vmtax.analysis or vmtax.results (a class, making a value, is no call into them)."""
    import ast
    import importlib
    import inspect

    tree = ast.parse(source)
    modules: dict[str, object] = {}      # local name -> an imported analysis/results module
    functions: dict[str, str] = {}       # local name -> "module.function"
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.module
                and node.module.startswith(("vmtax.analysis", "vmtax.results"))):
            continue
        for alias in node.names:
            local = alias.asname or alias.name
            try:
                modules[local] = importlib.import_module(f"{node.module}.{alias.name}")
                continue
            except ImportError:
                pass
            value = getattr(importlib.import_module(node.module), alias.name)
            if inspect.isfunction(value):
                functions[local] = f"{node.module}.{alias.name}"
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in functions:
            found.append((node.lineno, functions[f.id]))
        elif (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
              and f.value.id in modules
              and inspect.isfunction(getattr(modules[f.value.id], f.attr, None))):
            found.append((node.lineno, f"{f.value.id}.{f.attr}"))
    return found


def test_the_check_finds_a_call_into_analysis():
    source = ("from vmtax.analysis import summary as analysis\n"
              "from vmtax.analysis.model import analyse, RunModel\n"
              "x = analysis.is_secondary('cpu', 'events/s')\n"
              "y = analyse(run)\nz = RunModel\nw = analysis.NOISY_CV\n")
    assert calls_into_analysis_or_results(source) == [
        (3, "analysis.is_secondary"), (4, "vmtax.analysis.model.analyse")]


@pytest.mark.parametrize("name", RENDERERS)
def test_the_report_renderers_call_no_analysis(name):
    source = (ROOT / "src" / "vmtax" / "report" / f"{name}.py").read_text()
    assert calls_into_analysis_or_results(source) == []
