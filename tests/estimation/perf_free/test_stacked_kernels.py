"""The stacked E-step kernels: the full-covariance one is stacked, accurate, and no kernel's bits depend on
the BLAS thread count (an engine's worker computes with one BLAS thread, the driver and MPI ranks with many)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from mixle_parallel.executors.estimation import (
    DiagonalGaussianDistribution,
    DiagonalGaussianEstimator,
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    MultivariateGaussianDistribution,
    MultivariateGaussianEstimator,
)
from mixle_parallel.executors.estimation.models._base import statistic_digest
from mixle_parallel.executors.estimation.models.combinators import component_log_densities

ROWS = 16_384  # the default chunk's most rows


def _covariances(rng: np.random.Generator, k: int, d: int) -> list[np.ndarray]:
    out = []
    for _ in range(k):
        a = rng.normal(0.0, 0.6, (d, d))
        out.append(a @ a.T + 0.3 * np.eye(d))
    return out


def _full(rng: np.random.Generator, k: int, d: int, offset: float = 0.0) -> tuple[np.ndarray, MixtureDistribution]:
    means = rng.normal(offset, 3.0, (k, d))
    comps = [MultivariateGaussianDistribution(m, c) for m, c in zip(means, _covariances(rng, k, d))]
    x = means[rng.integers(0, k, ROWS)] + rng.normal(0.0, 1.0, (ROWS, d))
    return x, MixtureDistribution(comps, rng.dirichlet(np.ones(k)))


def _case(kind: str) -> tuple[np.ndarray, MixtureDistribution, MixtureEstimator]:
    rng = np.random.default_rng(3)
    if kind == "gaussian":
        comps = [GaussianDistribution(m, v) for m, v in zip(rng.normal(0, 4, 8), rng.uniform(0.5, 2, 8))]
        return rng.normal(0, 5, ROWS), MixtureDistribution(comps, np.full(8, 1 / 8)), \
            MixtureEstimator([GaussianEstimator() for _ in range(8)])
    if kind == "diagonal":  # (6, 16384) x (16384, 20): OpenBLAS gave other bits on 2 and 4 threads than on 1
        comps = [DiagonalGaussianDistribution(rng.normal(0, 3, 10), rng.uniform(0.5, 2, 10)) for _ in range(6)]
        return rng.normal(0, 3, (ROWS, 10)), MixtureDistribution(comps, np.full(6, 1 / 6)), \
            MixtureEstimator([DiagonalGaussianEstimator(10) for _ in range(6)])
    d = 4 if kind == "full" else 12
    x, model = _full(rng, 6, d)
    return x, model, MixtureEstimator([MultivariateGaussianEstimator(d) for _ in range(6)])


@pytest.mark.parametrize("kind", ["gaussian", "diagonal", "full", "full_12d"])
def test_chunk_statistics_are_the_same_bits_at_any_blas_thread_count(kind):
    threadpoolctl = pytest.importorskip("threadpoolctl", reason="ships with scikit-learn (the [test] extra)")
    x, model, est = _case(kind)
    digests = set()
    for threads in (1, 2, 3, 4, 8):
        with threadpoolctl.threadpool_limits(limits=threads, user_api="blas"):
            acc = est.make_accumulator()
            ll = acc.update(x, None, model)
            digests.add(statistic_digest((ll, acc.value())))
    assert len(digests) == 1, f"{kind}: {len(digests)} different results over 1, 2, 3, 4 and 8 BLAS threads"


@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_full_covariance_log_densities_are_computed_stacked_and_accurate(offset, monkeypatch):
    rng = np.random.default_rng(5)
    x, model = _full(rng, 5, 4, offset)
    want = np.stack([stats.multivariate_normal.logpdf(x, c.mu, c.covar) + lw
                     for c, lw in zip(model.components, model.log_weights)])

    def per_component(self, enc):  # the unstacked path must not be taken
        raise AssertionError("a mixture of full-covariance Gaussians evaluated its components one by one")

    monkeypatch.setattr(MultivariateGaussianDistribution, "log_density", per_component)
    got = component_log_densities(model, x)
    # expanded about the components' mean point: error ~ eps * |x - c|^2 / var, here < 1e-12 of the value
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.max(np.abs(want)))


@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_full_covariance_statistics_are_the_weighted_moments(offset):
    rng = np.random.default_rng(6)
    x, model = _full(rng, 3, 4, offset)
    weights = rng.uniform(0.0, 2.0, ROWS)
    acc = MixtureEstimator([MultivariateGaussianEstimator(4) for _ in range(3)]).make_accumulator()
    acc.update(x, weights, model)
    resp = model.posterior(x).T * weights
    for k, (sw, sx, sxx) in enumerate(acc.value()[1]):
        r = resp[k]
        assert sw == pytest.approx(float(np.sum(r)), rel=1e-13)
        np.testing.assert_allclose(sx, np.sum(r[:, None] * x, axis=0), rtol=1e-12)
        want = np.sum(r[:, None, None] * x[:, :, None] * x[:, None, :], axis=0)
        np.testing.assert_allclose(sxx, want, rtol=1e-12)
        np.testing.assert_array_equal(sxx, sxx.T)  # exactly symmetric, as the M-step expects
