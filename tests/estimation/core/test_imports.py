"""Importing the executors and the EM package stays light (no engine, no torch)."""

from __future__ import annotations

import subprocess
import sys


def test_em_import_is_light():
    code = (
        "import sys, mixle_parallel.executors, mixle_parallel.executors.estimation as e;"
        "e.encoded_data([1.0], estimator=e.GaussianEstimator()).close();"
        "heavy = [m for m in ('torch','mpi4py','pyspark','dask','ray','lightning','megatron','mixle') if m in "
        "sys.modules];"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
