"""show, compare, composite, report --html and export print the same numbers in the same
layout on a stored run as they did before the package was laid out in parts (the house
issue): outputs kept in tests/fixtures/golden/outputs from the fixture database."""

import importlib.util
import shutil
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "fixtures" / "golden"
_spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
make_golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_golden)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    directory = tmp_path_factory.mktemp("results")
    shutil.copy(GOLDEN / "golden.sqlite", directory / "vmtax.sqlite")
    return directory


@pytest.mark.parametrize("name", sorted(make_golden.COMMANDS))
def test_output_unchanged(name, results, tmp_path):
    expected = (GOLDEN / "outputs" / f"{name}.txt").read_text()
    got = make_golden.run_command(name, results, tmp_path)
    assert got == expected, f"`vmtax {' '.join(make_golden.COMMANDS[name])}` changed"
