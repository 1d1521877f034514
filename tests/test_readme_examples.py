"""Every command in the README's code blocks, run: examples that rot fail here.

Each command has a form in FORMS, the command the test runs, cheap: the README's own where
it is (`runs`, `show last`, exports, reports) on a copy of the golden fixture database,
whose runs are golden-a and golden-b (golden-a renamed `nightly`, as the README's `--name
nightly` names it), with density or fleet runs stored as their own tests store them;
with `--dry-run` where it would measure (the plan is expanded and checked, nothing runs);
live, with tiny counts, where only running it checks it; skipped, with why, where it needs
what no test host has. A README command without a form fails the test, and so does a form
whose README command is gone, so a new example cannot go unchecked.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT, vmtax

from vmtax.results.store import Store

README = ROOT / "README.md"
GOLDEN = ROOT / "tests" / "fixtures" / "golden" / "golden.sqlite"
PERF_KVM = ROOT / "tests" / "fixtures" / "perf_kvm"
STOCK_QEMU = "/usr/bin/qemu-system-x86_64"


def code_lines(text: str) -> list[str]:
    """The lines of the README's code blocks, fenced or indented by four spaces."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
        elif fenced:
            lines.append(line.strip())
        elif line.startswith("    ") and line.strip():
            lines.append(line[4:].strip())
    return lines


def readme_commands(text: str) -> list[str]:
    """The commands of the README's code blocks, continuation lines joined, comments
    dropped, `.venv/bin/` dropped: its `vmtax …` and `make …` lines."""
    commands, pending = [], ""
    for code in code_lines(text):
        code = f"{pending} {code}" if pending else code
        pending = ""
        if code.endswith("\\"):
            pending = code[:-1].strip()
            continue
        if not re.match(r"(\.venv/bin/)?vmtax |make ", code):
            continue
        shell = re.search(r" [|>] ", code.split(" #")[0])
        words = shlex.split(code[:shell.start()] if shell else code, comments=True)
        words[0] = words[0].removeprefix(".venv/bin/")
        tail = code[shell.start():].split(" #")[0].rstrip() if shell else ""
        commands.append(" ".join(words) + tail)
    return commands


@dataclass(frozen=True)
class Form:
    """How the test runs one README command."""
    run: str = ""        # the command run instead of the README's, "" for the README's own
    why: str = ""        # why it differs from the README's
    db: str = "golden"   # the fixture database: golden, density or fleet
    codes: tuple[int, ...] = (0,)
    live: bool = False   # needs root and the host's tools: make test, not make test-unit
    skip: str = ""       # not run by any test, and why
    before: str = ""     # a command run first, making what it reads


DRY = "--dry-run: the plan expanded and checked against this host; nothing runs"
FORMS: dict[str, Form] = {
    "make run": Form("make -n run", "make's plan only: the real one is the set-up itself"),
    "make test": Form("make -n test", "make's plan only: this test runs inside it"),
    "vmtax doctor": Form(live=True),
    "vmtax list targets": Form(),
    "vmtax list workloads --json": Form(),
    "vmtax run": Form("vmtax run --dry-run", DRY),
    "vmtax run --targets native,container:runc,vm:tcg --workloads cpu,memory --runs 5 "
    "--warmup 1 --time 5": Form(
        "vmtax run --targets native,container:runc,vm:tcg --workloads cpu,memory --runs 1 "
        "--warmup 0 --time 1", "one 1 s repetition instead of 1 + 5 of 5 s", live=True),
    "vmtax run --qemu /opt/qemu-patched/bin/qemu-system-x86_64 --vcpus 1 --memory 2G": Form(
        f"vmtax run --qemu {STOCK_QEMU} --vcpus 1 --memory 2G --dry-run",
        "no patched QEMU here: the stock one stands in for it; " + DRY),
    "vmtax run --targets native,container:runsc,vm:tcg --workloads fio,memory --runs 2 "
    "--time 2": Form(
        "vmtax run --targets native,container:runsc,vm:tcg --workloads fio,memory "
        "--runs 2 --time 2 --dry-run", DRY),
    "vmtax run --targets native,container,vm:tcg --workloads iperf3 --collect "
    "host-cpu,host-mem": Form(
        "vmtax run --targets native,container,vm:tcg --workloads iperf3 --collect "
        "host-cpu,host-mem --dry-run", DRY),
    "vmtax run plans/serving.toml --quick": Form(
        "vmtax run plans/serving.toml --quick --dry-run", DRY),
    "vmtax run plans/hypervisors.toml --quick": Form(
        "vmtax run plans/hypervisors.toml --quick --dry-run", DRY),
    "vmtax composite last": Form(),
    "vmtax run plans/exits.toml --quick": Form(
        "vmtax run plans/exits.toml --quick --dry-run", DRY),
    "vmtax exits last": Form(
        "vmtax exits last", "last: the report a.txt imported (no KVM here to record one)",
        db="exits"),
    "vmtax exits import a.txt --label rt-pinned": Form(db="exits"),
    "vmtax exits diff gp-pinned rt-pinned": Form(db="exits"),
    "vmtax run --targets native,ssh:root@10.0.0.2 --identity ~/.ssh/id_ed25519 --workloads "
    "cpu,memory,fileio": Form(
        "vmtax run --targets native,ssh:root@10.0.0.2 --identity ~/.ssh/id_ed25519 "
        "--workloads cpu,memory,fileio --dry-run",
        "no machine at 10.0.0.2 here (tests/test_ssh_live.py runs a real sshd); " + DRY),
    "vmtax run --targets native,container:runc,container:docker,lxd --workloads cpu,iperf3 "
    "--runs 2 --time 1": Form(
        "vmtax run --targets native,container:runc,container:docker,lxd --workloads cpu,iperf3 "
        "--runs 2 --time 1 --dry-run",
        "tests/test_docker_live.py and tests/test_lxd_live.py run both daemons; " + DRY),
    "vmtax run plans/docker.toml --quick": Form(
        "vmtax run plans/docker.toml --quick --dry-run", DRY),
    "vmtax run --targets native,vm:tcg,libvirt --workloads cpu --runs 2 --time 1": Form(
        "vmtax run --targets native,vm:tcg,libvirt --workloads cpu --runs 2 --time 1 --dry-run",
        "tests/test_libvirt_live.py runs a real libvirtd; " + DRY),
    "vmtax run --targets native,libvirt:my-guest --workloads cpu,memory": Form(
        "vmtax run --targets native,libvirt:my-guest --workloads cpu,memory --dry-run",
        "no domain my-guest here (tests/test_libvirt_live.py defines one); " + DRY),
    "vmtax run --targets native,vm:tcg --workloads fileio --collect profile": Form(
        "vmtax run --targets native,vm:tcg --workloads fileio --collect profile --dry-run",
        DRY),
    "vmtax profile last:vm:tcg": Form(
        before="vmtax run --targets native,vm:tcg --workloads cpu --collect profile --runs 1 "
               "--warmup 0 --time 1",
        why="after a run recorded with --collect profile (one 1 s repetition of cpu)",
        live=True),
    "vmtax profile diff last:native last:vm:tcg": Form(
        before="vmtax run --targets native,vm:tcg --workloads cpu --collect profile --runs 1 "
               "--warmup 0 --time 1",
        why="after a run recorded with --collect profile (one 1 s repetition of cpu)",
        live=True),
    "vmtax list collectors": Form(),
    "vmtax runs": Form(),
    "vmtax show last --json": Form(),
    "vmtax show last --all": Form(),
    "vmtax run --name nightly --dry-run": Form(),
    # golden-b is worse than golden-a: exit status 1 is the example's point.
    "vmtax compare --fail-on worse": Form(codes=(1,)),
    "vmtax compare --fail-on worse --junit verdicts.xml": Form(codes=(1,)),
    "vmtax run --resume RUN_ID": Form("vmtax run --resume golden-b --dry-run",
                                      "RUN_ID: golden-b; " + DRY),
    "vmtax cleanup": Form(),
    "vmtax run --runs auto --ci-target 1": Form("vmtax run --runs auto --ci-target 1 --dry-run",
                                                DRY),
    "vmtax run --targets native,vm:tcg --qemu stock=/usr/bin/qemu-system-x86_64 --qemu "
    "patched=/opt/qemu/bin/qemu-system-x86_64": Form(
        f"vmtax run --targets native,vm:tcg --qemu stock={STOCK_QEMU} --qemu "
        f"patched={STOCK_QEMU} --dry-run",
        "no patched QEMU here: the stock one stands in for it; " + DRY),
    "vmtax compare last:vm:tcg@stock last:vm:tcg@patched": Form(
        "vmtax compare nightly:vm:tcg golden-b:vm:tcg",
        "the same RUN:TARGET form, on the golden runs' vm:tcg (no run of two QEMUs stored)"),
    "vmtax compare RUN_A RUN_B": Form("vmtax compare nightly golden-b",
                                      "RUN_A, RUN_B: the golden runs (golden-a named nightly)"),
    "vmtax plan plans/hugepages.toml --dry-run": Form(),
    "vmtax run plans/hugepages.toml": Form("vmtax run plans/hugepages.toml --dry-run", DRY),
    "vmtax run plans/hugepages.toml --quick": Form(
        "vmtax run plans/hugepages.toml --quick --dry-run", DRY),
    "vmtax run plans/pinning.toml --quick": Form(
        "vmtax run plans/pinning.toml --quick --dry-run", DRY),
    "vmtax report last --html report.html --png figures/": Form(),
    "vmtax export last --csv tidy.csv": Form(),
    "vmtax export last --csv - | head": Form("vmtax export last --csv -",
                                             "the whole export: the test reads its head"),
    "vmtax export nightly --format benchstat > new.txt": Form(
        "vmtax export nightly --format benchstat", "stdout read by the test, not a file"),
    "vmtax report nightly last --html ab.html": Form(),
    "vmtax export last --markdown summary.md": Form(),
    "vmtax density --targets container,vm:tcg --max 32 --ksm both": Form(
        "vmtax density --targets container,vm:tcg --max 1 --singles 1 --ksm off",
        "1 instance each, KSM off: 32 each with KSM off and on take many minutes (and 2 "
        "each up to 6 min on a busy 2-core host: without a plan, memory settles slowly)",
        live=True),
    "vmtax density plans/density.toml --quick": Form(
        "vmtax density plans/density.toml --quick --max 2 --ksm off",
        "2 instances each, KSM off (the quick form waits for KSM to settle)", live=True),
    "vmtax boot --target container,vm:tcg --count 20": Form(
        "vmtax boot --target container,vm:tcg --count 2", "2 starts each, not 20", live=True),
    "vmtax boot --target vm:tcg --count 10 --kernel minimal": Form(
        "vmtax boot --target vm:tcg --count 2 --kernel minimal",
        "2 starts, not 10 (make test builds the minimal kernel first)", live=True),
    "vmtax density --targets container:docker,lxd --max 20 --ksm both": Form(
        "vmtax density --targets container:docker,lxd --max 1 --singles 1 --ksm off",
        "1 instance each, KSM off (20 each, KSM off and on, take minutes)", live=True),
    "vmtax boot --target lxd,container:docker --count 3": Form(live=True),
    "vmtax tune plans/tune.toml --dry-run": Form(),
    "vmtax tune plans/tune.toml": Form("vmtax tune plans/tune.toml --dry-run",
                                       "30 min: tests/test_tune_live.py runs a search; " + DRY),
    "vmtax tune --targets vm:tcg --workloads cpu --knobs machine,vcpus --budget 6m --json": Form(
        "vmtax tune --targets vm:tcg --workloads cpu --knobs machine,vcpus --budget 6m --dry-run",
        "6 min: tests/test_tune_live.py runs a search; " + DRY),
    "vmtax density show RUN_A RUN_B": Form("vmtax density show {a} {b}",
                                           "RUN_A, RUN_B: two stored density runs",
                                           db="density"),
    "vmtax lab run --targets native,vm:kvm,vm:tcg --workloads cpu,memory --runs 2": Form(
        skip="boots a lab (minutes under TCG); tests/test_lab_live.py runs a plan in one"),
    "vmtax lab --vcpus 2 --memory 6G run --targets native,vm:kvm --collect exits": Form(
        skip="boots a lab; tests/test_lab_live.py records exits in one"),
    "vmtax lab boot --target vm:kvm --count 3 --kernel minimal": Form(
        skip="boots a lab; tests/test_lab.py checks lab arguments on the host"),
    "vmtax lab --results R run --targets native,vm:kvm,firecracker,cloud-hypervisor "
    "--workloads cpu,memory,fileio,iperf3 --runs 2 --time 2": Form(
        skip="boots a lab; tests/test_microvm_live.py runs both VMMs beside QEMU in one"),
    "vmtax lab --results R boot --target firecracker,cloud-hypervisor --count 5": Form(
        skip="boots a lab; tests/test_microvm_live.py cold-boots both in one"),
    "vmtax lab --results R density --targets firecracker --max 10": Form(
        skip="boots a lab; tests/test_microvm_live.py fills one with both"),
    "vmtax lab --results R --session plans/microvms.session": Form(
        skip="boots a lab for minutes; tests/test_density.py loads the plan for each "
             "command, tests/test_planfile.py checks it as run reads it"),
    **{command: Form(skip="needs a host whose KVM runs guests (this one's runs them in "
                          "vmtax lab --session plans/microvms.session); tests/test_planfile.py "
                          "and tests/test_density.py read the plan")
       for command in ("vmtax run plans/microvms.toml --quick",
                       "vmtax density plans/microvms.toml --quick",
                       "vmtax boot plans/microvms.toml --count 5")},
    "vmtax fleet start --port 6379": Form(
        skip="starts a Ray head that stays up until Ctrl-C; tests/test_fleet_live.py starts "
             "a real fleet"),
    "vmtax fleet join HEAD_IP:6379 --name rack1-01": Form(
        skip="joins a running head and stays up until Ctrl-C; tests/test_fleet_live.py"),
    "vmtax fleet status --fleet HEAD_IP:6379": Form(
        skip="asks a running Ray head (HEAD_IP); tests/test_fleet_live.py"),
    "vmtax run plans/classic.toml --quick --fleet HEAD_IP:6379 --spread hosts": Form(
        "vmtax run plans/classic.toml --quick --fleet HEAD_IP:6379 --spread hosts --dry-run",
        "no head at HEAD_IP; " + DRY),
    "vmtax fleet show last [--json]": Form("vmtax fleet show last --json",
                                           "[--json] is optional", db="fleet"),
    "vmtax compare last@rack1-01 last@rack1-02": Form(db="fleet"),
    "vmtax trend nightly": Form(),
    "vmtax trend nightly --metric latency p95 --target vm --since 2026-11-01": Form(
        "vmtax trend nightly --metric 'latency p95' --target vm --since 2026-11-01",
        "the fixture's nightly run has no vm target with a p95 latency: the one-line error",
        codes=(2,)),
    "vmtax trend nightly --fail-on regression": Form(),
    "vmtax trend nightly --accept RUN": Form(
        "vmtax trend nightly --accept nightly", "RUN: the fixture's nightly run"),
    "vmtax trend nightly --until RUN --json": Form(
        "vmtax trend nightly --until nightly --json", "RUN: the fixture's nightly run"),
    "vmtax export nightly --format otava > nightly.csv": Form(
        "vmtax export nightly --format otava", "stdout read by the test, not a file"),
    "vmtax trend nightly --html trend.html": Form(),
    "vmtax publish nightly weekly site/": Form(
        "vmtax publish nightly golden-b site/", "weekly: the fixture's other name, golden-b"),
    "vmtax export last --csv fleet.csv": Form(db="fleet"),
    "vmtax report last --html fleet.html": Form(db="fleet"),
}


def _fill(results: Path, db: str) -> dict[str, str]:
    """The fixture database of a form in results/; the run ids its placeholders stand for."""
    results.mkdir(parents=True)
    shutil.copy(GOLDEN, results / "vmtax.sqlite")
    store = Store(results)
    store.db.execute("UPDATE runs SET plan = json_set(plan, '$.name', 'nightly') "
                     "WHERE json_extract(plan, '$.name') = 'golden-a'")
    store.db.commit()
    ids: dict[str, str] = {}
    if db == "density":
        from test_density_compare import store_study
        ids = {"a": store_study(store, "container", "container", (4.0, 4.0)),
               "b": store_study(store, "vm:tcg", "vm", (80.0, 40.0))}
    elif db == "fleet":
        from test_fleet import _host_run
        for host, keeps in (("rack1-01", 0.8), ("rack1-02", 0.9)):
            time.sleep(0.01)   # `last` is the newest run
            _host_run(store, {"spread": "hosts", "host": host, "id": "f1"}, keeps)
    store.close()
    return ids


def _run(command: str, form: Form, where: Path) -> subprocess.CompletedProcess:
    results = where / "results"
    ids = _fill(results, form.db)
    shutil.copy(PERF_KVM / "e2-rt-pinned.txt", where / "a.txt")
    env = {"VMTAX_RESULTS": str(results), "COLUMNS": "100"}
    if form.db == "exits":   # gp-pinned for the diff, a report for `exits last`
        shutil.copy(PERF_KVM / "e2-rt-unpinned.txt", where / "gp.txt")
        for file, label in (("gp.txt", "gp-pinned"), ("a.txt", "rt-pinned")):
            if command != f"vmtax exits import {file} --label {label}":
                assert vmtax("exits", "import", file, "--label", label, cwd=where,
                             env=env).returncode == 0
    if form.before:
        made = vmtax(*shlex.split(form.before)[1:], cwd=where, env=env, timeout=1800)
        assert made.returncode == 0, f"{form.before}: {made.stderr[-2000:]}"
    argv = shlex.split((form.run or command).format(**ids))
    if argv[0] == "make":
        return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    return vmtax(*argv[1:], cwd=where if "plans/" not in command else ROOT,
                 env=env, timeout=1800 if form.live else 300)


def _check(command: str, form: Form, tmp_path: Path) -> None:
    if form.skip:
        pytest.skip(form.skip)
    done = _run(command, form, tmp_path)
    assert done.returncode in form.codes, (
        f"README: `{command}` ran as `{form.run or command}`: exit status {done.returncode}\n"
        f"{done.stderr[-2000:]}")
    assert "Traceback" not in done.stderr


def _ids(kind: str) -> list[str]:
    return [c for c, f in FORMS.items() if (f.live, bool(f.skip)) == {
        "unit": (False, False), "live": (True, False), "skipped": (False, True)}[kind]]


def test_every_readme_command_has_a_form_and_every_form_a_readme_command():
    commands = readme_commands(README.read_text())
    assert sorted(set(commands) - set(FORMS)) == [], "README commands with no form here"
    assert sorted(set(FORMS) - set(commands)) == [], "forms of commands the README dropped"


def test_the_readmes_code_blocks_say_venv_bin_vmtax():
    """A newcomer's shell has no `vmtax` before `source .venv/bin/activate`."""
    assert [line for line in code_lines(README.read_text()) if line.startswith("vmtax ")] == []


@pytest.mark.parametrize("command", _ids("unit"))
def test_a_readme_command_works(command, tmp_path):
    _check(command, FORMS[command], tmp_path)


@pytest.mark.live
@pytest.mark.parametrize("command", _ids("live"))
def test_a_readme_command_works_live(command, tmp_path):
    _check(command, FORMS[command], tmp_path)


@pytest.mark.parametrize("command", _ids("skipped"))
def test_a_readme_command_no_test_host_can_run(command, tmp_path):
    _check(command, FORMS[command], tmp_path)


def test_the_readmes_exports_give_what_it_says(tmp_path):
    """`--csv -` writes CSV with dim.* columns to stdout; benchstat lines are Go's format."""
    csv = _run("vmtax export last --csv - | head", FORMS["vmtax export last --csv - | head"],
               tmp_path / "csv")
    header = csv.stdout.splitlines()[0].split(",")
    assert "run_id" in header and any(h.startswith("dim.") for h in header)
    bench = _run("vmtax export nightly --format benchstat > new.txt",
                 FORMS["vmtax export nightly --format benchstat > new.txt"], tmp_path / "b")
    assert re.search(r"^Benchmark\S+ \d+ [\d.e+-]+ \S+", bench.stdout, re.MULTILINE)
