"""What publish's pages say (issue #45, defects 12, 13 and one of 17): a run's page
published while the run was interrupted, then the run resumed and finished, and the site
published again; the index's stylesheet; a name given twice."""

from __future__ import annotations

import re

from torture_kit.env import Env, Outcome, check_output
from torture_kit.registry import Attack
from torture_kit.stores import series_store


def _publish(env: Env, outcome: Outcome, what: str, *args: str) -> bool:
    outcome.cases += 1
    done = env.run("publish", *args, timeout=300)
    check_output(outcome, what, done.stderr)
    if done.returncode != 0:
        outcome.fail(f"{what}: exit {done.returncode}: {done.stderr.strip()[-200:]}")
    return done.returncode == 0


def stale_pages(env: Env, outcome: Outcome, quick: bool) -> None:
    from vmtax.core.types import Metric
    from vmtax.results.store import Store

    results = env.work / "stale-r"
    *_, last = series_store(results, "t", runs=3)
    store = Store(results)
    store.finish_run(last, "interrupted")          # as Ctrl-C leaves it
    store.close()
    site = env.work / "stale-site"
    page = site / "runs" / f"{last}.html"
    if not _publish(env, outcome, "publish of an interrupted run", "t", str(site),
                    "--results", str(results)):
        return
    if "badge interrupted" not in page.read_text():
        outcome.fail("the first publish did not show the run as interrupted")
    store = Store(results)                          # `vmtax run --resume` finishes it
    store.claim_run(last)
    store.reopen_run(last)
    for idx in range(3, 5):
        store.add_rep(last, target="native", workload="cpu", params={}, phase="measure",
                      idx=idx, status="ok", argv=["x"], started=9.0,
                      metrics=[Metric("events/s", 100.0 + idx, "events/s", True)])
    store.finish_run(last, "done")
    store.close()
    if not _publish(env, outcome, "publish of the run resumed", "t", str(site), "--results",
                    str(results)):
        return
    badges = re.findall(r"badge (\w+)", page.read_text())
    if "done" not in badges:
        outcome.fail("the page of a run published while interrupted still says "
                     f"{badges[:1]} after it finished")
    else:
        outcome.note("the page of the finished run written again")


def stylesheet(env: Env, outcome: Outcome, quick: bool) -> None:
    results = env.work / "style-r"
    series_store(results, "t", runs=2)
    site = env.work / "style-site"
    if not _publish(env, outcome, "publish", "t", str(site), "--results", str(results)):
        return
    style = re.search(r"<style>(.*?)</style>", (site / "index.html").read_text(), re.S)
    css = style[1] if style else ""
    if "{{" in css or "}}" in css or ".worse { color:" not in css:
        outcome.fail(f"the index's stylesheet is not CSS: {css[:120]!r}")
    else:
        outcome.note("worse and better coloured")


def name_twice(env: Env, outcome: Outcome, quick: bool) -> None:
    results = env.work / "twice-r"
    series_store(results, "t", runs=2)
    site = env.work / "twice-site"
    if not _publish(env, outcome, "publish t t", "t", "t", str(site), "--results",
                    str(results)):
        return
    sections = (site / "index.html").read_text().count('href="trends/t.html"')
    if sections != 1:
        outcome.fail(f"publish t t lists the series of t {sections} times")
    else:
        outcome.note("each name once")


ATTACKS = [
    Attack("a page of a run resumed since it was published (#45.12)",
           "`vmtax publish` after `run --resume` finished a run it showed interrupted",
           "the run's page is written again and says it is done", stale_pages),
    Attack("publish's index stylesheet (#45.13)", "the index.html publish writes",
           "its <style> is CSS (no doubled braces): worse and better are coloured",
           stylesheet),
    Attack("publish NAME NAME (#45.17)", "`vmtax publish t t DIR`",
           "the series of a name given twice is listed once", name_twice),
]
