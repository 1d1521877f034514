"""`fleet join` at an address that cannot be, or where nothing listens (issue #29,
defect 8)."""

from __future__ import annotations

import subprocess
import time

from torture_kit.env import Env, Outcome, check_output
from torture_kit.registry import Attack


def fleet_address_attack(env: Env, outcome: Outcome, quick: bool) -> None:
    """Defect 8: `fleet join` at an address that cannot be, or where nothing listens,
    fails in one line within 15 s. Only loopback is ever connected to."""
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]   # bound, never listening: refused
        addresses = ["999.1.1.1:1"] + ([] if quick else [
            f"127.0.0.1:{port}", "127.0.0.1:99999", "127.0.0.1", "[::1:1", "a b:1"])
        for address in addresses:
            outcome.cases += 1
            started = time.monotonic()
            try:
                done = env.run("fleet", "join", address, "--name", "h1", "--results",
                               str(env.work / "fleet-r"), timeout=30)
            except subprocess.TimeoutExpired:
                outcome.fail(f"fleet join {address}: silent for 30 s")
                continue
            took = time.monotonic() - started
            check_output(outcome, f"fleet join {address}", done.stderr)
            lines = done.stderr.strip().splitlines()
            if done.returncode != 2 or len(lines) != 1 or took > 15:
                outcome.fail(f"fleet join {address}: exit {done.returncode} after {took:.0f} "
                             f"s: {done.stderr.strip()[-200:]}")
            outcome.note(f"{took:.0f} s")


ATTACK = Attack(
    "fleet join at a bad address", "`vmtax fleet join ADDRESS`",
    "one line, exit 2, within 15 s; only loopback connected to", fleet_address_attack)
