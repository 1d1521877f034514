"""`vmtax boot`'s input: --kernel picks the guests' kernel; mistakes are one line and come
before any run is made (live: tests/test_boot_live.py)."""

import pytest
from click.testing import CliRunner

from vmtax.cli import boot as cli_boot
from vmtax.cli.main import cli
from vmtax.core.errors import VmtaxError
from vmtax.results.store import Store


def boot(tmp_path, *args):
    return CliRunner().invoke(cli, ["boot", *args, "--results", str(tmp_path)])


@pytest.mark.parametrize("args,message", [
    (["--target", "container", "--kernel", "minimal"], "names no guest target ("),
    (["--target", "vm:tcg", "--kernel", "bogus"], "vm:tcg@bogus: kernel: expected"),
])
def test_kernel_mistakes_are_one_line_and_make_no_run(tmp_path, args, message):
    res = boot(tmp_path, *args, "--count", "1")
    assert isinstance(res.exception, VmtaxError)
    assert message in str(res.exception) and "\n" not in str(res.exception)
    assert not (tmp_path / "vmtax.sqlite").exists() or Store(tmp_path).list_runs() == []


def test_the_kernel_goes_to_every_vm_target_and_into_its_name(tmp_path, monkeypatch):
    checked = {}

    class Stop(Exception):
        pass

    def session(results):
        raise Stop()
    monkeypatch.setattr(cli_boot, "session", session)
    monkeypatch.setattr(cli_boot, "check_target", lambda spec: checked.update({spec.name: spec}))
    res = boot(tmp_path, "--target", "container,vm:tcg", "--kernel", "minimal")
    assert isinstance(res.exception, Stop)
    # Named as `vmtax run` names a target an option made: the kernel shows in every table.
    assert sorted(checked) == ["container", "vm:tcg@minimal"]
    assert checked["vm:tcg@minimal"].options["kernel"] == "minimal"
    assert "kernel" not in checked["container"].options
    # A path: its file's name.
    [name] = cli_boot.with_kernel(cli_boot.instance_specs(["vm:tcg"]),
                                  "/boot/vmlinuz-6.1.0-18-amd64", "vm:tcg")
    assert name == "vm:tcg@vmlinuz-6.1.0-18-amd64"
