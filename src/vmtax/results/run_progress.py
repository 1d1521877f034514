"""What a stored run lacks, and how long stored jobs took: what `vmtax runs` says of an
interrupted run and what plan estimates learn from. A part of Store (it inherits these).

May import: `vmtax.core`, `vmtax.results.connection`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection
from pathlib import Path

from vmtax.results.connection import guarded


class RunProgress:
    db: sqlite3.Connection
    path: Path

    @guarded
    def missing(self, run_id: str) -> list[str]:
        """What an unfinished run lacks: "TARGET · WORKLOAD (stored of planned)" for each
        target and workload of its plan with fewer measured repetitions than the plan's
        runs (a workload's several configurations each count), in the plan's order."""
        row = self.db.execute("SELECT plan FROM runs WHERE id = ?", (run_id,)).fetchone()
        plan = json.loads(row["plan"]) if row else {}
        runs = plan.get("runs")
        if not isinstance(runs, int):
            return []
        configs: dict[str, int] = {}
        for w in plan.get("workloads", []):
            configs[w.get("name")] = configs.get(w.get("name"), 0) + 1
        stored = {(r["target"], r["workload"]): r["n"] for r in self.db.execute(
            "SELECT target, workload, count(*) AS n FROM reps WHERE run_id = ? AND "
            "phase = 'measure' GROUP BY target, workload", (run_id,))}
        return [f"{t['name']} · {w} ({stored.get((t['name'], w), 0)} of {n * runs})"
                for t in plan.get("targets", []) for w, n in configs.items()
                if stored.get((t["name"], w), 0) < n * runs]

    @guarded
    def job_times(self, targets: Collection[str], runs: int = 20
                  ) -> dict[tuple[str, str, str, str], list[float]]:
        """(target, workload, params as canonical JSON, phase) -> the host times of its
        successful jobs, in the latest `runs` runs that had any of these targets: what plan
        estimates learn from."""
        names = list(targets)
        marks = ",".join("?" * len(names))
        found: dict[tuple[str, str, str, str], list[float]] = {}
        for row in self.db.execute(
                "SELECT p.target, p.workload, p.params, p.phase, p.host_elapsed FROM reps p"
                " WHERE p.status = 'ok' AND p.host_elapsed IS NOT NULL"
                f" AND p.target IN ({marks}) AND p.run_id IN (SELECT DISTINCT run_id FROM"
                f" targets WHERE name IN ({marks}) ORDER BY run_id DESC LIMIT ?)",
                (*names, *names, runs)):
            params = json.dumps(json.loads(row["params"]), sort_keys=True)
            found.setdefault((row["target"], row["workload"], params, row["phase"]),
                             []).append(row["host_elapsed"])
        return found
