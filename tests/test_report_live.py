"""A real run's HTML report, opened in headless Chromium.

Chromium is driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON
messages ending in NUL on fds 3 and 4), not by scraping its stderr or --dump-dom:
  * console errors, uncaught exceptions and every request the page makes arrive as
    protocol events, so "none" is an observed fact, not the absence of a log line
    (Chromium's stderr carries unrelated noise such as D-Bus errors in containers);
  * the checks read the rendered DOM (sizes of the SVG charts, table text);
  * a pipe needs no free TCP port (tests run in parallel here) and no websocket
    package: the standard library is enough.
"""

import base64
import json
import os
import select
import shutil
import signal
import time

import pytest
from conftest import ROOT, vmtax

from vmtax.report.terminal import fmt

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(os.geteuid() != 0, reason="the container target needs root"),
    pytest.mark.skipif(shutil.which("chromium") is None,
                       reason="chromium is not installed (scripts/bootstrap.sh installs it)"),
]

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--hide-scrollbars", "--window-size=1200,900",
                  "--remote-debugging-pipe"]
ARTIFACT = ROOT / "test-artifacts" / "report.png"

# What the checks need from the rendered page, read in the page itself.
PAGE_FACTS = """(() => {
  const box = el => { const r = el.getBoundingClientRect(); return [r.width, r.height]; };
  return {
    figures: [...document.querySelectorAll("figure")].map(f => {
      const svg = f.querySelector("svg");
      return svg && {size: box(svg), drawn: box(svg.querySelector("g")),
                     paths: svg.querySelectorAll("path, use").length};
    }),
    medians: [...document.querySelectorAll("table.summary tr[data-row] span.median")].map(m => ({
      row: Number(m.closest("tr").dataset.row), target: m.closest("td").dataset.target,
      value: Number(m.dataset.median), text: m.textContent.trim()})),
    findings: [...document.querySelectorAll(".card[data-class]")].map(c => c.dataset.class),
  };
})()"""


class DevTools:
    """A minimal DevTools protocol client over Chromium's debugging pipe."""

    def __init__(self, profile, timeout=30):
        to_browser, self._write = os.pipe()
        self._read, from_browser = os.pipe()
        # posix_spawn, not Popen: Popen's preexec_fn runs before close_fds, which would
        # close the pipe ends it had just put on fds 3 and 4.
        devnull = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
        self.pid = os.posix_spawn(
            shutil.which("chromium"), ["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}"],
            os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, to_browser, 3),
                                      (os.POSIX_SPAWN_DUP2, from_browser, 4), *devnull])
        os.close(to_browser)
        os.close(from_browser)
        self.deadline = time.monotonic() + timeout
        self.events = []
        self._buffer = b""
        self._next_id = 0

    def _receive(self):
        while b"\0" not in self._buffer:
            left = self.deadline - time.monotonic()
            assert left > 0 and select.select([self._read], [], [], left)[0], "Chromium timed out"
            chunk = os.read(self._read, 1 << 20)
            assert chunk, "Chromium closed the debugging pipe"
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method, session=None, **params):
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._receive()
            if reply.get("id") == self._next_id:
                assert "error" not in reply, f"{method}: {reply['error']}"
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method):
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._receive())

    def close(self):
        try:
            self.call("Browser.close")
        except (AssertionError, OSError):
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self._read)
        os.close(self._write)


def test_report_of_a_real_run_renders_cleanly_in_chromium(tmp_path):
    results = str(tmp_path / "results")
    ran = vmtax("run", "--targets", "native,container:unshare", "--workloads", "cpu,memory",
                "--runs", "3", "--warmup", "0", "--time", "1", "--results", results, timeout=120)
    assert ran.returncode == 0, ran.stderr
    shown = json.loads(vmtax("show", "last", "--json", "--results", results, check=True).stdout)
    page = tmp_path / "report.html"
    made = vmtax("report", "last", "--html", str(page), "--results", results)
    assert made.returncode == 0, made.stderr

    browser = DevTools(tmp_path / "profile")
    try:
        target = browser.call("Target.createTarget", url="about:blank")["targetId"]
        session = browser.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            browser.call(f"{domain}.enable", session)
        url = page.as_uri()
        browser.call("Page.navigate", session, url=url)
        browser.wait_for("Page.loadEventFired")
        facts = browser.call("Runtime.evaluate", session, expression=PAGE_FACTS,
                             returnByValue=True)["result"]["value"]
        width, height = (browser.call("Page.getLayoutMetrics", session)["cssContentSize"][k]
                         for k in ("width", "height"))
        shot = browser.call("Page.captureScreenshot", session, format="png",
                            captureBeyondViewport=True,
                            clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1})
        ARTIFACT.parent.mkdir(exist_ok=True)
        ARTIFACT.write_bytes(base64.b64decode(shot["data"]))
    finally:
        browser.close()

    events = [e for e in browser.events if e.get("sessionId") == session]
    errors = [e["params"] for e in events
              if e["method"] == "Runtime.exceptionThrown"
              or (e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] == "error")
              or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]
    assert errors == []
    requests = [e["params"]["request"]["url"] for e in events
                if e["method"] == "Network.requestWillBeSent"]
    assert set(requests) == {url}, "the page loaded something besides itself"

    # per workload a bar chart and a strip of every repetition, each a drawn SVG
    assert len(facts["figures"]) == 4
    for figure in facts["figures"]:
        assert figure is not None, "a figure without an SVG"
        assert min(figure["size"]) > 100 and min(figure["drawn"]) > 100 and figure["paths"] > 20

    # the table shows exactly the medians `vmtax show --json` gives
    expected = {(i, t): c["summary"]["median"]
                for i, row in enumerate(shown["summary"]["rows"])
                for t, c in row["cells"].items() if c["summary"]}
    shown_in_page = {(m["row"], m["target"]): m for m in facts["medians"]}
    assert shown_in_page.keys() == expected.keys()
    for key, median in expected.items():
        assert shown_in_page[key]["value"] == median
        assert shown_in_page[key]["text"] == fmt(median)
    assert "CPU" in facts["findings"] and "memory" in facts["findings"]
