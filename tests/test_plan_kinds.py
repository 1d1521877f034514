"""A plan given to the wrong command gets one line naming the right one."""

from pathlib import Path

import pytest

from vmtax.cli import density as cli_density
from vmtax.core.errors import VmtaxError
from vmtax.studies import plan_toml, planfile

PLANS = Path(__file__).resolve().parent.parent / "plans"


def test_density_plan_given_to_run():
    with pytest.raises(planfile.PlanError) as err:
        planfile.load(PLANS / "density.toml")
    message, = str(err.value).splitlines()
    assert "a density plan" in message and "`vmtax density " in message


def test_run_plan_given_to_density():
    with pytest.raises(VmtaxError, match=r"run it with `vmtax run .*classic.toml`"):
        cli_density.load_plan(str(PLANS / "classic.toml"))


def test_run_plan_without_workloads_still_says_so(tmp_path):
    plan = tmp_path / "p.toml"
    plan.write_text("runs = 3\n[targets.native]\n")
    with pytest.raises(planfile.PlanError, match="at least one \\[\\[workloads\\]\\] table"):
        planfile.load(plan)


def test_density_plan_file_checks_are_planfile_checks(tmp_path):
    with pytest.raises(VmtaxError, match="not a regular file"):
        cli_density.load_plan("/dev/null")
    big = tmp_path / "big.toml"
    big.write_text("#" * (plan_toml.MAX_PLAN_BYTES + 1))
    with pytest.raises(VmtaxError, match="cannot read the plan file \\(larger than 1 MiB"):
        cli_density.load_plan(str(big))
