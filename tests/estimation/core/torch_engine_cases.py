"""Data, estimators and models of every kind the torch EM engine has kernels for, and the bounds it meets.

Shared by the CPU tests (tests/estimation/core/test_torch_engine.py) and the CUDA check
(tests/device/test_torch_engine_cuda.py), so both compare the same cases against the numpy engine.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mixle_parallel.executors.estimation import (
    CategoricalDistribution,
    CategoricalEstimator,
    DiagonalGaussianDistribution,
    DiagonalGaussianEstimator,
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    MultivariateGaussianDistribution,
    MultivariateGaussianEstimator,
    PoissonDistribution,
    PoissonEstimator,
)

FP64_RTOL = 1e-12
"""fp64 torch vs numpy: every statistic within 1e-12 of the numpy one, relative to the largest entry of
that statistic (normwise), and the log-likelihood within 1e-12 relative. Measured: <= 5e-15 and <= 5e-16."""

FP32_STATS_RTOL = 1e-4
FP32_LL_RTOL = 1e-6
"""fp32 torch vs numpy (fp64): statistics normwise within 1e-4, log-likelihood within 1e-6 relative, on
chunks of up to 16,384 rows (the default). Measured on these cases: statistics <= 2.3e-6, ll <= 1.5e-7."""

ROWS = 20_000


def _categorical(rng: np.random.Generator) -> list[str]:
    return rng.choice(["a", "b", "c", "d", "e"], ROWS, p=[0.4, 0.3, 0.15, 0.1, 0.05]).tolist()


def cases() -> dict[str, tuple[Any, Any, Any]]:
    """name -> (rows, estimator, model): each kernel kind alone and in a mixture, and a mixed-kind mixture."""
    rng = np.random.default_rng(5)
    x1 = np.concatenate([rng.normal(-3, 1.0, ROWS // 2), rng.normal(2, 0.5, ROWS - ROWS // 2)])
    x4 = rng.normal(0, 1, (ROWS, 4)) + rng.integers(0, 2, (ROWS, 1)) * 3.0
    cov = np.array([[2.0, 0.3, 0.0, 0.1], [0.3, 1.0, 0.2, 0.0], [0.0, 0.2, 1.5, 0.4], [0.1, 0.0, 0.4, 1.2]])
    counts = np.concatenate([rng.poisson(1.5, ROWS // 2), rng.poisson(9.0, ROWS - ROWS // 2)])
    cats = _categorical(rng)
    p1 = {"a": 0.5, "b": 0.2, "c": 0.2, "d": 0.1}  # "e" is unseen: default_value 0 -> log -inf
    p2 = {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.2, "e": 0.2}
    gauss = [GaussianDistribution(-2.0, 2.0), GaussianDistribution(0.5, 1.0), GaussianDistribution(2.5, 0.3)]
    diag = [DiagonalGaussianDistribution(np.full(4, m), np.full(4, v)) for m, v in ((0.0, 1.0), (3.0, 0.5))]
    full = [MultivariateGaussianDistribution(np.zeros(4), cov), MultivariateGaussianDistribution(np.full(4, 3.0),
                                                                                                 np.eye(4))]
    mix = MixtureEstimator
    return {
        "gaussian": (x1, GaussianEstimator(), gauss[0]),
        "gaussian_mixture": (x1, mix([GaussianEstimator()] * 3), MixtureDistribution(gauss, [0.3, 0.3, 0.4])),
        "diagonal": (x4, DiagonalGaussianEstimator(4), diag[0]),
        "diagonal_mixture": (x4, mix([DiagonalGaussianEstimator(4)] * 2), MixtureDistribution(diag, [0.5, 0.5])),
        "full": (x4, MultivariateGaussianEstimator(4), full[0]),
        "full_mixture": (x4, mix([MultivariateGaussianEstimator(4)] * 2), MixtureDistribution(full, [0.6, 0.4])),
        "diagonal_and_full_mixture": (x4, mix([DiagonalGaussianEstimator(4), MultivariateGaussianEstimator(4)]),
                                      MixtureDistribution([diag[0], full[1]], [0.5, 0.5])),
        "categorical": (cats, CategoricalEstimator(), CategoricalDistribution(p2)),
        "categorical_mixture": (cats, mix([CategoricalEstimator()] * 2),
                                MixtureDistribution([CategoricalDistribution(p1), CategoricalDistribution(p2)],
                                                    [0.5, 0.5])),
        "poisson": (counts, PoissonEstimator(), PoissonDistribution(4.0)),
        "poisson_mixture": (counts, mix([PoissonEstimator()] * 2),
                            MixtureDistribution([PoissonDistribution(1.0), PoissonDistribution(7.0)], [0.5, 0.5])),
    }


def flat_statistics(stats: Any) -> list[np.ndarray]:
    """Each statistic of a (nested) statistics value as a float64 array, in a fixed order (dicts by key)."""
    if isinstance(stats, dict):
        return [np.array([float(stats[k]) for k in sorted(stats, key=str)])]
    if isinstance(stats, (tuple, list)):
        return [a for s in stats for a in flat_statistics(s)]
    return [np.atleast_1d(np.asarray(stats, dtype=np.float64))]


def normwise_errors(got: Any, want: Any) -> list[float]:
    """Per statistic: max |got - want| / max |want| (0 where both are all zero)."""
    out = []
    for g, w in zip(flat_statistics(got), flat_statistics(want), strict=True):
        assert g.shape == w.shape
        scale = float(np.max(np.abs(w))) if w.size else 0.0
        diff = float(np.max(np.abs(g - w))) if w.size else 0.0
        out.append(diff / scale if scale > 0 else diff)
    return out
