"""Importing the verification layer loads no heavy engine."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "mpi4py", "pyspark", "dask", "ray", "lightning", "megatron")


def test_verification_imports_no_heavy_engine():
    code = ("import sys, mixle_parallel.verification as v; "
            f"print([m for m in {HEAVY!r} if m in sys.modules]); print(len(v.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "[]", out
