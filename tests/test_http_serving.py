"""serving: its options, jobs, client driver's decisions, parser and figures (no server)."""

import json
import sys
from pathlib import Path

import pytest

from vmtax import plots, serving_client, serving_tools
from vmtax.analysis import Cell, Row, RunSummary
from vmtax.errors import ParseError, VmtaxError
from vmtax.stats import Summary
from vmtax.types import Endpoint
from vmtax.workloads.base import check_manifest
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
    assert server.argv[0] == str(serving_tools.httpd_path())
    assert server.argv[1:9] == ["-listen", f":{PORT}", "-disk", "uploads", "-max-body",
                                str(2 << 20), "-max-download", str(64 << 10)]
    assert server.in_scratch    # uploads to disk land on the target's scratch disk


def test_client_job_runs_the_driver_with_the_whole_spec():
    w = Serving.make({"endpoints": ["download", "upload"], "download_rates": [5.0, 10.0],
                      "upload_size": "4K", "upload_to": "tmp", "factor": 3.0, "steps": 4},
                     time=2)
    job = w.client_job(Endpoint("10.0.0.2", PORT))
    assert job.argv[:3] == [sys.executable, "-m", "vmtax.serving_client"]
    spec = json.loads(job.argv[3])
    assert spec["base"] == f"http://10.0.0.2:{PORT}" and spec["duration"] == 2
    assert spec["vegeta"] == str(serving_tools.vegeta_path())
    download, upload = spec["endpoints"]
    assert download == {"name": "download", "rates": [5.0, 10.0], "method": "GET",
                        "path": "/download/1048576"}
    assert upload["path"] == "/upload?to=tmp" and upload["body_size"] == 4096
    # download: 5, 10, 30, 90; upload: 50, 150, 450, 1350 -> 8 steps of 2 s
    assert w.run_seconds() == 16
    assert job.timeout == 8 * (2 + 30 + 30) + 60


def test_workers_mode_has_no_fixed_length():
    w = Serving.make({"mode": "workers", "workers": 4, "requests": 10})
    assert w.run_seconds() is None
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
    # every step's four latencies, success, rate, generator cpu and flag; per endpoint
    # its capacity and whether a step failed; what was left
    assert len(metrics) == 8 * len(report["steps"]) + 2 * len(report["capacity"]) + 1


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
