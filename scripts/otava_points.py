"""Runs inside Apache Otava's own virtual environment (its numpy and scipy pins conflict
with vmtax's): reads series of numbers as JSON on stdin, prints each one's change-point
indices as JSON, found with Otava's Hunter algorithm at its defaults."""

import json
import sys

from otava.analysis import compute_change_points

series = json.load(sys.stdin)
points, _ = zip(*(compute_change_points(s) for s in series)) if series else ((), ())
print(json.dumps([[int(cp.index) for cp in found] for found in points]))
