"""The torture script's own parts, and what it found (issue #16)."""

import random
import re
import sys
from pathlib import Path

import pytest

from vmtax.core import plugin
from vmtax.core.errors import ParseError
from vmtax.core.types import MetricSpec
from vmtax.core.workload import Workload
from vmtax.studies import planfile

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
from torture_attacks import parser_fuzz, plan_fuzz  # noqa: E402
from torture_kit import coverage, registry  # noqa: E402
from torture_kit.env import Env, Outcome  # noqa: E402


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
    env = Env.__new__(Env)
    env.rng = random.Random(1)
    outcome = Outcome("parsers")
    parser_fuzz.parser_attack(env, outcome, 20)
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

    monkeypatch.setattr(parser_fuzz, "seeds_for", lambda cls: ["x"])
    monkeypatch.setattr("vmtax.core.workload.registered", lambda: {Liar.name: Liar})
    env = Env.__new__(Env)
    env.rng = random.Random(1)
    outcome = Outcome("parsers")
    parser_fuzz.parser_attack(env, outcome, 3)
    assert outcome.problems and "liar-test.parse: returned" in outcome.problems[0]


def test_fuzzed_plans_are_repeatable(tmp_path):
    one = [plan_fuzz.fuzz_plan(random.Random(7), tmp_path / "s") for _ in range(3)]
    two = [plan_fuzz.fuzz_plan(random.Random(7), tmp_path / "s") for _ in range(3)]
    assert one == two


@pytest.mark.parametrize("value, text", [(float("nan"), "nan"), (float("-inf"), "-inf"),
                                         ("a\u0000", '"a\\u0000"'), ([1, True], "[1, true]")])
def test_fuzzed_values_are_toml(value, text):
    assert plan_fuzz.toml_value(value) == text


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


# -- the registry of attacks (issue #46, item 2) -------------------------------------------

def _driver(tmp_path, *args):
    """scripts/torture.py with tmp_path on the import path, as a directory of the user's
    holding attack modules would be."""
    import os
    import subprocess
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, str(SCRIPTS / "torture.py"), *args],
                          capture_output=True, text=True, timeout=120, env=env)


ADDED = '''
from torture_kit.registry import Attack


def run(env, outcome, quick):
    outcome.cases += 3
    (env.work / "ran").write_text("yes")
    outcome.note("ran in " + ("quick" if quick else "full") + " form: "
                 + str((env.work / "ran").read_text()))
    if not quick:
        outcome.fail("planted problem")


ATTACK = Attack("an attack added as one file", "nothing", "it is found and run", run)
'''


def test_an_attack_added_as_one_file_is_found_and_run(tmp_path):
    """One module in a directory of torture_attacks on the import path, no other file
    touched: the driver finds it, runs it in either form, and its problem fails the run."""
    (tmp_path / "torture_attacks").mkdir()
    (tmp_path / "torture_attacks" / "added_here.py").write_text(ADDED)
    listed = _driver(tmp_path, "--list", "--quick")
    assert "an attack added as one file\n  attacks: nothing\n  expects: it is found and run" \
        in listed.stdout
    assert "fuzzed plan files" in listed.stdout    # vmtax's own are found beside it
    done = _driver(tmp_path, "--quick", "--only", "added as one")
    assert done.returncode == 0, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if "an attack added" in line)
    assert "ran in quick form: yes" in row and "│ 3 " in row
    assert re.search(r"\n2 attacks, \d+ cases, 0 problems\n", done.stdout)
    assert "no traceback, leak" in done.stdout
    done = _driver(tmp_path, "--only", "added as one")
    assert done.returncode == 1 and "planted problem" in done.stdout


def test_two_attacks_of_one_name_are_refused(tmp_path):
    (tmp_path / "torture_attacks").mkdir()
    (tmp_path / "torture_attacks" / "again.py").write_text(
        ADDED.replace("an attack added as one file", "fuzzed plan files"))
    done = _driver(tmp_path, "--list")
    assert done.returncode == 2
    assert done.stderr.strip() == ("torture: two attacks named 'fuzzed plan files': in "
                                   "torture_attacks.again and torture_attacks.plan_fuzz")


def test_every_path_option_is_covered_by_a_declared_attack():
    """The coverage check is a property of the registry: every option of vmtax's commands
    that names a path is in some attack's `covers`."""
    attacks = registry.discover()
    assert coverage.unattacked(attacks) == []
    assert len(coverage.path_options()) > 30


def test_path_options_are_named_as_help_shows_them_even_those_made_late():
    """run makes its flags when they are first needed: they are walked all the same, and
    an argument is named by its metavar, not by the parsed name run's flags give it."""
    options = coverage.path_options()
    assert {("run", "PLAN.toml"), ("run", "--results"), ("list", "--plan"),
            ("exits", "import", "FILE")} <= set(options)
    assert not any("__" in word for option in options for word in option)


def test_a_path_option_no_attack_covers_fails_the_property(monkeypatch):
    known = coverage.path_options()
    monkeypatch.setattr(coverage, "path_options",
                        lambda: {**known, ("export", "--parquet"): "FILE"})
    assert coverage.unattacked(registry.discover()) == [("export", "--parquet")]


def test_each_form_has_its_attacks():
    attacks = registry.discover()
    quick = [a.name for a in registry.selected(attacks, True, None)]
    full = [a.name for a in registry.selected(attacks, False, None)]
    assert "SIGINT native at a moment the seed draws" in quick
    assert "SIGINT native at a moment the seed draws" not in full
    assert sum(name.startswith(("SIGINT ", "SIGKILL ")) for name in full) == 36
    assert sum(name.startswith(("SIGINT ", "SIGKILL ")) for name in quick) == 2
    assert len(set(quick)) == len(quick) and len(set(full)) == len(full)
