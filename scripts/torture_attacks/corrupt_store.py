"""Corrupt results databases (issue #16): a garbage header or page, truncated, empty,
zeros, a directory; `runs`, `show` and `run` on each."""

from __future__ import annotations

from torture_kit.env import Env, Outcome, check_output
from torture_kit.registry import Attack


def store_attack(env: Env, outcome: Outcome, count: int) -> None:
    from vmtax.core.types import Metric
    from vmtax.results.store import DB_NAME, Store

    template = env.work / "db-template"
    store = Store(template)
    run_id = store.new_run({"targets": [], "workloads": []}, {}, "0")
    for i in range(200):
        store.add_rep(run_id, target="native", workload="cpu", params={}, phase="measure",
                      idx=i, status="ok", argv=["x"], started=1.0, stdout="x" * 300,
                      metrics=[Metric("events/s", 1.0, "events/s", True)])
    store.finish_run(run_id, "done")
    store.close()
    good = (template / DB_NAME).read_bytes()
    kinds = ["garbage header", "truncated", "garbage page", "empty", "zeros", "a directory"]
    for i in range(count):
        how = kinds[i % len(kinds)]
        results = env.work / f"db-{i}"
        results.mkdir()
        db = results / DB_NAME
        data = bytearray(good)
        if how == "garbage header":
            data[:env.rng.randint(1, 100)] = env.rng.randbytes(100)
        elif how == "truncated":
            data = data[:env.rng.randint(1, len(data) - 1)]
        elif how == "garbage page":
            at = env.rng.randrange(1, len(data) // 4096) * 4096
            data[at:at + 4096] = env.rng.randbytes(4096)
        elif how == "empty":
            data = bytearray()
        elif how == "zeros":
            data = bytearray(len(data))
        if how == "a directory":
            db.mkdir()
        else:
            db.write_bytes(bytes(data))
        for j, command in enumerate((["runs"], ["show", "last"], [
                "run", "--targets", "native", "--workloads", "cpu", "--runs", "1",
                "--warmup", "0", "--time", "1"])):
            # Each command starts a Python (seconds here): some of them on each database.
            if (i - j) % (3 if count > 3 else 2):
                continue
            done = env.run(*command, "--results", str(results), timeout=300)
            outcome.cases += 1
            check_output(outcome, f"vmtax {command[0]} on {how}", done.stderr)
            lines = done.stderr.strip().splitlines()
            if done.returncode != 0 and len(lines) != 1:
                outcome.fail(f"vmtax {command[0]} on {how}: {len(lines)} lines of error")
            outcome.note(f"exit {done.returncode}")


ATTACK = Attack(
    "corrupt databases", "`vmtax runs`, `show`, `run` on a damaged vmtax.sqlite",
    "no traceback; a refusal is one line",
    lambda env, o, quick: store_attack(env, o, 2 if quick else 18))
