"""Issue #35 (security and faults, round three): paths a user names stay in their tree,
numbers a user gives are bounded, deep TOML is one line, names are NFC and do not collide,
and outside strings reach no terminal or CSV cell raw."""

import os
import shutil

import pytest
from click.testing import CliRunner

from vmtax.cli.main import cli
from vmtax.core import paths
from vmtax.core.errors import VmtaxError
from vmtax.guest import remote_bundle, rootfs
from vmtax.studies import estimate, planfile, tune

# -- 1: a path a plan names never lands outside the tree it joins -------------------------


def test_under_joins_inside_and_refuses_what_leads_out(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    assert paths.under(root, "/usr/bin/x", "a file") == root / "usr/bin/x"
    assert paths.under(root, "a/../b", "a file") == root / "b"
    for name in ("../x", "/../../etc/passwd", "a/../../x", "", "."):
        with pytest.raises(VmtaxError, match="would land outside"):
            paths.under(root, name, "a file")
    (root / "out").symlink_to(tmp_path)
    with pytest.raises(VmtaxError, match="through a symbolic link"):
        paths.under(root, "out/x", "a file")
    assert paths.inside("bin", "/usr/bin/x", "a program") == "bin/usr/bin/x"
    with pytest.raises(VmtaxError, match="would land outside bin"):
        paths.inside("bin", "../../x", "a program")


@pytest.fixture
def program_above(tmp_path, monkeypatch):
    """A program at tmp/x/h, named from tmp/d/a/b as ../../../x/h (the issue's repro)."""
    (tmp_path / "x").mkdir()
    program = tmp_path / "x" / "h"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    (tmp_path / "d/a/b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "d/a/b")
    return program


@pytest.mark.skipif(not any(map(os.path.exists, rootfs.BUSYBOX_CANDIDATES)),
                    reason="busybox is not installed")
def test_a_relative_binary_lands_inside_the_rootfs(program_above, tmp_path):
    files = rootfs.file_set(["../../../x/h"])
    assert files[str(program_above)] == program_above
    root = tmp_path / "c/r/s/t"     # ../../../x/h from here would be tmp/c/x/h
    root.mkdir(parents=True)
    rootfs.populate(root, files)
    assert (root / str(program_above).lstrip("/")).read_text() == "#!/bin/sh\n"
    assert not (tmp_path / "c/x").exists()


def test_populate_refuses_a_guest_path_out_of_the_tree(tmp_path):
    with pytest.raises(VmtaxError, match="would land outside"):
        rootfs.populate(tmp_path / "root", {"/bin/busybox": shutil.which("true"),
                                            "../../escaped": shutil.which("true")})
    assert not (tmp_path.parent / "escaped").exists()


def test_a_plan_names_programs_by_absolute_path(program_above):
    text = ('[targets.c]\nkind = "container"\nruntime = "runc"\n'
            'binaries = ["../../../x/h"]\n[[workloads]]\nname = "cpu"\n')
    [target] = [t for t in planfile.loads(text, "p.toml").targets if t.name == "c"]
    assert target.options["binaries"] == [str(program_above)]


def test_the_ssh_bundle_keeps_programs_in_its_bin(program_above, monkeypatch):
    monkeypatch.setattr(remote_bundle.platform, "machine", lambda: remote_bundle.ARCH)
    bundle = remote_bundle.make([str(program_above)])
    assert bundle.programs[str(program_above)] == "bin" + str(program_above)
    with pytest.raises(VmtaxError, match="would land outside bin"):
        remote_bundle.make(["../../../x/h"])


# -- 8: durations and counts are bounded ----------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["tune", "--targets", "vm", "--workloads", "cpu", "--budget", "9" * 400 + "h",
      "--dry-run"], "--budget: expected a duration"),
    (["run", "--targets", "native", "--workloads", "cpu", "--time", "99999999999",
      "--dry-run"], "--time: expected a whole number of seconds from 1 to 86400"),
    (["run", "--targets", "native", "--workloads", "cpu", "--runs", "99999999999",
      "--dry-run"], "--runs takes a whole number from 1 to 1000000000"),
    (["run", "--targets", "native", "--workloads", "cpu", "--warmup", "1e400",
      "--dry-run"], "--warmup: expected a whole number from 0 to"),
    (["boot", "--count", "99999999999"], "--count: expected a whole number"),
    (["density", "--max", "99999999999"], "--max: expected a whole number"),
])
def test_huge_numbers_are_one_line_errors(tmp_path, args, message):
    done = CliRunner().invoke(cli, [*args, "--results", str(tmp_path)])
    assert isinstance(done.exception, VmtaxError), done.output
    assert message in str(done.exception) and "\n" not in str(done.exception)


def test_a_budget_is_bounded():
    assert tune.parse_budget("720h") == 720 * 3600
    for text in ("721h", "9" * 400 + "h", "1e9h", "0s"):
        with pytest.raises(ValueError, match="at most 720h"):
            tune.parse_budget(text)


@pytest.mark.parametrize("key", ["time = 99999999999", "timeout = 1e300", "runs = 99999999999",
                                 "warmup = 99999999999"])
def test_huge_plan_settings_are_refused(key):
    with pytest.raises(planfile.PlanError, match=r"^p\.toml:1: \w+: expected .*(at most|to) "):
        planfile.loads(f"{key}\n[targets.native]\n[[workloads]]\nname = 'cpu'\n", "p.toml")


def test_huge_workload_and_density_options_are_refused():
    text = "[targets.native]\n[[workloads]]\nname = 'cpu'\nparams = { time = 99999999999 }\n"
    with pytest.raises(planfile.PlanError, match="from 1 to 86400, got 99999999999"):
        planfile.loads(text, "p.toml")


def test_no_job_waits_longer_than_a_poll_can():
    from vmtax.core import workload as workloads
    from vmtax.core.types import Job

    cpu = workloads.get("cpu").make({"time": 86_400})
    job = Job(argv=["x"], timeout=10 ** 12)
    assert estimate.job_timeout(cpu, job, "measure", None) == estimate.MAX_TIMEOUT
    assert estimate.MAX_TIMEOUT * 1000 < 2 ** 31 - 1


# -- 9: nesting deeper than a plan needs is one line ----------------------------------


@pytest.mark.parametrize("text", [
    "x = " + "[" * 100_000 + "]" * 100_000 + "\n",
    "[targets.native]\n[[workloads]]\nname = 'cpu'\nparams = { threads = "
    + "[" * 1000 + "1" + "]" * 1000 + " }\n",
    "[targets.native]\n[[workloads]]\nname = 'cpu'\nparams = { threads = "
    + "[" * 40 + "1" + "]" * 40 + " }\n",
    "a = " + "{ b = " * 300 + "1" + " }" * 300 + "\n",
])
def test_deep_toml_is_one_line(text):
    with pytest.raises(planfile.PlanError) as caught:
        planfile.loads(text, "deep.toml")
    assert str(caught.value) == ("deep.toml: tables or arrays nested more than 32 levels "
                                 "deep; expected a plan")


def test_deep_toml_through_tune_and_density_is_one_line(tmp_path):
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    for args in (["tune", str(deep), "--dry-run"], ["density", str(deep)],
                 ["run", str(deep), "--dry-run"], ["plan", str(deep)]):
        done = CliRunner().invoke(cli, [*args, "--results", str(tmp_path)]
                                  if args[0] != "plan" else args)
        assert isinstance(done.exception, VmtaxError), (args, done.output)
        assert "nested more than 32 levels" in str(done.exception)


# -- 12: names are composed (NFC) where they come in, and do not collide -------------------

CAFE, CAFE_DECOMPOSED = "caf\u00e9", "cafe\u0301"


def test_two_spellings_of_one_target_name_are_refused_in_a_plan():
    text = (f'[targets."{CAFE}"]\nkind = "native"\n[targets."{CAFE_DECOMPOSED}"]\n'
            'kind = "native"\n[[workloads]]\nname = "cpu"\n')
    with pytest.raises(planfile.PlanError) as caught:
        planfile.loads(text, "p.toml")
    assert str(caught.value) == (
        'p.toml:3: targets."cafe\\u0301": expected target names that differ in Unicode\'s '
        'composed form (NFC), got "cafe\\u0301", the same name as "caf\\u00e9"')


def test_a_decomposed_name_is_kept_composed_and_its_baseline_found():
    text = (f'baseline = "{CAFE}"\n[targets."{CAFE_DECOMPOSED}"]\nkind = "native"\n'
            '[targets.native]\n[[workloads]]\nname = "cpu"\n')
    loaded = planfile.loads(text, "p.toml")
    assert [t.name for t in loaded.targets] == [CAFE, "native"] and loaded.baseline == CAFE


def test_two_spellings_of_one_label_are_refused_on_the_command_line():
    from vmtax.studies import plan

    with pytest.raises(VmtaxError, match=r"--qemu label: 'caf\\xe9' and 'cafe\\u0301' are "
                                         r"one name"):
        plan.from_names(["vm"], ["cpu"], {"qemu": [f"{CAFE}=/bin/true",
                                                   f"{CAFE_DECOMPOSED}=/bin/true"]})


def test_two_spellings_of_one_density_target_are_refused(tmp_path):
    from vmtax.cli import density as cli_density

    path = tmp_path / "d.toml"
    path.write_text(f'[targets."{CAFE}"]\nkind = "container"\n'
                    f'[targets."{CAFE_DECOMPOSED}"]\nkind = "container"\n')
    with pytest.raises(VmtaxError, match="are one name in Unicode's composed form"):
        cli_density.load_plan(str(path))


# -- 6: symbols a profile found reach the terminal escaped --------------------------------

PW = "evil\x1b]0:PW\x07"   # no ";": folded stacks split on it


def test_profiled_symbols_reach_the_terminal_escaped(tmp_path):
    from test_profile_cli import store_cell

    from vmtax.results.store import Store

    results = str(tmp_path / "r")
    store = Store(results)
    run = store.new_run({"name": "pair"}, {}, "test")
    for target, (own, other) in (("native", (60, 40)), ("vm:tcg", (90, 10))):
        store_cell(store, run, target, [("sysbench", f"sysbench;main;{PW}", own),
                                        ("sysbench", "sysbench;main;x", other)], 100.0, 1.0)
    store.finish_run(run, "done")
    store.close()
    for args in (["profile", "last:native"], ["profile", "diff", "last:native", "last:vm:tcg"]):
        done = CliRunner().invoke(cli, [*args, "--results", results], env={"COLUMNS": "200"})
        assert done.exit_code == 0, (done.output, done.exception)
        assert "\x1b" not in done.output and "\x07" not in done.output, args
        assert "evil\\x1b]0:PW\\x07" in done.output, args


def test_markup_escapes_controls_and_markup():
    from vmtax.core.text import markup

    assert markup("[b]a\x1b[31m\nb") == "\\[b]a\\x1b[31m\nb"


# -- 7: control characters in CSV cells are escaped as on the terminal ----------------------

HOSTILE_REASON = "\x1b]0;PWN\x07\x1b[31mHLT"


def test_an_imported_reports_reason_is_escaped_in_csv(tmp_path):
    from pathlib import Path

    text = (Path(__file__).parent / "fixtures" / "perf_kvm" / "classic-vmx.txt").read_text()
    hostile = tmp_path / "hostile.txt"
    hostile.write_text(text.replace("HLT", HOSTILE_REASON, 1))
    results = str(tmp_path / "r")
    assert CliRunner().invoke(cli, ["exits", "import", str(hostile), "--label", "cap",
                                    "--results", results]).exit_code == 0
    for fmt in ("csv", "benchstat"):
        done = CliRunner().invoke(cli, ["export", "cap", f"--{fmt}", "-", "--results", results])
        if fmt == "benchstat":   # an imported report has no repetitions for benchstat
            assert "imported perf kvm stat report" in str(done.exception)
            continue
        assert done.exit_code == 0, done.output
        assert not [c for c in done.output if not (c.isprintable() or c == "\n")]
        assert "\\x1b]0;PWN\\x07\\x1b[31mHLT" in done.output


def test_a_fingerprint_with_escapes_is_escaped_in_csv_and_benchstat(tmp_path):
    from vmtax.core.types import Metric
    from vmtax.report import export
    from vmtax.results.store import Store

    store = Store(tmp_path)
    run_id = store.new_run({"targets": [{"name": "vm", "kind": "vm", "options": {}}]},
                           {"cpu_model": f"cpu{PW}"}, "0")
    store.set_target(run_id, "vm", "vm", {"qemu_version": f"QEMU {PW}"})
    store.add_rep(run_id, target="vm", workload="cpu", params={f"p{PW}": f"v{PW}"},
                  phase="measure", idx=0, status="ok", argv=["x"], started=1.0,
                  metrics=[Metric("events/s", 1.0, "events/s", True)])
    store.finish_run(run_id, "done")
    run = Store(tmp_path, readonly=True).load_run(run_id)
    for data in (export.to_csv(run), export.to_benchstat(run)):
        text = data.decode()
        assert not [c for c in text if not (c.isprintable() or c == "\n")]
        assert "evil\\x1b]0:PW\\x07" in text


def test_a_relative_ray_temp_dir_is_given_to_ray_absolute(tmp_path, monkeypatch):
    from vmtax.studies import fleet_ray as fleet

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(fleet, "_ray_exe", lambda: "ray")
    for argv in (fleet.head_argv(6379, "../t"), fleet.join_argv("h:1", "h1", "../t")):
        assert argv[argv.index("--temp-dir") + 1] == str(tmp_path.parent / "t")


def test_an_ssh_key_and_known_hosts_a_plan_names_are_kept_absolute(tmp_path, monkeypatch):
    from vmtax.core import plugin
    from vmtax.core import target as targets

    monkeypatch.chdir(tmp_path)
    infos = plugin.option_infos(targets.get("ssh").Options)
    assert infos["identity"].check("../k") == str(tmp_path.parent / "k")
    assert infos["known_hosts"].check("~/kh") == os.path.expanduser("~/kh")


@pytest.mark.parametrize("setting", [{"time": 10 ** 12}, {"runs": 10 ** 12},
                                     {"warmup": 10 ** 12}, {"timeout": 1e300}])
def test_a_plan_made_elsewhere_is_bounded_too(setting):
    """A plan read back from a store or sent to a fleet host is checked as it is made."""
    from vmtax.studies.plan import Plan, TargetSpec, WorkloadSpec

    with pytest.raises(VmtaxError, match=r"must be .*(to|at most) "):
        Plan(targets=[TargetSpec("native", "native", {})], workloads=[WorkloadSpec("cpu")],
             **setting)


def test_what_cleanup_recovered_reaches_the_terminal_escaped(monkeypatch):
    from vmtax.host import journal

    monkeypatch.setattr(journal, "recover", lambda: [f"removed [b]{PW}"])
    done = CliRunner().invoke(cli, ["cleanup"])
    assert done.exit_code == 0 and "\x1b" not in done.output and "\x07" not in done.output
    assert "removed [b]evil\\x1b]0:PW\\x07" in done.output


@pytest.mark.parametrize("first, second, message", [
    ("vm", "\uff56\uff4d", 'expected target names that differ in Unicode\'s compatibility form '
     '(NFKC), as they look, got "\\uff56\\uff4d", the same name as "vm"'),
    ("native", "native ", 'expected a target name without spaces at its ends, got "native "'),
])
def test_look_alike_target_names_are_refused_in_a_plan(first, second, message):
    """Issue 45.17: a full-width "ｖｍ" beside "vm", and "native " beside "native", passed
    as distinct targets: two columns that read the same."""
    text = (f'[targets."{first}"]\nkind = "native"\n[targets."{second}"]\n'
            'kind = "native"\n[[workloads]]\nname = "cpu"\n')
    with pytest.raises(planfile.PlanError) as caught:
        planfile.loads(text, "p.toml")
    assert str(caught.value).endswith(message), str(caught.value)


@pytest.mark.parametrize("labels, message", [
    (["vm", "\uff56\uff4d"], r"'vm' and '\\uff56\\uff4d' are one name in Unicode's "
                             r"compatibility form \(NFKC\), as they look"),
    (["a ", "b"], r"--qemu label: 'a ' has a space at an end"),
])
def test_look_alike_labels_are_refused_on_the_command_line(labels, message):
    from vmtax.studies import plan

    with pytest.raises(VmtaxError, match=message):
        plan.from_names(["vm"], ["cpu"], {"qemu": [f"{label}=/bin/true" for label in labels]})
