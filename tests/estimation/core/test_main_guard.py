"""An engine whose own start re-runs the main script (a local Dask cluster) refuses to start workers from a
script's unguarded top level; mp starts its workers without the script (tests/estimation/perf_free)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mixle_parallel.executors.estimation.backends.main_guard import unguarded_main_line

ROOT = Path(__file__).resolve().parents[3]
START = ("import numpy as np\nfrom mixle_parallel import GaussianEstimator, encoded_data\n"
         "def start():\n"
         "    with encoded_data(np.zeros(20), estimator=GaussianEstimator(), backend='{backend}',\n"
         "                      num_workers=1) as h:\n"
         "        print('started', h.num_workers)\n")


def _run(tmp_path: Path, body: str, backend: str = "mp") -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(START.format(backend=backend) + textwrap.dedent(body), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)


def test_an_unguarded_script_is_refused_on_a_local_dask_cluster_naming_the_line(tmp_path):
    pytest.importorskip("distributed")
    done = _run(tmp_path, "start()\n", backend="dask")
    assert done.returncode != 0 and "started" not in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert "backend 'dask' starts worker processes" in last, done.stderr[-2000:]
    assert "put the code that starts them (line 7) under `if __name__ == \"__main__\":`" in last
    assert "WorkerLostError" not in done.stderr and "importable" not in done.stderr  # no worker ever started


def test_a_guarded_script_starts_its_workers(tmp_path):
    done = _run(tmp_path, "if __name__ == '__main__':\n    start()\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "started 1" in done.stdout


def test_calls_from_elsewhere_are_not_judged():
    assert unguarded_main_line() is None  # pytest's own main is guarded; this call is not at its top level
    assert multiprocessing.current_process().name == "MainProcess"
