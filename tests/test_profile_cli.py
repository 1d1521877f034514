"""`vmtax profile` and the report's flame graphs on a real results database holding a run
of two profiled cells (the bare host and a TCG guest doing fileio), stored as the profile
collector stores them: time per unit of work, the diff's ranking, hints, the SVG."""

import json
import re

import pytest
from click.testing import CliRunner

from vmtax.analysis import profile
from vmtax.cli.main import cli
from vmtax.core.types import Metric
from vmtax.report import flamegraph
from vmtax.results.store import Store

PARAMS = {"file-test-mode": "rndrw"}


def samples(name, value, **dimensions):
    return Metric(name, value, "samples", False, dimensions)


def plain(name, value, unit):
    return Metric(name, value, unit, False, {})


def store_cell(store, run, target, stacks, per_s, cpu):
    """Three measured repetitions of 2 s at per_s reads a second, and a profile of `stacks`
    (class, folded stack, samples) standing for `cpu` seconds."""
    for i in range(3):
        store.add_rep(run, target=target, workload="fileio", params=PARAMS, phase="measure",
                      idx=i, status="ok", argv=["sysbench"], started=0.0, host_elapsed=2.0,
                      metrics=[Metric("reads/s", per_s, "reads/s", True, {})])
    store.set_target(run, target, target.partition(":")[0], {})
    metrics = [samples("class samples", sum(n for c, _, n in stacks if c == cls),
                       **{"class": cls}) for cls in dict.fromkeys(c for c, _, _ in stacks)]
    for cls, stack, n in stacks:
        metrics.append(samples("stack samples", n, **{"class": cls, "stack": stack}))
        leaf = stack.split(";")[-1]
        metrics.append(samples("function samples", n, **{"class": cls, "function": leaf,
                                                         "dso": "qemu" if cls == "vcpu"
                                                         else "[kernel.kallsyms]"}))
    metrics += [plain("sampled cpu", cpu, "s"), plain("unresolved share", 0.0, "%"),
                plain("profile overhead", 1.5, "%"), plain("profile cpu", cpu * 0.015, "s")]
    store.add_rep(run, target=target, workload="fileio", params=PARAMS, phase="collect", idx=0,
                  status="ok", argv=["profile"], started=0.0, metrics=metrics)


@pytest.fixture
def results(tmp_path):
    path = str(tmp_path / "results")
    store = Store(path)
    run = store.new_run({"name": "pair"}, {}, "test")
    store_cell(store, run, "native", [
        ("sysbench", "sysbench;main;ext4_file_read_iter", 60),
        ("sysbench", "sysbench;main;copy_user", 40)], per_s=100.0, cpu=1.0)
    store_cell(store, run, "vm:tcg", [
        ("vcpu", "CPU 0/TCG;cpu_exec;cpu_tb_exec;[perf-4242.map]", 50),
        ("vcpu", "CPU 0/TCG;cpu_exec;tb_gen_code", 30),
        ("io", "worker;worker_thread;pwritev", 20)], per_s=10.0, cpu=3.0)
    store.finish_run(run, "done")
    store.close()
    return path


def ok(*args):
    res = CliRunner().invoke(cli, list(args))
    assert res.exit_code == 0 and res.exception is None, (res.output, res.exception)
    return res.stdout


def test_show_gives_shares_classes_hints_and_work(results):
    data = json.loads(ok("profile", "last:vm:tcg", "--json", "--results", results))
    cell, = data["cells"]
    assert cell["work"] == pytest.approx(60.0) and cell["work_unit"] == "reads"
    assert [(c["name"], c["share"]) for c in cell["classes"]] == [("vcpu", 80.0), ("io", 20.0)]
    assert cell["functions"][0]["name"] == "[perf-4242.map]"
    hints = " | ".join(cell["hints"])
    assert "TCG translating guest code" in hints and "30.0%" in hints
    assert "anonymous executable memory" in hints and "50.0%" in hints
    assert "block layer" in hints and "20.0%" in hints
    assert all(h.startswith("perhaps ") for h in cell["hints"])
    text = ok("profile", "pair:vm:tcg", "--results", results)
    assert "tb_gen_code" in text and "vcpu" in text


def test_diff_ranks_functions_by_time_added_per_unit_of_work(results):
    data = json.loads(ok("profile", "diff", "last:native", "last:vm:tcg", "--json",
                         "--results", results))
    pair, = data["pairs"]
    assert pair["unit"] == "reads"
    rose = pair["rose"]
    # vm:tcg: 3 s of CPU for 60 reads; the unnamed generated code is half: 25,000 µs a read
    assert rose[0]["function"] == "[perf-4242.map]"
    assert rose[0]["added"] == pytest.approx(25000.0)
    assert [r["function"] for r in rose] == ["[perf-4242.map]", "tb_gen_code", "pwritev"]
    # native: 1 s for 600 reads; its functions did not rise, so they are not listed
    assert all(r["share_a"] == 0 for r in rose)


def test_a_run_without_profiles_says_why_in_one_line(tmp_path):
    path = str(tmp_path / "results")
    store = Store(path)
    run = store.new_run({}, {}, "test")
    store.add_rep(run, target="native", workload="fileio", params={}, phase="collect", idx=0,
                  status="unavailable", argv=["profile"], started=0.0,
                  error="profile: unavailable — perf is not installed")
    store.close()
    res = CliRunner().invoke(cli, ["profile", "last", "--results", path])
    assert res.exit_code != 0
    assert "no profile stored (native · fileio: profile: unavailable — perf is not" in str(
        res.exception or res.output)


def test_flame_graphs_are_self_contained_svg_coloured_by_change(results):
    run = Store(results, readonly=True).load_run("last")
    graphs = flamegraph.graphs(profile.run_cells(run)[0], "native",
                               {"native": "native", "vm:tcg": "vm:tcg"})
    assert [g.label.split(" · ")[0] for g in graphs] == ["native", "vm:tcg"]
    native, tcg = graphs
    assert native.diff_svg is None and tcg.baseline.startswith("native")
    for svg in (native.svg, tcg.diff_svg):
        assert svg.startswith("<svg") and "http" not in svg.replace(
            'xmlns="http://www.w3.org/2000/svg"', "")
        assert "Search" in svg and "<script>" in svg
    # every frame of the TCG guest is new against the bare host: all red, none blue
    fills = re.findall(r'fill="(rgb\([^)]*\))"', tcg.diff_svg)
    assert fills and all(f.startswith("rgb(255,") for f in fills)
    assert "tb_gen_code" in tcg.diff_svg and "change +30.00 pp" in tcg.diff_svg
    # a function both run is compared by name, whatever roots it runs under
    shares = flamegraph.name_shares({"a;x": 1, "b;x;y": 1, "c": 2})
    assert shares == {"a": 25.0, "b": 25.0, "x": 50.0, "y": 25.0, "c": 50.0}


def test_tree_sums_folded_stacks():
    root = flamegraph.tree({"a;b": 2, "a;c": 1, "d": 1})
    assert root.value == 4 and root.children["a"].value == 3
    assert root.children["a"].children["b"].value == 2


def test_profile_collectors_are_found_by_their_manifest():
    assert "profile" in profile.profile_collectors()


def test_the_html_report_has_both_flame_graphs_of_a_profiled_cell(results, tmp_path):
    out = tmp_path / "report.html"
    ok("report", "last", "--html", str(out), "--results", results)
    page = out.read_text()
    assert "Where the host&#39;s CPU time went" in page or "Where the host's CPU time went" in page
    assert page.count('class="flamegraph"') == 3      # two cells, one differential
    assert 'data-baseline="native · fileio' in page


def test_the_differential_graph_colours_by_cpu_time_added_per_unit_of_work(tmp_path):
    # issue 36: a frame whose share fell while the CPU it costs per unit of work grew was
    # drawn blue, contradicting `profile diff`. Native: 1 s for 600 reads, clone3 on 90% of
    # stacks (1,500 µs a read); the VM: 3 s for 60 reads, clone3 on 20% (10,000 µs a read).
    path = str(tmp_path / "results")
    store = Store(path)
    run = store.new_run({"name": "pair"}, {}, "test")
    store_cell(store, run, "native", [("sysbench", "sysbench;clone3", 90),
                                      ("sysbench", "sysbench;main", 10)], per_s=100.0, cpu=1.0)
    store_cell(store, run, "vm:tcg", [("vcpu", "CPU 0/TCG;clone3", 20),
                                      ("vcpu", "CPU 0/TCG;cpu_exec", 80)], per_s=10.0, cpu=3.0)
    store.finish_run(run, "done")
    store.close()
    loaded = Store(path, readonly=True).load_run("last")
    _, tcg = flamegraph.graphs(profile.run_cells(loaded)[0], "native", {})
    clone3 = re.search(r"<title>clone3 — [^<]*</title><rect [^>]*fill=\"(rgb\([^)]*\))\"",
                       tcg.diff_svg)
    assert clone3 and clone3.group(1).startswith("rgb(255,"), "clone3 drawn as less"
    assert "added +8.5e+03 µs" in tcg.diff_svg and "change -70.00 pp" in tcg.diff_svg
    assert "colour: CPU µs per read added against the baseline" in tcg.diff_svg
    assert (tcg.total_a, tcg.total_b) == pytest.approx((1666.67, 50000.0), rel=1e-3)


def test_diff_has_a_total_line_and_says_why_symbols_are_missing(results, tmp_path):
    text = ok("profile", "diff", "last:native", "last:vm:tcg", "--results", results)
    # native: 1 s for 600 reads; vm:tcg: 3 s for 60 reads
    assert "total CPU per read: A 1.67e+03 µs, B 5e+04 µs (+4.83e+04 µs, ×30)" in text
    data = json.loads(ok("profile", "diff", "last:native", "last:vm:tcg", "--json",
                         "--results", results))
    assert data["pairs"][0]["total_us_per_unit"]["b"] == pytest.approx(50000.0)
    cell = profile.CellProfile("r", "native", "cpu", {}, 100, [], [
        profile.Share("[sysbench]", 90, 90.0, "sysbench")], [], {}, 1.0, 95.9, 1.0, 10.0,
        "events")
    assert cell.symbols_note.startswith(
        "95.9% of samples have no symbol; it is in binaries Debian strips (most in "
        "sysbench): install their -dbgsym packages")
    assert "debuginfod" in cell.symbols_note
    # TCG's generated code has no symbol file to install: said apart
    cell.functions.append(profile.Share("[perf-PID.map]", 50, 50.0, "perf-PID.map"))
    assert "; 50.0% are code generated at run time (perf-PID.map" in cell.symbols_note
    assert "the rest is in binaries Debian strips (most in sysbench)" in cell.symbols_note
    cell.unresolved = 3.0
    assert cell.symbols_note is None


def test_the_symbols_note_advises_no_debug_symbols_that_are_installed():
    """A DSO whose debug symbols the collector found installed is not told to install
    them; the others still are."""
    cell = profile.CellProfile("r", "vm:tcg", "cpu", {}, 100, [], [
        profile.Share("[libc.so.6]", 40, 40.0, "libc.so.6"),
        profile.Share("[qemu-system-x86_64]", 30, 30.0, "qemu-system-x86_64")], [], {}, 1.0,
        70.0, 1.0, 10.0, "events", debug={"libc.so.6": True, "qemu-system-x86_64": False})
    note = cell.symbols_note
    assert "libc.so.6 has debug symbols installed where perf reads them" in note
    assert "the rest is in binaries Debian strips (most in qemu-system-x86_64): install" in note
    assert "libc.so.6" not in note.split("strips")[1]
    cell.debug["qemu-system-x86_64"] = True
    assert "-dbgsym" not in cell.symbols_note
    assert "libc.so.6, qemu-system-x86_64 have debug symbols installed" in cell.symbols_note


def test_the_collector_finds_debug_symbols_where_perf_reads_them(tmp_path):
    from vmtax.collectors import profile as collector

    listed = ("93ac61ec5a8eb1396f9fbd350e3169a558528a40 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
              "0123456789abcdef0123456789abcdef01234567 [kernel.kallsyms]\n"
              "fedcba9876543210fedcba9876543210fedcba98 /usr/bin/qemu-system-x86_64\n")
    pairs = collector.parse_buildids(listed)
    assert [path for _, path in pairs] == ["/usr/lib/x86_64-linux-gnu/libc.so.6",
                                           "/usr/bin/qemu-system-x86_64"]
    by_id = tmp_path / ".build-id" / "93" / "ac61ec5a8eb1396f9fbd350e3169a558528a40.debug"
    by_id.parent.mkdir(parents=True)
    by_id.write_bytes(b"\x7fELF")
    assert collector.debug_file(*reversed(pairs[0]), root=tmp_path) == by_id
    assert collector.debug_file(*reversed(pairs[1]), root=tmp_path) is None
    by_path = tmp_path / "usr" / "bin" / "qemu-system-x86_64.debug"
    by_path.parent.mkdir(parents=True)
    by_path.write_bytes(b"\x7fELF")
    assert collector.debug_file(*reversed(pairs[1]), root=tmp_path) == by_path
    # Only the DSOs of unresolved leaves are looked up, generated code never.
    found = collector.Profile()
    for frames in ([("[unknown]", "libc.so.6")], [("memcpy", "libfoo.so")],
                   [("[unknown]", "perf-PID.map")], [("[unknown]", "[unknown]")]):
        found.add("x", collector.Sample("p", 1, 1, 1, frames), 8)
    assert found.stripped() == {"libc.so.6"}


def test_the_reports_first_screen_puts_the_profiles_hypothesis_beside_the_share_kept(
        results, tmp_path):
    from vmtax.analysis.model import analyse
    from vmtax.report import html as htmlreport
    run = Store(results, readonly=True).load_run("last")
    page = htmlreport.render_html([htmlreport.build(analyse(run))])
    card = page[page.index('<div class="card" data-class="disk I/O"'):]
    card = card[:card.index('<p class="note">')]
    assert 'data-hypothesis="vm:tcg"' in card
    assert "perhaps code in anonymous executable memory" in card and "50.0%" in card
    # and the terminal's answer on one screen says it too
    import io

    from rich.console import Console

    from vmtax.report import terminal
    console = Console(file=io.StringIO(), width=200, color_system=None)
    terminal.print_headline(console, analyse(run))
    assert ("→ why vm:tcg, its profile suggests: perhaps code in anonymous executable memory"
            in console.file.getvalue())
