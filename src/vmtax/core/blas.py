"""Loading numpy without OpenBLAS's worker threads.

OpenBLAS, which numpy loads, starts a thread per CPU that spins waiting for work: ~40 ms of
CPU for each command that loads numpy on this 2-core host (a third of a `vmtax show`), for
statistics that call no BLAS routine (no linear algebra, no float matrix product).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

THREADS = "OPENBLAS_NUM_THREADS"


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Around numpy's first import: one BLAS thread unless the user chose a number. The
    environment is as it was afterwards, so the workloads vmtax starts get the one they
    were given (OpenBLAS reads it once, when it loads)."""
    chosen = THREADS in os.environ
    os.environ.setdefault(THREADS, "1")
    try:
        yield
    finally:
        if not chosen:
            os.environ.pop(THREADS, None)
