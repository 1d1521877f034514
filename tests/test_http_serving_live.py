"""serving end to end: the real server's endpoints, vegeta's latency against curl's, and
`vmtax run` natively and in a container (the VM's route is iperf3's, test_serving_live).
Needs the tools `make builds` builds (python -m vmtax.helpers.serving_tools) and ffmpeg."""

import hashlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from conftest import vmtax, wait_for

from vmtax.helpers import serving_tools
from vmtax.host import proc
from vmtax.workloads.serving import CURL_GAP, LOWER_BOUND, Serving

pytestmark = pytest.mark.live

MAX_BODY = 1 << 20


def _need_tools() -> None:
    if not serving_tools.built():
        pytest.skip("the serving tools are not built (make builds)")
    if shutil.which("ffmpeg") is None or shutil.which("curl") is None:
        pytest.skip("ffmpeg and curl are needed (apt-get install ffmpeg curl)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    """The server on the host, as the native target runs it, in a private directory."""
    _need_tools()
    port = _free_port()
    server = proc.spawn([str(serving_tools.httpd_path()), "-listen", f"127.0.0.1:{port}",
                         "-disk", str(tmp_path / "uploads"), "-max-body", str(MAX_BODY),
                         "-ffmpeg", shutil.which("ffmpeg")], cwd=str(tmp_path),
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    assert wait_for(lambda: _up(base), 20), "the server did not start"
    yield base, server, tmp_path
    proc.kill_group(server, grace=2.0)


def _up(base: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/health", timeout=1):
            return True
    except OSError:
        return False


def _request(base: str, path: str, body: bytes | None = None, **headers) -> tuple[int, bytes]:
    req = urllib.request.Request(base + path, data=body, headers=headers,
                                 method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=60) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_endpoints_of_the_real_server(server):
    base, srv, tmp_path = server
    status, first = _request(base, "/download/100000")
    assert status == 200 and len(first) == 100000
    assert _request(base, "/download/100000")[1] == first          # deterministic
    assert _request(base, "/download/300")[1] == first[:300]
    assert len(set(first[:4096])) > 200                             # not a constant fill
    body = os.urandom(300_000)
    for to in ("disk", "tmp", "discard"):
        status, answer = _request(base, f"/upload?to={to}", body)
        assert status == 200, answer
        assert json.loads(answer) == {"bytes": len(body), "to": to,
                                      "sha256": hashlib.sha256(body).hexdigest()}
    assert _request(base, "/upload?to=cloud", body)[0] == 400
    # Over the limit: 413 whether the length is announced or the body is chunked (curl:
    # it reads the answer even when the server stops reading the body).
    big = os.urandom(MAX_BODY + 1)
    for headers in ([], ["-H", "Transfer-Encoding: chunked"]):
        over = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                               *headers, "--data-binary", "@-", f"{base}/upload?to=disk"],
                              input=big, capture_output=True, timeout=60)
        assert over.stdout == b"413", headers
    status, video = _request(base, "/transcode", serving_tools.clip(1).read_bytes())
    assert status == 200 and len(video) > 1000
    (tmp_path / "out.mp4").write_bytes(video)
    probe = subprocess.run(["ffprobe", "-v", "error", "-show_entries",
                            "stream=codec_name,width,height", "-of", "json",
                            str(tmp_path / "out.mp4")], capture_output=True, text=True,
                           timeout=60)
    assert json.loads(probe.stdout)["streams"] == [
        {"codec_name": "h264", "width": 320, "height": 180}]
    assert _request(base, "/transcode", b"not a video")[0] == 422
    # Nothing left behind, by the server's count and on the disk.
    assert json.loads(_request(base, "/stored")[1]) == {"files": 0}
    assert list((tmp_path / "uploads").iterdir()) == []
    # Its own tmpfs directory goes with it.
    private = f"/dev/shm/vmtax-httpd-{srv.pid}"
    assert os.path.isdir(private)
    srv.send_signal(signal.SIGTERM)
    srv.wait(timeout=10)
    assert not os.path.exists(private)


def _driver(base: str, spec: dict) -> dict:
    spec = {"vegeta": str(serving_tools.vegeta_path()), "base": base, "factor": 1.0,
            "steps": 1, "min_success": 0.99, "p99_factor": 5.0, "p99_floor": 50.0,
            "p99_bound": None, "workers": 2, "requests": 4, "request_timeout": 30,
            "cross_check": 0, **spec}
    done = subprocess.run([sys.executable, "-m", "vmtax.helpers.serving_client", json.dumps(spec)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_p50_at_a_low_rate_agrees_with_curl_or_the_report_says_why(server):
    """The product's cross-check: vegeta's p50 at the lowest rate against curl timing the
    same requests one by one, on transcode (the server's work, ~0.2 s, dwarfs either
    client's own). Three driver runs interleave curl's samples with vegeta's, so that the
    load of other work on this shared host hits both alike; the flag the report shows on
    the capacity is computed from their medians, as for a stored run of three."""
    base, _, _ = server
    endpoint = {"name": "transcode", "method": "POST", "path": "/transcode",
                "body": str(serving_tools.clip(1)), "rates": [1.0]}
    reps = []
    for _ in range(3):
        report = _driver(base, {"mode": "rate", "endpoints": [endpoint], "duration": 3,
                                "cross_check": 3})
        step, = report["steps"]
        check, = report["cross_check"]
        assert step["requests"] == 3 and step["success"] == 1, step
        # three requests on the connection the first one opened
        assert len(check["samples"]) == 3 and check["reused"] == 3, check
        assert check["connect"] == 0 and check["p50"] > 0, check
        reps.append(Serving.make({}).parse(json.dumps(report)))
    vegeta = statistics.median(_value(r, "p50 latency[endpoint=transcode,rate=1]")
                               for r in reps)
    curl = statistics.median(_value(r, "curl p50 latency[endpoint=transcode]") for r in reps)
    flags = [f for f in Serving.cell_flags("requests/s[endpoint=transcode]", reps)
             if f.startswith(CURL_GAP)]
    if abs(vegeta - curl) <= 0.1 * curl:      # the bar
        assert flags == []
        return
    # Otherwise the report explains the gap with the medians it shows and a measured cause.
    flag, = flags
    assert f"({vegeta:.3g} vs {curl:.3g} ms at 1/s): " in flag, flag
    causes = flag.split(": ", 2)[2].split("; ")
    assert causes and all(c.startswith(CAUSES) for c in causes), flag


CAUSES = ("curl's connect ", "generator-bound step", "queueing: ", "host load: ",
          "noise: curl's samples spread ")


def _value(metrics, key: str) -> float:
    return next(m.value for m in metrics if m.key == key)


def test_workers_send_exactly_the_requests(server):
    base, _, _ = server
    report = _driver(base, {"mode": "workers", "duration": 1, "requests": 7, "endpoints": [
        {"name": "upload", "method": "POST", "path": "/upload?to=disk", "body_size": 1000,
         "rates": [1.0]}]})
    step, = report["steps"]
    assert step["requests"] == 7 and step["success"] == 1 and step["throughput"] > 0
    assert report["files_left"] == 0


PLAN = """
runs = 1
warmup = 0
time = 1
collect = ["generator"]

[targets.native]

[targets.container]
runtime = "runc"
cpus = [1]

[[workloads]]
name = "serving"

[workloads.params]
mode = ["rate", "workers"]
download_rates = [20.0]
upload_rates = [10.0]
transcode_rates = [1.0]
steps = 2
requests = 4
workers = 2
download_size = "64K"
upload_size = "64K"
clip_seconds = 1
cross_check = 2
"""


def test_run_native_and_container(tmp_path):
    _need_tools()
    plan = tmp_path / "serving.toml"
    plan.write_text(PLAN)
    run = vmtax("run", str(plan), "--results", str(tmp_path / "results"), "--json",
                timeout=400)
    assert run.returncode == 0, run.stderr
    rows = json.loads(run.stdout)["summary"]["rows"]

    def cells(metric: str, mode: str, **dims: str) -> dict:
        return next(r["cells"] for r in rows if r["metric"] == metric
                    and r["params"].get("mode") == mode and r["dimensions"] == dims)
    for target in ("native", "container"):
        for endpoint in ("download", "upload", "transcode"):
            # a capacity from the rate sweep, a rate from the workers
            assert cells("requests/s", "rate", endpoint=endpoint)[target]["n"] == 1
            assert cells("requests/s", "workers", endpoint=endpoint)[target]["summary"][
                "median"] > 0
        p99 = cells("p99 latency", "rate", endpoint="download", rate="20")[target]
        assert 0 < p99["summary"]["median"] < 10_000
        for mode in ("rate", "workers"):
            assert cells("files left", mode)[target]["summary"]["median"] == 0
            # the generator collector: vegeta and its driver ran, and used some CPU
            host = next(r["cells"][target] for r in rows if r["metric"] == "generator load"
                        and r["params"].get("mode") == mode)
            assert 0 < host["summary"]["median"] < 100 * os.cpu_count()
        for endpoint in ("download", "upload", "transcode"):
            capacity = cells("requests/s", "rate", endpoint=endpoint)[target]
            flags = capacity["flags"]
            found = cells("capacity found", "rate", endpoint=endpoint)[target]
            bound = LOWER_BOUND.format(capacity['summary']['median'])
            assert any(f.startswith(bound) for f in flags) == (
                found["summary"]["median"] == 0), flags
            gap = cells("curl gap", "rate", endpoint=endpoint)[target]["summary"]["median"]
            explained = [f for f in flags if f.startswith(CURL_GAP)]
            assert len(explained) == (abs(gap) > 10), (gap, flags)
    assert not list((tmp_path / "results").glob(".work-*"))
