"""Shared fixtures of the EM admission/audit tests: small data cut into many chunks, one certificate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mixle_parallel.executors.estimation import GaussianEstimator, MixtureEstimator

ROWS_PER_CHUNK = 60
"""Small chunks: many audited units per cheap iteration."""


@pytest.fixture(scope="session")
def rows() -> np.ndarray:
    """3,840 rows (64 chunks of 60) from three 1-D Gaussians."""
    rng = np.random.default_rng(17)
    return np.concatenate([rng.normal(-4, 1.0, 1280), rng.normal(0, 0.5, 1280), rng.normal(5, 1.5, 1280)])


def estimator() -> MixtureEstimator:
    """A fresh 3-component mixture estimator."""
    return MixtureEstimator([GaussianEstimator() for _ in range(3)])


@pytest.fixture(scope="session")
def mp_certificate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `mixle-parallel certify --backend mp --plan dp_replicate=2 --workload gaussian_mixture` writes."""
    from mixle_parallel.executors import verification_target
    from mixle_parallel.verification import main_certify

    out = tmp_path_factory.mktemp("cert") / "em-mp.json"
    code = main_certify(["--backend", "mp", "--plan", "dp_replicate=2", "--workload", "gaussian_mixture",
                         "--out", str(out)], resolve=verification_target)
    assert code == 0 and out.is_file()
    return out
