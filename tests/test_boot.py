"""`vmtax boot`'s input: --kernel picks the guests' kernel; mistakes are one line and come
before any run is made (live: tests/test_boot_live.py)."""

import pytest
from click.testing import CliRunner

from vmtax import cli_boot
from vmtax.cli import cli
from vmtax.errors import VmtaxError
from vmtax.store import Store


def boot(tmp_path, *args):
    return CliRunner().invoke(cli, ["boot", *args, "--results", str(tmp_path)])


@pytest.mark.parametrize("args,message", [
    (["--target", "container", "--kernel", "minimal"], "names no vm target"),
    (["--target", "vm:tcg", "--kernel", "bogus"], "vm:tcg: kernel: expected"),
])
def test_kernel_mistakes_are_one_line_and_make_no_run(tmp_path, args, message):
    res = boot(tmp_path, *args, "--count", "1")
    assert isinstance(res.exception, VmtaxError)
    assert message in str(res.exception) and "\n" not in str(res.exception)
    assert not (tmp_path / "vmtax.sqlite").exists() or Store(tmp_path).list_runs() == []


def test_the_kernel_goes_to_every_vm_target(tmp_path, monkeypatch):
    seen = {}

    class Stop(Exception):
        pass

    def session(results):
        raise Stop()
    monkeypatch.setattr(cli_boot, "session", session)
    original = cli_boot.target_specs

    def specs(names):
        seen["specs"] = original(names)
        return seen["specs"]
    monkeypatch.setattr(cli_boot, "target_specs", specs)
    res = boot(tmp_path, "--target", "container,vm:tcg", "--kernel", "minimal")
    assert isinstance(res.exception, Stop)
    assert seen["specs"]["vm:tcg"]["kernel"] == "minimal"
    assert "kernel" not in seen["specs"]["container"]
