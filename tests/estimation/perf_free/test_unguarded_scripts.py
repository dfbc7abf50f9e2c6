"""Scripts written like scikit-learn's examples (no ``if __name__ == "__main__":`` guard) work on ``mp``: its
workers never run the user's main module; what the script defines reaches them by value (issue 25 item 5)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

UNGUARDED = textwrap.dedent("""
    import numpy as np
    from mixle_parallel import GaussianEstimator, MixtureEstimator, encoded_data, optimize
    from mixle_parallel.contracts.estimation import statistic_digest

    print("script body ran")  # once: the workers must not run it again

    OFFSET = 0.5

    class Shift:
        def __init__(self, by):
            self.by = by

    def chunk_total(chunk, shift):  # defined in the main script, computed on a worker
        return float(np.sum(chunk.data)) + shift.by + OFFSET

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-2, 1, 3000), rng.normal(3, 0.5, 3000)])
    est = MixtureEstimator([GaussianEstimator(), GaussianEstimator()])
    mp_model = optimize(x, est, max_its=20, seed=1, backend="mp", num_workers=2)
    local_model = optimize(x, est, max_its=20, seed=1, backend="local")
    print("same bits", statistic_digest(mp_model.params()) == statistic_digest(local_model.params()))
    with encoded_data(x, estimator=est, backend="mp", num_workers=2, chunk_size=1000) as h:
        totals = h.map_chunks(chunk_total, Shift(1.0))
    print("totals", len(totals), abs(sum(totals) - (float(np.sum(x)) + 1.5 * len(totals))) < 1e-6)
""")


def _run(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "script.py").write_text(text, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_an_unguarded_script_fits_on_mp_and_its_body_runs_once(tmp_path):
    done = _run(tmp_path, UNGUARDED)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("script body ran") == 1, done.stdout
    assert "same bits True" in done.stdout
    assert "totals 6 True" in done.stdout, done.stdout
