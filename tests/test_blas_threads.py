"""numpy loads OpenBLAS, whose thread per CPU spins ~40 ms of CPU for every command that
loads numpy (issue #37): each module that imports numpy gets it through core.blas, and
OPENBLAS_NUM_THREADS is as the user left it afterwards."""

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["vmtax.analysis.stats", "vmtax.analysis.significance",
                                    "vmtax.analysis.intervals", "vmtax.analysis.resampling",
                                    "vmtax.analysis.changepoint", "vmtax.analysis.tune"])
def test_loading_a_statistics_module_starts_no_blas_threads(module):
    code = (f"import os, {module}\n"
            "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["1", "None"]
