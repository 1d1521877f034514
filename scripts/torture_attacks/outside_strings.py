"""Escapes from profiled symbols, imported reports and a --qemu wrapper (issue #35, items
6 and 7)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from torture_kit.env import ROOT, VMTAX, Env, Outcome, check_output, in_process
from torture_kit.registry import Attack
from torture_kit.stores import profiled_store, raw_controls


def _evil_sysbench(directory: Path) -> Path | None:
    """A `sysbench` whose hottest function is named `evil ESC ]0;PW BEL` (gas takes a
    quoted symbol), that spins 1.5 s in it and then runs the host's sysbench."""
    if not (shutil.which("gcc") and shutil.which("sysbench")):
        return None
    source = directory / "evil.c"
    source.write_text(
        "#include <time.h>\n#include <unistd.h>\nvolatile unsigned long sink;\n"
        "__attribute__((noinline)) void spin(void) __asm__(\"EVILSYMBOL\");\n"
        "void spin(void) { struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a);\n"
        "  do { for (int i = 0; i < 100000; i++) sink += i;\n"
        "       clock_gettime(CLOCK_MONOTONIC, &b); }\n"
        "  while ((b.tv_sec - a.tv_sec) * 1000000000L + b.tv_nsec - a.tv_nsec < 1500000000L); }\n"
        f'int main(int c, char **v) {{ spin(); v[0] = "{shutil.which("sysbench")}";\n'
        "  execv(v[0], v); return 1; }\n")
    assembly = directory / "evil.s"
    if subprocess.run(["gcc", "-O1", "-S", "-o", str(assembly), str(source)],
                      capture_output=True).returncode != 0:
        return None
    assembly.write_text(assembly.read_text().replace("EVILSYMBOL", '"evil\x1b]0;PW\x07"'))
    binary = directory / "sysbench"
    if subprocess.run(["gcc", "-o", str(binary), str(assembly)],
                      capture_output=True).returncode != 0:
        return None
    return binary


def outside_strings_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Items 6 and 7: a profiled symbol holding an OSC sequence, shown by `vmtax profile`
    and `profile diff`; an imported perf report whose reason holds one, and a --qemu
    wrapper whose --version prints one, exported as CSV to stdout. Nothing reaches the
    terminal or a cell raw. Not quick: the symbol comes from a real binary first on PATH
    as sysbench, profiled by a real run."""
    results = env.work / "evil-profile"
    profiled_store(results, "evil\x1b]0:PW\x07")
    commands = [["profile", "last:native"], ["profile", "diff", "last:native", "last:vm:tcg"]]
    for command in commands:
        outcome.cases += 1
        code, output, exc = in_process(*command, "--results", str(results))
        if code != 0 or raw_controls(output):
            outcome.fail(f"vmtax {' '.join(command)}: exit {code}, raw: "
                         f"{raw_controls(output)[:4]!r} {exc}")
    report = env.work / "evil-report.txt"
    report.write_text((ROOT / "tests/fixtures/perf_kvm/classic-vmx.txt").read_text()
                      .replace("HLT", "\x1b]0;PWN\x07\x1b[31mHLT", 1))
    exits_results = str(env.work / "evil-exits")
    in_process("exits", "import", str(report), "--label", "cap", "--results", exits_results)
    outcome.cases += 1
    code, output, exc = in_process("export", "cap", "--csv", "-", "--results", exits_results)
    if code != 0 or raw_controls(output) or "\\x1b]0;PWN\\x07" not in output:
        outcome.fail(f"export --csv - of a hostile perf report: exit {code}, raw: "
                     f"{raw_controls(output)[:4]!r} {exc}")
    if quick:
        return
    wrapper = env.work / "evil-qemu"
    wrapper.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then printf 'QEMU emulator "
                       "version 8.2.0\\033]0;PWN\\007\\033[31m\\n'; exit 0; fi\n"
                       "exec qemu-system-x86_64 \"$@\"\n")
    wrapper.chmod(0o755)
    qemu_results = env.work / "evil-qemu-r"
    outcome.cases += 1
    done = env.run("run", "--targets", "vm:tcg", "--workloads", "cpu", "--qemu", str(wrapper),
                   "--runs", "1", "--warmup", "0", "--time", "1", "--results",
                   str(qemu_results))
    check_output(outcome, "a run with a --qemu wrapper printing escapes", done.stderr)
    for fmt in ("csv", "benchstat"):
        code, output, exc = in_process("export", "last", f"--{fmt}", "-", "--results",
                                       str(qemu_results))
        if code != 0 or raw_controls(output):
            outcome.fail(f"export --{fmt} - of a run with an escaping --qemu: exit {code}, "
                         f"raw: {raw_controls(output)[:4]!r} {exc}")
        outcome.note(f"{fmt}: {len(output.splitlines())} lines")
    evil_bin = env.work / "evil-bin"
    evil_bin.mkdir()
    if _evil_sysbench(evil_bin) is None or not shutil.which("perf"):
        outcome.note("no gcc, sysbench or perf: no live profile")
        return
    outcome.cases += 1
    live = env.work / "evil-live"
    done = subprocess.run([*VMTAX, "run", "--targets", "native", "--workloads", "cpu",
                           "--collect", "profile", "--runs", "1", "--warmup", "0", "--time",
                           "2", "--results", str(live)], text=True, capture_output=True,
                          timeout=600, env={**env.env, "PATH": f"{evil_bin}:{os.environ['PATH']}"})
    check_output(outcome, "a profiled run of an evil sysbench", done.stderr)
    for command in commands[:1]:
        code, output, exc = in_process(*command, "--results", str(live))
        if code != 0 or raw_controls(output) or "evil\\x1b" not in output:
            outcome.fail(f"vmtax {' '.join(command)} of a live evil profile: exit {code}, "
                         f"raw: {raw_controls(output)[:4]!r} {exc}")


ATTACK = Attack(
    "escapes from profiles, reports, wrappers (#35)",
    "`profile`, `profile diff`, `export --csv -`, `export --benchstat -` of outside strings",
    "nothing reaches the terminal or a cell raw", outside_strings_attack)
