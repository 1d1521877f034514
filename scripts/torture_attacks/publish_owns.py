"""Publish owns only what it wrote (issue #45, defect 3): a DIR that holds a planted link
(its runs/ a link out of DIR), a user's own index.html, a planted page for a real run, a
page that is a device, a FIFO, a binary file or a directory, runs/ as a file, and a DIR
that cannot be written. Each is refused in one line, at once; nothing outside DIR, nor a
file publish did not write, is written or removed; a planted page is never linked."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Callable

from torture_kit.env import Env, Outcome, check_output
from torture_kit.registry import Attack
from torture_kit.stores import files, series_store


def _published(env: Env, results: Path, site: Path) -> bool:
    done = env.run("publish", "t", str(site), "--results", str(results), timeout=300)
    return done.returncode == 0


def _plants(victim: Path, ids: list[str]) -> dict[str, Callable[[Path], None]]:
    """What another user, or the user, left in a site before publish runs (by name)."""
    page = f"runs/{ids[-1]}.html"

    def link_out(site: Path) -> None:
        (site / "runs").rename(site / "runs-gone")
        (site / "runs").symlink_to(victim)

    def own_index(site: Path) -> None:
        site.mkdir()
        (site / "index.html").write_text("<p>the user's own page</p>\n")

    def planted_page(site: Path) -> None:
        # The page of a run the site has not shown yet (series_store adds it next).
        (site / "runs" / "PLANTED.html").write_text("<p>PLANTED</p>\n")

    def node(site: Path) -> None:
        (site / page).unlink()
        os.mknod(site / page, 0o666 | stat.S_IFCHR, os.makedev(1, 5))   # /dev/zero

    def fifo(site: Path) -> None:
        (site / page).unlink()
        os.mkfifo(site / page)

    def binary(site: Path) -> None:
        (site / page).write_bytes(bytes(range(256)) * 64)

    def directory(site: Path) -> None:
        (site / page).unlink()
        (site / page).mkdir()

    def runs_file(site: Path) -> None:
        site.mkdir()
        (site / "runs").write_text("a file\n")

    plants = {"runs/ a link out of DIR": link_out, "a user's own index.html": own_index,
              "a planted page of a real run": planted_page, "a page that is a FIFO": fifo,
              "a page that is a binary file": binary, "a page that is a directory": directory,
              "runs/ a file": runs_file}
    if os.geteuid() == 0:
        plants["a page that is /dev/zero"] = node
    return plants


def owns_only_its_own(env: Env, outcome: Outcome, quick: bool) -> None:
    results = env.work / "publish-owns-r"
    ids = series_store(results, "t", runs=2)
    victim = env.work / "publish-victim"
    victim.mkdir()
    (victim / "kept").write_text("kept\n")
    plants = _plants(victim, ids)
    if quick:
        plants = {k: v for k, v in plants.items() if k in (
            "runs/ a link out of DIR", "a user's own index.html", "a page that is a FIFO")}
    for n, (what, plant) in enumerate(plants.items()):
        site = env.work / f"publish-owns-{n}"
        if what not in ("a user's own index.html", "runs/ a file"):
            if not _published(env, results, site):
                outcome.fail(f"{what}: the first publish failed")
                continue
        plant(site)
        used = results
        if what == "a planted page of a real run":   # a run more, in a store of its own
            used = results.with_name("publish-owns-more")
            shutil.copytree(results, used)
            new = series_store(used, "t", runs=1)[0]
            (site / "runs" / "PLANTED.html").rename(site / "runs" / f"{new}.html")
        before_site, before_victim = files(site), files(victim)
        outcome.cases += 1
        try:
            done = env.run("publish", "t", str(site), "--results", str(used), timeout=60)
        except subprocess.TimeoutExpired:
            outcome.fail(f"publish with {what}: still running after 60 s")
            continue
        check_output(outcome, f"publish with {what}", done.stderr)
        lines = done.stderr.strip().splitlines()
        if done.returncode != 2 or len(lines) != 1:
            outcome.fail(f"publish with {what}: exit {done.returncode}, not one line: "
                         f"{done.stderr.strip()[-200:]}")
        if files(victim) != before_victim:
            outcome.fail(f"publish with {what}: wrote outside DIR, in {victim}")
        index = site / "index.html"
        if what == "a user's own index.html" and "the user's own" not in index.read_text():
            outcome.fail("publish replaced the user's own index.html")
        if what == "a planted page of a real run" and "PLANTED" in "".join(
                p.read_text() for p in (site / "runs").glob("*.html")) and done.returncode == 0:
            outcome.fail("publish kept and linked a planted page")
        if done.returncode == 2 and files(site) != before_site:
            outcome.fail(f"publish with {what}: refused, but changed DIR")
        outcome.note("refused in one line" if done.returncode == 2 else f"exit {done.returncode}")
    # A DIR on a filesystem that cannot be written.
    outcome.cases += 1
    (env.work / "publish-file").write_text("")
    done = env.run("publish", "t", str(env.work / "publish-file" / "site"), "--results",
                   str(results), timeout=60)
    check_output(outcome, "publish to a DIR under a file", done.stderr)
    if done.returncode != 2 or len(done.stderr.strip().splitlines()) != 1:
        outcome.fail(f"publish to a DIR under a file: exit {done.returncode}: "
                     f"{done.stderr.strip()[-200:]}")


ATTACK = Attack(
    "publish owns only what it wrote (#45.3)",
    "`vmtax publish NAME DIR` into a DIR others or the user filled",
    "refused in one line, at once; nothing outside DIR written; no file publish did not "
    "write replaced or linked", owns_only_its_own)
