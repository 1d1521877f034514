"""Builds Go's benchstat (golang.org/x/perf), pinned, into vmtax's cache with the Go
toolchain vmtax builds its own tools with, so that tests/test_ux.py can check on every host
that `benchstat old.txt new.txt` compares two of vmtax's exports. Prints its path.

    .venv/bin/python scripts/benchstat.py
"""

import shutil
import tempfile
from pathlib import Path

from vmtax.core import paths
from vmtax.helpers import go_toolchain

# benchstat of golang.org/x/perf at 2026-09-08 (it needs Go 1.26, as the toolchain is).
PACKAGE = "golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da"


def path() -> Path:
    return paths.cache_dir() / "bin" / "benchstat"


def build() -> Path:
    target = path()
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=paths.cache_dir()) as scratch:
        gopath = Path(scratch) / "go"
        go = go_toolchain.fetch_toolchain(gopath, Path(scratch), "benchstat", "benchstat")
        go_toolchain.run_go([go, "install", PACKAGE],
                            {**go_toolchain.go_env(gopath), "GOBIN": scratch}, Path(scratch),
                            "building benchstat", "benchstat")
        shutil.move(str(Path(scratch) / "benchstat"), target)
    return target


if __name__ == "__main__":
    print(build())
