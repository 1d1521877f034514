"""serving: its options, jobs, client driver's decisions, parser and figures (no server)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vmtax.analysis.stats import Summary
from vmtax.analysis.summary import Cell, Row, RunSummary
from vmtax.core.errors import ParseError, VmtaxError
from vmtax.core.types import Endpoint
from vmtax.core.workload import check_manifest
from vmtax.helpers import serving_client, serving_tools
from vmtax.report import plots
from vmtax.workloads.serving import PORT, Serving, size_bytes

FIXTURES = Path(__file__).parent / "fixtures" / "serving"


def fixture(name: str) -> str:
    return (FIXTURES / f"{name}.json").read_text()


def test_declares_two_roles_and_carries_its_server_and_ffmpeg():
    check_manifest(Serving)
    assert "ffmpeg" in Serving.binaries
    assert str(serving_tools.httpd_path()) in Serving.binaries
    w = Serving.make({"max_body": "2M", "download_size": "64K"}, time=3)
    server = w.server_job()
    assert server.argv[5] == str(serving_tools.httpd_path())
    assert server.in_scratch    # uploads to disk land on the target's scratch disk
    # The real shell line, with echo standing in for the server: it binds what the target
    # names (the bare host: loopback), else every address.
    echo = server.argv[:5] + ["echo"] + server.argv[6:]
    for env, listen in (({"VMTAX_LISTEN": "127.0.0.1"}, f"127.0.0.1:{PORT}"), ({}, f":{PORT}")):
        out = subprocess.run(echo, env={"PATH": os.environ["PATH"], **env},
                             capture_output=True, text=True, check=True).stdout.split()
        assert out == ["-disk", "uploads", "-max-body", str(2 << 20), "-max-download",
                       str(64 << 10), *server.argv[12:], "-listen", listen]
    # Its scratch files in the memory directory the target names (the bare host's is
    # journaled), else in one it makes in the target's /dev/shm.
    out = subprocess.run(echo, env={"PATH": os.environ["PATH"],
                                    "VMTAX_MEMORY_DIR": "/dev/shm/vmtax-serve-x y"},
                         capture_output=True, text=True, check=True).stdout
    assert out.endswith(" -tmp /dev/shm/vmtax-serve-x y -listen :18080\n")


def test_client_job_runs_the_driver_with_the_whole_spec():
    w = Serving.make({"endpoints": ["download", "upload"], "download_rates": [5.0, 10.0],
                      "upload_size": "4K", "upload_to": "tmp", "factor": 3.0, "steps": 4},
                     time=2)
    job = w.client_job(Endpoint("10.0.0.2", PORT))
    assert job.argv[:3] == [sys.executable, "-m", "vmtax.helpers.serving_client"]
    spec = json.loads(job.argv[3])
    assert spec["base"] == f"http://10.0.0.2:{PORT}" and spec["duration"] == 2
    assert spec["vegeta"] == str(serving_tools.vegeta_path())
    download, upload = spec["endpoints"]
    assert download == {"name": "download", "rates": [5.0, 10.0], "method": "GET",
                        "path": "/download/1048576"}
    assert upload["path"] == "/upload?to=tmp" and upload["body_size"] == 4096
    # download: 5, 10, 30, 90; upload: 50, 150, 450, 1350 -> 8 steps of 2 s, and beside
    # them the curl requests timed one at a time, which no step bounds (issue 48.14)
    assert w.run_seconds() == 16 + w.work_seconds() and w.work_seconds() > 0
    # and per endpoint 1 + 7 curl requests of the cross-check, each up to its timeout
    assert spec["cross_check"] == 7
    assert job.timeout == 8 * (2 + 30 + 30) + 60 + 2 * (8 * (30 + 1) + 30)
    workers = Serving.make({"mode": "workers"}).client_job(Endpoint("10.0.0.2", PORT))
    assert json.loads(workers.argv[3])["cross_check"] == 0


def test_workers_mode_has_no_fixed_length():
    """No time bounds the workers: a repetition is their requests' work, as estimated
    (issue 48.14), and twice the requests per worker take twice as long."""
    w = Serving.make({"mode": "workers", "workers": 4, "requests": 10})
    assert w.run_seconds() == w.work_seconds() > 0
    twice = Serving.make({"mode": "workers", "workers": 2, "requests": 10})
    assert twice.run_seconds() == pytest.approx(w.run_seconds() * 5 / 3)
    assert w.client_job(Endpoint("127.0.0.1", PORT)).timeout == 3 * (3 * 30 + 90)


@pytest.mark.parametrize("params, message", [
    ({"mode": "fast"}, "mode: expected one of"),
    ({"endpoints": []}, "endpoints"),
    ({"endpoints": ["upload", "stream"]}, "endpoints"),
    ({"download_rates": [0]}, "download_rates"),
    ({"upload_size": "2"}, 'expected a size like "2G"'),
    ({"upload_size": "128M"}, "upload_size: .*at most max_body"),
])
def test_bad_options_name_the_option(params, message):
    with pytest.raises(VmtaxError, match=message):
        Serving.make(params)


def test_sizes():
    assert size_bytes("64K") == 65536 and size_bytes("2m") == 2 << 20


def test_sweep_lists_then_multiplies():
    assert serving_client.sweep([10.0], 2.0, 4) == [10, 20, 40, 80]
    assert serving_client.sweep([1.0, 3.0], 2.0, 3) == [1, 3, 6]
    assert serving_client.sweep([1.0, 3.0], 1.0, 8) == [1, 3]     # factor 1: only the list


def test_rate_flag_is_a_whole_number_per_period():
    assert serving_client.rate_flag(50.0) == "50/1s"
    assert serving_client.rate_flag(0.25) == "250/1000s"


SPEC = {"min_success": 0.99, "p99_factor": 5.0, "p99_floor": 50.0, "p99_bound": None}


def _step(**kw):
    return {"success": 1.0, "p99": 10.0, "generator_bound": False, **kw}


def test_step_verdict():
    assert serving_client.step_verdict(_step(), None, SPEC) == ""
    assert "success 98.0% < 99%" in serving_client.step_verdict(_step(success=0.98), None, SPEC)
    assert "generator" in serving_client.step_verdict(_step(generator_bound=True), None, SPEC)
    # 5 × a 2 ms first p50 is 10 ms, but p99 up to the 50 ms floor is noise, not failure
    assert serving_client.step_verdict(_step(p99=49.0), 2.0, SPEC) == ""
    assert "p99 51 ms > 50 ms" in serving_client.step_verdict(_step(p99=51.0), 2.0, SPEC)
    # a slow endpoint: the factor decides
    assert serving_client.step_verdict(_step(p99=2400.0), 500.0, SPEC) == ""
    assert "> 2.5e+03 ms" in serving_client.step_verdict(_step(p99=2600.0), 500.0, SPEC)
    bound = {**SPEC, "p99_bound": 5.0}
    assert "p99 10 ms > 5 ms" in serving_client.step_verdict(_step(), None, bound)


def test_generator_bound():
    step = {"generator_cpu": 20.0, "requests": 100, "sent_rate": 99.0}
    assert not serving_client.generator_bound(step, 100.0, 1)
    assert serving_client.generator_bound({**step, "generator_cpu": 95.0}, 100.0, 1)
    assert not serving_client.generator_bound({**step, "generator_cpu": 95.0}, 100.0, 2)
    assert serving_client.generator_bound({**step, "sent_rate": 80.0}, 100.0, 1)
    # too few requests to tell a sending rate; workers mode has no offered rate
    assert not serving_client.generator_bound({**step, "requests": 3, "sent_rate": 1.0},
                                              100.0, 1)
    assert not serving_client.generator_bound({**step, "sent_rate": 1.0}, None, 1)


def test_parses_a_real_rate_sweep():
    report = json.loads(fixture("rate"))
    metrics = Serving.make({}).parse(fixture("rate"))
    by_key = {m.key: m for m in metrics}
    for name, rate in report["capacity"].items():
        assert by_key[f"requests/s[endpoint={name}]"].value == rate
    first = report["steps"][0]
    key = f"endpoint={first['endpoint']},rate={first['rate']:g}"
    assert by_key[f"p99 latency[{key}]"].value == pytest.approx(first["p99"])
    assert by_key[f"p99 latency[{key}]"].unit == "ms"
    assert by_key[f"success[{key}]"].value == pytest.approx(100 * first["success"])
    assert by_key[f"generator bound[{key}]"].value == float(first["generator_bound"])
    assert by_key["files left"].value == 0
    for name, found in report["limited"].items():
        assert by_key[f"capacity found[endpoint={name}]"].value == float(found)
    assert by_key[f"p99.9 latency[{key}]"].value == pytest.approx(first["p99.9"])
    assert by_key[f"host busy[{key}]"].value == pytest.approx(first["host_busy"])
    check = report["cross_check"][0]
    name = check["endpoint"]
    assert by_key[f"curl p50 latency[endpoint={name}]"].value == pytest.approx(check["p50"])
    assert by_key[f"curl connect[endpoint={name}]"].value == pytest.approx(check["connect"])
    lowest = min((s for s in report["steps"] if s["endpoint"] == name), key=lambda s: s["rate"])
    assert by_key[f"curl gap[endpoint={name}]"].value == pytest.approx(
        100 * (lowest["p50"] / check["p50"] - 1))
    assert by_key[f"curl set-up[endpoint={name}]"].value == pytest.approx(check["setup"])
    # every step's five latencies, success, host busy, rate, generator cpu and flag; per
    # endpoint its capacity, whether a step failed and six cross-check figures; what was left
    assert len(metrics) == (10 * len(report["steps"]) + 2 * len(report["capacity"])
                            + 6 * len(report["cross_check"]) + 1)


def test_parses_a_real_workers_run():
    report = json.loads(fixture("workers"))
    by_key = {m.key: m for m in Serving.make({"mode": "workers"}).parse(fixture("workers"))}
    for step in report["steps"]:
        assert by_key[f"requests/s[endpoint={step['endpoint']}]"].value == pytest.approx(
            step["throughput"])
        assert by_key[f"p50 latency[endpoint={step['endpoint']}]"].value == pytest.approx(
            step["p50"])


@pytest.mark.parametrize("text, message", [
    ("vegeta: oops", "printed no JSON"),
    ('{"steps": []}', "lacks 'capacity'"),
    ('{"steps": [], "capacity": {}, "limited": {}, "files_left": 0}', "measured no step"),
    ('{"steps": [{"endpoint": "upload"}], "capacity": {}, "limited": {}, "files_left": 0}',
     "lacks 'rate'"),
])
def test_parse_errors(text, message):
    with pytest.raises(ParseError, match=message):
        Serving.make({}).parse(text)


def test_latencies_are_exact_percentiles_of_every_request():
    """vegeta's own results of 120 requests (vegeta encode --to json): nearest-rank
    percentiles, where `vegeta report` (a t-digest, also behind -type=hdrplot) gives
    p90 1.152 and p99 3.902 ms, values no request had."""
    results = [json.loads(line) for line in (FIXTURES / "encoded.json").read_text().splitlines()]
    ms = sorted(r["latency"] / 1e6 for r in results)
    lat = serving_client.latencies(results)
    assert lat == {"p50": 0.755482, "p90": 1.129598, "p99": 3.841366, "p99.9": 4.043025,
                   "max": 4.043025}
    for name, q in serving_client.PERCENTILES.items():
        assert lat[name] in ms
        at_or_below = sum(v <= lat[name] for v in ms) / len(ms)
        assert at_or_below >= q and sum(v < lat[name] for v in ms) / len(ms) < q
    assert serving_client.quantile([1.0, 2.0], 0.5) == 1.0
    assert serving_client.quantile([3.0], 0.999) == 3.0
    with pytest.raises(VmtaxError, match="no request"):
        serving_client.latencies([])


def test_host_busy_from_proc_stat(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3\n")
    before = serving_client.host_busy(str(stat))
    assert before == (150, 1000)
    stat.write_text("cpu  200 0 100 850 50 0 0 0 0 0\n")
    assert serving_client.busy_share(before, serving_client.host_busy(str(stat))) == \
        pytest.approx(75.0)
    assert serving_client.busy_share(before, before) == 0.0


def test_curl_sends_what_vegeta_sends(tmp_path):
    upload = {"name": "upload", "method": "POST", "path": "/upload?to=disk",
              "rates": [5.0, 2.5]}
    argv = serving_client.curl_argv("/usr/bin/curl", upload, "http://h:1", tmp_path / "b",
                                    30, 4)
    # four requests on one connection, at the lowest rate, each to /dev/null
    assert argv[-4:] == ["http://h:1/upload?to=disk"] * 4
    assert argv.count("-o") == 4 and argv[argv.index("--rate") + 1] == "9000/h"
    assert argv[argv.index("-X") + 1] == "POST" and "Expect:" in argv
    assert argv[argv.index("--data-binary") + 1] == f"@{tmp_path / 'b'}"
    assert "%{time_connect} %{time_total}" in argv[argv.index("-w") + 1]
    get = serving_client.curl_argv("curl", {"method": "GET", "path": "/d/1", "rates": [0.25]},
                                   "http://h:1", None, 30, 2)
    assert "--data-binary" not in get
    assert get[get.index("--rate") + 1] == "3600/h"     # at least 1/s: the check stays short


GAP = {"rate": 1.0, "generator_bound": False, "step_busy": 50.0, "connect": 0.0,
       "spread": 5.0, "curl_busy": 50.0}


def test_explain_gap_names_what_was_measured():
    assert serving_client.explain_gap(vegeta_p50=105, curl_p50=100, **GAP) == []
    assert serving_client.explain_gap(vegeta_p50=91, curl_p50=100, **GAP) == []
    # curl's 2 ms connection set-up is the gap: without it, within 10%
    why, = serving_client.explain_gap(vegeta_p50=8.2, curl_p50=10, **{**GAP, "connect": 2.0})
    assert why == "curl's connect 2 ms, vegeta reuses connections: without it +2%"
    # a set-up that is only part of it
    assert serving_client.explain_gap(vegeta_p50=5, curl_p50=10, **{**GAP, "connect": 2.0})[
        0] == "curl's connect 2 ms"
    gb = serving_client.explain_gap(vegeta_p50=150, curl_p50=100,
                                    **{**GAP, "generator_bound": True})
    assert gb == ["generator-bound step"]
    # 5/s × 300 ms: 1.5 requests in flight queue at the server
    queued = serving_client.explain_gap(vegeta_p50=300, curl_p50=200, **{**GAP, "rate": 5.0})
    assert queued == ["queueing: 1.5 requests in flight"]
    loaded = serving_client.explain_gap(vegeta_p50=150, curl_p50=100,
                                        **{**GAP, "step_busy": 95.0})
    assert loaded == ["host load: 50% busy during curl, 95% in the step"]
    # nothing else measured: curl's own spread and the host's load are what is known
    noise, = serving_client.explain_gap(vegeta_p50=150, curl_p50=100, **GAP)
    assert noise == "noise: curl's samples spread 5%, host 50% busy"
    assert serving_client.gap(110, 100) == pytest.approx(10.0)


def test_capacity_flags_lower_bound_and_curl_gap():
    metrics = Serving.make({}).parse(fixture("rate"))
    report = json.loads(fixture("rate"))
    for name, found in report["limited"].items():
        flags = Serving.cell_flags(f"requests/s[endpoint={name}]", [metrics])
        bound = [f for f in flags if f.startswith("capacity is a lower bound")]
        assert bound == ([] if found else [f"capacity is a lower bound: ≥ "
                                           f"{report['capacity'][name]:g}/s, no step failed"])
    # download at 20/s: vegeta's p50 0.632 ms, curl's 0.585 ms: within 10%, no flag;
    # upload at 10/s: 5.17 ms against 12.1 ms, explained
    assert not any("curl" in f for f in Serving.cell_flags("requests/s[endpoint=download]",
                                                           [metrics]))
    flags = Serving.cell_flags("requests/s[endpoint=upload]", [metrics])
    assert flags == ["p50 differs from curl's by > 10%: -57% (5.17 vs 12.1 ms at 10/s): "
                     "noise: curl's samples spread 115%, host 100% busy"]
    # within 10%: no flag; other metrics never get one
    close = [m if m.key != "curl p50 latency[endpoint=transcode]" else
             type(m)(m.name, 400.0, m.unit, m.higher_is_better, m.dimensions) for m in metrics]
    assert not any("curl" in f for f in Serving.cell_flags(
        "requests/s[endpoint=transcode]", [close]))
    assert Serving.cell_flags("p99 latency[endpoint=transcode,rate=1]", [metrics]) == []


def test_a_build_is_published_whole(tmp_path, monkeypatch):
    monkeypatch.setenv("VMTAX_CACHE", str(tmp_path))
    (tmp_path / "serving" / ".build-killed").mkdir(parents=True)   # a killed build's
    target = tmp_path / "serving" / "tool-1" / "tool"

    def fails(scratch):
        (scratch / "tool").write_text("half")
        raise VmtaxError("compiler crashed")
    with pytest.raises(VmtaxError, match="compiler crashed"):
        serving_tools._publish(target, fails)
    assert not target.parent.exists()
    assert list((tmp_path / "serving").glob(".build-*")) == []
    serving_tools._publish(target, lambda scratch: (scratch / "tool").write_text("whole"))
    assert target.read_text() == "whole"
    serving_tools._publish(target, fails)     # built: not again


def test_server_path_follows_its_source(tmp_path, monkeypatch):
    monkeypatch.setenv("VMTAX_CACHE", str(tmp_path / "cache"))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.go").write_text("package main\n")
    monkeypatch.setattr(serving_tools, "SOURCE", tmp_path / "src")
    first = serving_tools.httpd_path()
    assert first.parent.parent == tmp_path / "cache" / "serving"
    (tmp_path / "src" / "main.go").write_text("package main // changed\n")
    assert serving_tools.httpd_path() != first
    assert not serving_tools.built()


# -- figures -----------------------------------------------------------------------------

def _cell(median: float, n: int = 3) -> Cell:
    return Cell(n=n, failed=0, summary=Summary(n, median, median * 0.9, median * 1.1,
                                               median, None, None, 0.95))


def _summary() -> RunSummary:
    rows = []
    for endpoint, rates, native_cap in (("download", (100, 200, 400), 200),
                                        ("transcode", (1, 2), 1)):
        for rate in rates:
            rows.append(Row("serving", {"mode": "rate"}, "p99 latency",
                            {"endpoint": endpoint, "rate": f"{rate:g}"}, "ms", False,
                            {"native": _cell(rate / 10), "vm": _cell(rate / 5)}))
        rows.append(Row("serving", {"mode": "rate"}, "requests/s", {"endpoint": endpoint},
                        "requests/s", True, {"native": _cell(native_cap),
                                             "vm": _cell(rates[0])}))
        rows.append(Row("serving", {"mode": "workers"}, "requests/s", {"endpoint": endpoint},
                        "requests/s", True, {"native": _cell(500), "vm": _cell(250)}))
    return RunSummary("r", "native", ["native", "vm"], rows, [])


def test_a_capacity_without_a_failed_step_is_marked_as_a_lower_bound():
    summary = _summary()
    # the vm's download sweep ran out of steps: its 100/s is a lower bound
    summary.rows.append(Row("serving", {"mode": "rate"}, "capacity found",
                            {"endpoint": "download"}, "flag", True,
                            {"native": _cell(1.0), "vm": _cell(0.0)}))
    chart = plots.charts(summary, {"native": "native", "vm": "vm"})[0]
    assert "lower bound" in chart.caption
    download = [ax for ax in chart.figure.axes if ax.get_title("left") == "download"][0]
    marks = {(float(line.get_xdata()[0]), line.get_marker()) for line in download.get_lines()
             if line.get_linestyle() == "None"}
    assert marks == {(200.0, "o"), (100.0, ">")}
    assert [t.get_text() for t in download.texts] == ["≥"]


def test_serving_figures_replace_the_generic_ones():
    charts = plots.charts(_summary(), {"native": "native", "vm": "vm"})
    slugs = [c.slug for c in charts]
    assert slugs == ["serving-p99-vs-rate-mode-rate", "serving-requests-mode-rate",
                     "serving-requests-mode-workers"]
    latency = charts[0].figure
    panels = [ax for ax in latency.axes if ax.get_title("left")]
    assert [ax.get_title("left") for ax in panels] == ["download", "transcode"]
    assert all(ax.get_yscale() == "log" and ax.get_xscale() == "log" for ax in panels)
    # per panel: a line per target and a ring at each target's capacity on it
    download = panels[0]
    rings = [line for line in download.get_lines() if line.get_linestyle() == "None"]
    assert sorted((float(r.get_xdata()[0]), float(r.get_ydata()[0])) for r in rings) == [
        (100.0, 20.0), (200.0, 20.0)]
    assert plots.render(charts[2], "png").startswith(b"\x89PNG")
