"""The torture script's own parts, and what it found (issue #16)."""

import random
import sys
from pathlib import Path

import pytest

from vmtax.core import plugin
from vmtax.core.errors import ParseError
from vmtax.core.types import MetricSpec
from vmtax.core.workload import Workload
from vmtax.studies import planfile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import torture  # noqa: E402


def test_every_registered_parser_is_attacked(monkeypatch):
    class Registered(Workload):
        name = "registered-test"
        metrics = (MetricSpec("value", "u", True, primary=True),)
        seen: list[str] = []

        def run_job(self):
            raise AssertionError("never run")

        def parse(self, stdout):
            Registered.seen.append(stdout)
            raise ParseError("no")

    monkeypatch.setitem(plugin.registry()["workload"], Registered.name, Registered)
    env = torture.Env.__new__(torture.Env)
    env.rng = random.Random(1)
    outcome = torture.Outcome("parsers")
    torture.parser_attack(env, outcome, 20)
    assert len(Registered.seen) == 20
    assert not outcome.problems


def test_a_parser_returning_a_metric_outside_its_manifest_is_a_problem(monkeypatch):
    class Liar(Workload):
        name = "liar-test"
        metrics = (MetricSpec("value", "u", True, primary=True),)

        def run_job(self):
            raise AssertionError("never run")

        def parse(self, stdout):
            from vmtax.core.types import Metric
            return [Metric("not in the manifest", 1.0, "u", True)]

    monkeypatch.setattr(torture, "seeds_for", lambda cls: ["x"])
    monkeypatch.setattr("vmtax.core.workload.registered", lambda: {Liar.name: Liar})
    env = torture.Env.__new__(torture.Env)
    env.rng = random.Random(1)
    outcome = torture.Outcome("parsers")
    torture.parser_attack(env, outcome, 3)
    assert outcome.problems and "liar-test.parse: returned" in outcome.problems[0]


def test_fuzzed_plans_are_repeatable(tmp_path):
    one = [torture.fuzz_plan(random.Random(7), tmp_path / "s") for _ in range(3)]
    two = [torture.fuzz_plan(random.Random(7), tmp_path / "s") for _ in range(3)]
    assert one == two


@pytest.mark.parametrize("value, text", [(float("nan"), "nan"), (float("-inf"), "-inf"),
                                         ("a\u0000", '"a\\u0000"'), ([1, True], "[1, true]")])
def test_fuzzed_values_are_toml(value, text):
    assert torture.toml_value(value) == text


def test_a_plan_time_beyond_a_workloads_range_is_one_line():
    """Found by the torture: time = 10**18 reached iperf3's own range check as a pydantic
    traceback."""
    with pytest.raises(planfile.PlanError) as caught:
        planfile.loads("time = 1000000000000000000\n[targets.native]\n[[workloads]]\n"
                       'name = "iperf3"\n', "x.toml")
    assert str(caught.value) == (
        "x.toml:1: time: expected a whole number of seconds from 1 to 86400, or false for no "
        "limit, got 1000000000000000000")
    # Within every plan's bound but beyond the workload's own range: the workload's words.
    with pytest.raises(planfile.PlanError) as caught:
        planfile.loads('time = 4000\n[targets.native]\n[[workloads]]\nname = "iperf3"\n',
                       "x.toml")
    assert str(caught.value) == (
        "x.toml:1: time: expected a whole number from 1 to 3600 (the time option of iperf3), "
        "got 4000")


@pytest.mark.parametrize("workload", ["cpu", "threads", "mutex", "fileio"])
def test_memory_hugetlb_on_a_workload_without_it_is_named_as_such(monkeypatch, workload):
    """The review's report: memory-hugetlb given to a workload that does not take it was
    blamed on the host's sysbench build. Even with a sysbench that lacks it, the line says
    the workload has no such option."""
    from vmtax.workloads import sysbench
    monkeypatch.setattr(sysbench, "_host_options", lambda test: frozenset({"threads"}))
    with pytest.raises(planfile.PlanError) as caught:
        planfile.loads(f'[targets.native]\n[[workloads]]\nname = "{workload}"\n'
                       'params = { memory-hugetlb = "on" }\n', "x.toml")
    message = str(caught.value)
    assert message.startswith(f"x.toml:4: workloads[0].params: expected a {workload} option (")
    assert message.endswith('got "memory-hugetlb"') and "large-page" not in message


@pytest.mark.parametrize("text, line", [
    # A [[workloads]] name that is a table, with a [quick] params table: was a TypeError.
    ('[targets.native]\n[[workloads]]\nname = { a = 1 }\n[quick]\nparams = { time = 1 }\n',
     "x.toml:3: workloads[0].name: expected a workload ("),
    # max_runs = "none" (no adaptive runs) was compared with runs: a TypeError.
    ('max_runs = "none"\nruns = 2\n[targets.natve]\n[[workloads]]\nname = "cpu"\n',
     "x.toml:3: targets.natve.kind: expected a target kind ("),
    # A file name longer than the filesystem takes was an OSError from stat().
    ('[targets.vm]\nkernel = "' + "a" * 5000 + '"\n[[workloads]]\nname = "cpu"\n',
     "x.toml:2: targets.vm.kernel: expected "),
])
def test_fuzzed_plans_that_once_raised_are_one_line(text, line):
    """Found by the torture's plan fuzzer."""
    with pytest.raises(planfile.PlanError) as caught:
        planfile.loads(text, "x.toml")
    assert any(problem.startswith(line) for problem in caught.value.lines)


def test_max_runs_none_is_no_adaptive_runs():
    plan = planfile.loads('max_runs = "none"\nruns = 2\n[targets.native]\n[[workloads]]\n'
                          'name = "cpu"\n', "x.toml")
    assert plan.max_runs is None and plan.runs == 2


def test_an_existing_file_option_refuses_a_name_too_long_for_the_filesystem():
    from vmtax.core import option_types
    with pytest.raises(ValueError, match="missing"):
        option_types._is_file("a" * 5000)
