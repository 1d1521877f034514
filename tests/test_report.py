"""HTML report, figures and the `report` command on a synthetic stored run."""

import re

import pytest
from conftest import vmtax
from matplotlib.collections import PathCollection
from PIL import Image

from vmtax.analysis.model import analyse
from vmtax.analysis import composite
from vmtax.analysis import summary as analysis
from vmtax.core.workload import Metric
from vmtax.report import parts
from vmtax.report import html as htmlreport
from vmtax.report import plots
from vmtax.report import terminal as report
from vmtax.results.store import Run, Store

TARGETS = {"native": {"kind": "native", "bare_host": True, "kernel": "6.1.0"},
           "container": {"kind": "container", "bare_host": False, "runtime": "crun",
                         "namespaces": ["pid", "net"]},
           "vm": {"kind": "vm", "bare_host": False, "accel": "kvm", "qemu": {"version": "7.2.0"}}}
# Share of native each target keeps per workload metric (throughput; latency gets 1/x).
KEEPS = {"container": 0.97, "vm": 0.6}
BLOCKS = ["16K", "1M", "64M", "1G"]
# Enough runs a side for a 95% interval to flag a target faster than native (4 vs 4).
RUNS = 4


def _metrics(target, workload, idx, block=None):
    keep = KEEPS.get(target, 1.0)
    wiggle = 1 + 0.004 * (idx % 3 - 1)
    if workload == "cpu":
        lat_max = 0.7 / keep * (1 + (0.5 * idx if target == "vm" else 0))   # noisy on vm
        return [Metric("events/s", 48000 * keep * wiggle, "events/s", True),
                Metric("latency avg", 0.021 / keep * wiggle, "ms", False),
                Metric("latency max", lat_max, "ms", False)]
    if workload == "fileio":
        # the container "beats" native: page cache, a finding the report must flag
        keep = {"container": 1.3, "vm": 0.06}.get(target, 1.0)
        return [Metric("reads/s", 3000 * keep * wiggle, "reads/s", True),
                Metric("writes/s", 2000 * keep * wiggle, "writes/s", True)]
    size = plots.numeric(block)
    return [Metric("MiB/s", 9000 * keep * wiggle * (1 + size / 2**30), "MiB/s", True)]


def make_run(results, *, all_failed=False):
    """native/container/vm × cpu, fileio and a memory block-size sweep, RUNS runs each,
    plus one failed vm cpu repetition."""
    store = Store(results)
    run_id = store.new_run({"targets": [{"name": t} for t in TARGETS], "baseline": "native",
                            "runs": RUNS, "warmup": 0, "time": 1},
                           {"cpu_model": "Synthetic CPU", "cores": 2, "kernel": "6.1.0"}, "0.1.0")
    for name, fp in TARGETS.items():
        store.set_target(run_id, name, fp["kind"], fp)
    configs = [("cpu", {"cpu-max-prime": 2000}, None),
               ("fileio", {"file-test-mode": "rndrw"}, None)]
    configs += [("memory", {"memory-block-size": b}, b) for b in BLOCKS]
    for workload, params, block in configs:
        for target in TARGETS:
            for idx in range(RUNS):
                ok = not all_failed
                store.add_rep(run_id, target=target, workload=workload, params=params,
                              phase="measure", idx=idx, status="ok" if ok else "failed",
                              error=None if ok else "exit status 1", argv=["sysbench"],
                              started=float(idx), host_elapsed=1.0, guest_elapsed=1.0,
                              metrics=_metrics(target, workload, idx, block) if ok else [])
    store.add_rep(run_id, target="vm", workload="cpu", params={"cpu-max-prime": 2000},
                  phase="measure", idx=RUNS, status="failed", error="exit status 1",
                  argv=["sysbench"], started=float(RUNS + 1))
    store.finish_run(run_id, "done")
    return store, run_id


@pytest.fixture
def run(tmp_path):
    store, run_id = make_run(tmp_path / "results")
    return store.load_run(run_id)


def test_findings_name_the_best_target_per_class_and_every_flag(run):
    summary = analysis.summarize_run(run)
    f = htmlreport.findings(analyse(run))
    # the classes of the composite index: cpu's latencies are no primary metric
    assert list(f.classes) == ["CPU", "memory", "disk I/O"]
    assert [s.target for s in f.classes["CPU"]] == ["container", "vm"]
    assert f.classes["CPU"][0].keeps == pytest.approx(0.97, abs=0.01)
    assert f.classes["disk I/O"][0].target == "container"
    assert f.classes["disk I/O"][1].keeps == pytest.approx(0.06, abs=0.01)
    # the worst metric is a disk rate for vm, a latency for the container
    assert f.worst["vm"][0].workload == "fileio"
    kinds = {(fl.kind, fl.target, fl.row.workload) for fl in f.flags}
    assert ("faster than baseline", "container", "fileio") in kinds
    # vm's noisy latency max is no primary metric: the terminal's count leaves it out too
    assert ("noisy", "vm", "cpu") not in kinds
    assert len(f.flags) == sum(parts.flag_counts(analysis.headline(summary.rows)).values())
    assert f.failures == [{"target": "vm", "workload": "cpu", "phase": "measure",
                           "status": "failed", "error": "exit status 1", "count": 1}]


def test_the_cards_give_the_composite_tables_figure(run):
    """One class, one figure: a card's share is the composite index, not another mean."""
    summary = analysis.summarize_run(run)
    indices = {ci.cls: ci.by_target for ci in composite.composite(summary)}
    cards = htmlreport.findings(analyse(run)).classes
    assert cards and all(s.keeps == indices[cls][s.target].value
                         for cls, standings in cards.items() for s in standings)
    html = htmlreport.render_html([htmlreport.build(analyse(run))])
    card = html[html.index('data-class="disk I/O" data-best='):]
    disk = indices["disk I/O"]["vm"].value
    assert f'<span class="val">{htmlreport.pct(disk)}</span>' in card[:card.index('class="rec"')]


def test_figures_cover_each_workload_and_the_sweep(run):
    summary = analysis.summarize_run(run)
    charts = plots.charts(summary, {t: t for t in summary.targets})
    slugs = [c.slug for c in charts]
    assert slugs == ["cpu-ratio", "fileio-ratio", "cpu-repetitions", "fileio-repetitions",
                     "memory-mib-s-vs-memory-block-size"]
    # the baseline is a dashed line at 1, not a bar in every group: bars of 2 targets
    bars = charts[0].figure.axes[0]
    assert len(bars.patches) == 2 * 3          # container, vm × events/s, latency avg, max
    assert any(line.get_label() == "native = 1" for line in bars.get_lines())
    # every repetition, one strip per target
    strips = charts[2].figure.axes[0]
    dots = [c for c in strips.collections if isinstance(c, PathCollection)]
    assert [len(c.get_offsets()) for c in dots] == [RUNS, RUNS, RUNS]
    sweep = charts[-1].figure.axes[0]
    assert sweep.get_xscale() == "log"         # 16K .. 1G spans five decades
    assert [t.get_text() for t in sweep.get_xticklabels()] == BLOCKS
    assert len(sweep.get_lines()) == 3         # one per target


def test_html_is_self_contained_and_shows_everything(run):
    html = htmlreport.render_html([htmlreport.build(analyse(run))])
    for target in TARGETS:
        assert f'data-fingerprint="{target}"' in html
    assert "crun" in html and "Synthetic CPU" in html and "qemu.version" in html
    svgs = re.findall(r"<svg\b.*?</svg>", html, re.DOTALL)
    assert len(svgs) == 5 and all("<path" in s for s in svgs)
    assert not re.search(r"https?://|<script|<link|@import|url\((?!#)", html)
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids)), "figures share element ids"
    assert re.search(r'data-class="CPU" data-best="container"', html)
    assert re.search(r'data-class="disk I/O" data-best="container"', html)
    assert 'data-flag="faster than baseline"' in html
    # a noisy secondary metric is flagged in the table of every metric, not counted above
    assert 'data-flag="noisy"' not in html and "⚠ noisy" in html
    assert "exit status 1" in html
    summary = analysis.summarize_run(run)
    medians = re.findall(r'data-median="([^"]+)"', html)
    cells = [c for r in summary.rows for c in r.cells.values()]
    assert len(medians) == sum(c.summary is not None for c in cells)


def test_report_cli_writes_html_png_and_svg(tmp_path):
    _, run_id = make_run(tmp_path / "results")
    out = vmtax("report", run_id, "--html", str(tmp_path / "r.html"),
                "--png", str(tmp_path / "png"), "--svg", str(tmp_path / "svg"),
                "--results", str(tmp_path / "results"))
    assert out.returncode == 0, out.stderr
    assert "<svg" in (tmp_path / "r.html").read_text()
    pngs = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert pngs == [f"{run_id}-{s}.png" for s in
                    ("cpu-ratio", "cpu-repetitions", "fileio-ratio", "fileio-repetitions",
                     "memory-mib-s-vs-memory-block-size")]
    for name in pngs:
        with Image.open(tmp_path / "png" / name) as img:
            assert img.format == "PNG"
            size = (plots.SWEEP_SIZE if "-vs-" in name else (5.2, 3.4) if "repetitions" in name
                    else plots.BAR_SIZE)
            assert img.size == (round(size[0] * plots.DPI), round(size[1] * plots.DPI))
    svgs = list((tmp_path / "svg").iterdir())
    assert len(svgs) == 5 and all(p.read_text().lstrip().startswith("<?xml") for p in svgs)
    assert not [p for p in tmp_path.rglob(".*.tmp")]


def test_two_runs_in_one_report(tmp_path):
    _, first = make_run(tmp_path / "results")
    _, second = make_run(tmp_path / "results")
    out = vmtax("report", first, second, "--html", str(tmp_path / "r.html"),
                "--results", str(tmp_path / "results"))
    assert out.returncode == 0, out.stderr
    html = (tmp_path / "r.html").read_text()
    assert f'id="run-{first}"' in html and f'id="run-{second}"' in html
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case, message", [
    ("unknown", r"unknown run id 'nope'"),
    ("empty", r"run \S+ has no successful repetitions \(73 failed\)"),
    ("unwritable", r"cannot write .*missing/r\.html: No such file or directory"),
    ("directory", r"cannot write .*: it is a directory; expected a file"),
])
def test_bad_input_is_one_line_and_leaves_no_file(tmp_path, case, message):
    _, run_id = make_run(tmp_path / "results", all_failed=case == "empty")
    target = {"unwritable": tmp_path / "missing" / "r.html", "directory": tmp_path}.get(
        case, tmp_path / "r.html")
    out = vmtax("report", "nope" if case == "unknown" else run_id, "--html", str(target),
                "--png", str(tmp_path / "png"), "--results", str(tmp_path / "results"))
    assert out.returncode == 2
    assert re.fullmatch(rf"vmtax: error: {message}.*\n", out.stderr), out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "r.html").exists()
    assert not list(tmp_path.rglob("*.png")) and not list(tmp_path.rglob(".*.tmp"))


@pytest.mark.parametrize("fingerprint, label", [
    ({"kind": "vm", "accel": "tcg"}, "vm (tcg)"),
    # An ssh target: the plan's label beside the hypervisor its fingerprint found.
    ({"kind": "ssh", "label": "xen-pv", "hypervisor": "xen (PV)"}, "vm (xen-pv, xen (PV))"),
    ({"kind": "ssh", "label": None, "hypervisor": "qemu"}, "vm (qemu)"),
    ({"kind": "ssh", "label": "qemu", "hypervisor": "qemu"}, "vm (qemu)"),
    ({"kind": "ssh", "label": "vm", "hypervisor": "none"}, "vm (none)"),
    ({"kind": "native"}, "vm"),
])
def test_table_labels_a_target_by_what_its_fingerprint_says(fingerprint, label):
    run = Run(id="r", created=0.0, finished=None, status="done", plan={}, host={},
              version="0", targets={"vm": {"kind": fingerprint["kind"],
                                           "fingerprint": fingerprint}}, reps=[])
    assert parts.target_label(run, "vm") == label


def test_flags_line_counts_a_detailed_flag_by_its_kind():
    """Flags that carry their own numbers ("KIND: detail") collapse to one count per kind."""
    cells = {t: analysis.Cell(1, 0, flags=flags) for t, flags in {
        "a": ["noisy", "capacity is a lower bound: ≥ 40/s, no step failed"],
        "b": ["capacity is a lower bound: ≥ 1/s, no step failed"],
        "c": ["p50 differs from curl's by > 10%: -57% (5.17 vs 12.1 ms at 10/s): noise"]}.items()}
    row = analysis.Row("serving", {}, "requests/s", {}, "requests/s", True, cells)
    assert parts.flags_line([row]) == ("⚠ primary metrics: 2 cells capacity is a lower "
                                        "bound, 1 cell noisy "
                                        "(CV > 5%), 1 cell p50 differs from curl's by > 10%")


def test_ratios_keep_their_line_unless_the_names_would_be_cut():
    """At 80 columns E1's table keeps "0.992 [0.98–1.0]" on one line; a table too wide for
    that puts intervals under ratios (no word or number is ever cut)."""
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    def table(ratio: str) -> Table:
        t = Table()
        for name in ("workload", "metric", "native", "vm"):
            t.add_column(name, no_wrap=name in ("native", "vm"))
        t.add_row("dd mode=buffered", "↑ throughput (MB/s)", "827.1", ratio)
        return t

    console = Console(width=64, file=StringIO())
    assert report.fits(console, table("0.05 [0.01–0.07]"))
    assert not report.fits(console, table("0.0507 [0.003–0.07] " * 3))


def test_a_card_claims_no_win_its_own_verdict_denies(tmp_path):
    """Issue 48.7: a noisy 6-run cell whose interval [0.94, 1.41] holds 1 made a green
    card, "118% of native's performance kept by container:runc", beside "no significant
    difference". The card now shows the interval, claims neither win nor loss, and says
    the two were not told apart."""
    store = Store(tmp_path)
    run_id = store.new_run({"targets": [{"name": t} for t in ("native", "container")],
                            "baseline": "native", "runs": 6, "warmup": 0, "time": 1},
                           {"cpu_model": "Synthetic CPU"}, "0.1.0")
    for name in ("native", "container"):
        store.set_target(run_id, name, TARGETS[name]["kind"], TARGETS[name])
    container = [0.9, 1.45, 1.0, 1.35, 1.1, 1.3]
    for idx in range(6):
        for target, keep in (("native", 1 + 0.002 * idx), ("container", container[idx])):
            store.add_rep(run_id, target=target, workload="cpu", params={}, phase="measure",
                          idx=idx, status="ok", argv=["sysbench"], started=float(idx),
                          host_elapsed=1.0, guest_elapsed=1.0,
                          metrics=[Metric("events/s", 48000 * keep, "events/s", True)])
    store.finish_run(run_id, "done")
    model = analyse(store.load_run(run_id))
    [top] = model.standings["CPU"]
    assert top.keeps > 1.1 and top.index.ci_low < 1 < top.index.ci_high
    assert "not told apart: too noisy to tell" in model.classes[0].recommendation
    html = htmlreport.render_html([htmlreport.build(model)])
    card = html[html.index('data-class="CPU" data-best='):]
    card = card[:card.index('class="rec"')]
    big = re.search(r'<div class="big([^"]*)">([^<]*)<span class="ci">([^<]*)</span>', card)
    assert big and big.group(1) == "" and big.group(2).startswith(htmlreport.pct(top.keeps))
    assert re.fullmatch(r"\[\d+(\.\d+)?%–\d+(\.\d+)?%\]", big.group(3)), big.group(3)
    assert "not told apart from native: its 95% CI holds 100%" in card


def test_too_noisy_to_tell_is_not_called_no_difference():
    """Issue 48.8: a ratio ranging from 0.31 to 1.5 (CV 40%, 3 runs) was called "no
    significant difference": it cannot rule out a difference a user cares about. Only an
    interval within ±5% (composite.WIDE) says there is none."""
    native = composite.Index(1.0, 1.0, 1.0, interval="none")
    noisy = {"native": native, "container": composite.Index(0.9, 0.31, 1.5, interval="range")}
    assert composite.recommend("CPU", noisy, "native") == (
        "CPU: not told apart: too noisy to tell (±66%)")
    tight = {"native": native, "container": composite.Index(0.99, 0.98, 1.01)}
    assert composite.recommend("CPU", tight, "native") == "CPU: no significant difference"
    with_loser = {**noisy, "vm": composite.Index(0.1, 0.09, 0.11)}
    assert composite.recommend("CPU", with_loser, "native") == (
        "CPU: not told apart between native and container: too noisy to tell (±66%); "
        "vm keeps 0.100 of native")


def test_workload_parameters_are_shown_wherever_runs_are_set_side_by_side(tmp_path):
    """Issue 48.10: cpu-max-prime, block sizes and threads appeared in no report; an A/B
    report showed -77.6% with nothing saying a parameter had changed."""
    results = tmp_path / "results"
    store = Store(results)
    ids = []
    for prime, level in ((2000, 1.0), (20000, 0.224)):
        run_id = store.new_run({"targets": [{"name": "native"}], "baseline": "native",
                                "runs": 3, "warmup": 0, "time": 1},
                               {"cpu_model": "Synthetic CPU"}, "0.1.0")
        store.set_target(run_id, "native", "native", TARGETS["native"])
        for idx in range(3):
            store.add_rep(run_id, target="native", workload="cpu",
                          params={"cpu-max-prime": prime, "threads": 1}, phase="measure",
                          idx=idx, status="ok", argv=["sysbench"], started=float(idx),
                          host_elapsed=1.0, metrics=[Metric("events/s", 48000 * level *
                                                            (1 + idx / 100), "events/s", True)])
        store.finish_run(run_id, "done")
        ids.append(run_id)
    store.close()
    shown = vmtax("show", ids[0], "--all", "--results", str(results), check=True).stdout
    assert "workload parameters" in shown and "cpu: cpu-max-prime=2000 threads=1" in shown
    page = tmp_path / "ab.html"
    vmtax("report", ids[0], ids[1], "--html", str(page), "--results", str(results), check=True)
    html = page.read_text()
    assert "B ran with other parameters than A: cpu: cpu-max-prime 2000 → 20000." in html
    assert "<strong>cpu</strong> cpu-max-prime=20000 threads=1" in html
