"""The house's rules that import-linter cannot see (its contracts are in pyproject.toml and
run by `make lint`): outside the plugin packages no module names a particular plugin, and
no hook is found by getattr; every part says what it holds and what it may import."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from vmtax.core import plugin

SRC = Path(__file__).resolve().parents[1] / "src" / "vmtax"
PLUGIN_PACKAGES = {"workloads", "targets", "collectors"}
PARTS = sorted(p.name for p in SRC.iterdir() if (p / "__init__.py").exists())
# getattr with a constant name and a default is how an undeclared hook is found; these
# attributes are not vmtax's: a type's name, pydantic's constraint metadata.
NOT_HOOKS = {"__name__", "min_length"}
# Plugin names that are also ordinary words of another meaning in these modules.
OTHER_MEANING = {
    ("analysis/summary.py", "memory"): "a class of performance (MetricSpec.group)",
    ("studies/density.py", "memory"): "why a density step stopped: the host's memory",
    ("helpers/perf_kvm.py", "exits"): "the name of perf kvm stat's metric",
    ("helpers/serving_tools.py", "serving"): "the serving workload's own tools, named for it",
    ("cli/main.py", "exits"): "the name of the `vmtax exits` command",
    ("cli/main.py", "profile"): "the name of the `vmtax profile` command",
    ("cli/report.py", "exits"): "the `vmtax exits` command, in a hint (core.hints)",
    ("results/store.py", "exits"): "the `vmtax exits` command, in a hint (core.hints)",
    ("helpers/runtime_cgroup.py", "cpu"): "the name of a cgroup controller",
}


def _core_modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py")
                  if p.relative_to(SRC).parts[0] not in PLUGIN_PACKAGES)


def plugin_names() -> set[str]:
    return {name for group in plugin.registry().values() for name in group}


def _strings(node: ast.AST) -> list[str]:
    """The string constants of a constant or of a literal tuple, list or set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for element in node.elts for s in _strings(element)]
    return []


def naming(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, plugin name) where code decides by a plugin's name: compared with one
    (`kind == "vm"`, `x in ("container", "podman")`), or kept as a constant of a module or
    class (`SERVING = "serving"`, `UNMARKED = ("container", ...)`, `{"vm": {...}}` keys), or
    passed as a literal to a call (`target_specs(["container"])`)."""
    found = []
    for node in ast.walk(tree):
        candidates: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            candidates = [node.left, *node.comparators]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            value = node.value
            candidates = [value, *(value.keys if isinstance(value, ast.Dict) else [])]
        elif isinstance(node, ast.Call):
            candidates = [*node.args, *(k.value for k in node.keywords)]
        for candidate in candidates:
            if candidate is None:
                continue
            found.extend((node.lineno, s) for s in _strings(candidate) if s in names)
    return sorted(found)


def hooks_by_getattr(tree: ast.AST) -> list[tuple[int, str]]:
    return [(node.lineno, node.args[1].value) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "getattr" and len(node.args) == 3
            and isinstance(node.args[1], ast.Constant) and node.args[1].value not in NOT_HOOKS]


def test_the_checks_find_what_they_look_for():
    tree = ast.parse('KINDS = ("container", "podman")\n'
                     'if kind == "vm": pass\n'
                     'specs(["container"])\n'
                     'SMALL = {"vm": {"memory": "256M"}}\n'
                     'hook = getattr(cls, "cell_flags", None)\n'
                     'doc = "a vm or a container"\n')
    assert naming(tree, {"vm", "container", "podman"}) == [
        (1, "container"), (1, "podman"), (2, "vm"), (3, "container"), (4, "vm")]
    assert hooks_by_getattr(tree) == [(5, "cell_flags")]


def test_no_module_outside_the_plugin_packages_names_a_plugin():
    names = plugin_names()
    assert {"vm", "container", "native", "dd", "serving", "runsc"} <= names
    found = [f"{path.relative_to(SRC)}:{line}: {name!r}" for path in _core_modules()
             for line, name in naming(ast.parse(path.read_text()), names)
             if (str(path.relative_to(SRC)), name) not in OTHER_MEANING]
    assert not found, "plugin names in core code:\n" + "\n".join(found)


def test_no_hook_is_found_by_getattr():
    found = [f"{path.relative_to(SRC)}:{line}: getattr(…, {attr!r}, …)"
             for path in _core_modules()
             for line, attr in hooks_by_getattr(ast.parse(path.read_text()))]
    assert not found, "declare these hooks in the contract:\n" + "\n".join(found)


def test_no_module_outside_the_plugin_packages_imports_a_plugin_module():
    found = []
    for path in _core_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(SRC)}:{node.lineno}: {m}" for m in modules
                      if m.split(".")[:2] in ([["vmtax", p] for p in PLUGIN_PACKAGES])]
    assert not found, "\n".join(found)


# What draws a table or a figure: vmtax.report's (the CLI parses, calls and renders).
DRAWING = ("rich.table", "matplotlib")


def test_no_cli_module_draws_a_table_or_a_figure():
    found = []
    for path in sorted((SRC / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"cli/{path.name}:{node.lineno}: {m}" for m in modules
                      if m.startswith(DRAWING)]
    assert not found, "draw these in vmtax.report:\n" + "\n".join(found)


@pytest.mark.parametrize("part", PARTS)
def test_every_part_says_what_it_holds_and_may_import(part):
    doc = ast.get_docstring(ast.parse((SRC / part / "__init__.py").read_text()))
    assert doc and "May import" in doc, f"vmtax.{part}: its __init__ docstring"


def test_the_top_level_shows_the_parts():
    modules = sorted(p.name for p in SRC.glob("*.py"))
    assert modules == ["__init__.py", "__main__.py"]
    assert len(PARTS) <= 12


def test_import_contracts_hold():
    """The layers, independence and acyclicity contracts of pyproject.toml."""
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint), "--no-cache"], cwd=SRC.parents[1], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
