"""A fit whose files exceed the driver's memory limit completes: the rows never pass through the driver."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.slow

ROWS_PER_FILE = 1_000_000
"""4 files of 1M rows x 4 float64 (32 MB each, 128 MB together); the driver may grow by 64 MB."""


def test_a_fit_from_files_larger_than_the_drivers_memory_limit_completes(tmp_path):
    distributed = pytest.importorskip("distributed")
    rng = np.random.default_rng(0)
    for i in range(4):
        centers = rng.choice([-3.0, 3.0], size=(ROWS_PER_FILE, 1))
        np.save(tmp_path / f"part-{i}.npy", centers + rng.normal(size=(ROWS_PER_FILE, 4)))
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                       silence_logs=logging.ERROR)
    try:
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)}
        done = subprocess.run([sys.executable, "-m", "tests.estimation.sources.limited_driver",
                               cluster.scheduler_address, str(tmp_path), "64"],
                              capture_output=True, text=True, timeout=600, env=env, cwd=repo)
    finally:
        cluster.close()
    out = done.stdout
    assert "cannot load the files here" in out, out + done.stderr[-3000:]  # the limit is below the data
    assert done.returncode == 0 and "fitted" in out, out + done.stderr[-5000:]
