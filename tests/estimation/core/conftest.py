"""Shared fixtures for the EM tests: small data sets with known structure."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="session")
def gmm_1d() -> np.ndarray:
    """6,000 rows from three well-separated 1-D Gaussians."""
    rng = np.random.default_rng(7)
    return np.concatenate([rng.normal(-4, 1.0, 2000), rng.normal(0, 0.5, 2000), rng.normal(5, 1.5, 2000)])


@pytest.fixture(scope="session")
def gmm_4d() -> np.ndarray:
    """3,000 rows of 4-D data from two diagonal Gaussians."""
    rng = np.random.default_rng(11)
    a = rng.normal(-2, 1.0, (1500, 4))
    b = rng.normal(3, 0.7, (1500, 4))
    return np.concatenate([a, b])
