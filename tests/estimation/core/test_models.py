"""Every built-in model against a closed-form or scipy reference."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from scipy.special import logsumexp

from mixle_parallel.executors.estimation import (
    CategoricalDistribution,
    CategoricalEstimator,
    CompositeDistribution,
    CompositeEstimator,
    DiagonalGaussianDistribution,
    DiagonalGaussianEstimator,
    ExponentialDistribution,
    ExponentialEstimator,
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    MultivariateGaussianDistribution,
    MultivariateGaussianEstimator,
    PoissonDistribution,
    PoissonEstimator,
)

RTOL = 1e-12  # log densities are closed forms: agreement to rounding


def _fit_weighted(est, rows, w):
    enc = est.encoder().encode(rows)
    acc = est.accumulator_factory().make()
    acc.update(enc, w, None)
    return est.estimate(float(np.sum(w)), acc.value())


def test_gaussian_density_and_weighted_mle():
    rng = np.random.default_rng(0)
    x, w = rng.normal(3, 2, 500), rng.random(500)
    d = GaussianDistribution(1.5, 2.25)
    np.testing.assert_allclose(d.log_density(d.encoder().encode(x)), stats.norm.logpdf(x, 1.5, 1.5), rtol=RTOL)
    m = _fit_weighted(GaussianEstimator(), x, w)
    mu = np.average(x, weights=w)
    np.testing.assert_allclose([m.mu, m.sigma2], [mu, np.average((x - mu) ** 2, weights=w)], rtol=1e-10)


def test_exponential_density_and_mle():
    rng = np.random.default_rng(1)
    x, w = rng.exponential(2.0, 400), rng.random(400)
    d = ExponentialDistribution(0.7)
    np.testing.assert_allclose(d.log_density(d.encoder().encode(x)), stats.expon.logpdf(x, scale=1 / 0.7), rtol=RTOL)
    assert d.log_density(np.array([-1.0]))[0] == -np.inf
    m = _fit_weighted(ExponentialEstimator(), x, w)
    assert m.rate == pytest.approx(np.sum(w) / np.sum(w * x), rel=1e-12)


def test_poisson_density_and_mle():
    rng = np.random.default_rng(2)
    x, w = rng.poisson(4.0, 300), rng.random(300)
    d = PoissonDistribution(3.2)
    np.testing.assert_allclose(d.log_density(d.encoder().encode(x)), stats.poisson.logpmf(x, 3.2), rtol=1e-12)
    assert PoissonDistribution(0.0).log_density(d.encoder().encode([0, 2])).tolist() == [0.0, -np.inf]
    m = _fit_weighted(PoissonEstimator(), x, w)
    assert m.lam == pytest.approx(np.average(x, weights=w), rel=1e-12)
    with pytest.raises(ValueError, match="non-negative integers"):
        d.encoder().encode([1.5])


def test_categorical_density_and_mle():
    rows = ["a", "b", "a", "c", "a", "b"]
    w = np.array([1.0, 2.0, 1.0, 0.5, 1.0, 0.0])
    m = _fit_weighted(CategoricalEstimator(), rows, w)
    assert m.probs == pytest.approx({"a": 3 / 5.5, "b": 2 / 5.5, "c": 0.5 / 5.5})
    enc = m.encoder().encode(["c", "zzz", "a"])
    np.testing.assert_allclose(m.log_density(enc), [np.log(0.5 / 5.5), -np.inf, np.log(3 / 5.5)])
    ints = _fit_weighted(CategoricalEstimator(), np.array([3, 1, 3]), np.ones(3))
    assert ints.probs == pytest.approx({1: 1 / 3, 3: 2 / 3})
    with pytest.raises(TypeError, match="str or int"):
        CategoricalEncoder_encode = CategoricalEstimator().encoder().encode
        CategoricalEncoder_encode([1.5, "a"])


def test_diagonal_gaussian_density_and_mle():
    rng = np.random.default_rng(3)
    x, w = rng.normal(1, 2, (300, 3)), rng.random(300)
    d = DiagonalGaussianDistribution([0.0, 1.0, -1.0], [1.0, 4.0, 0.25])
    ref = stats.multivariate_normal.logpdf(x, [0.0, 1.0, -1.0], np.diag([1.0, 4.0, 0.25]))
    np.testing.assert_allclose(d.log_density(d.encoder().encode(x)), ref, rtol=RTOL)
    m = _fit_weighted(DiagonalGaussianEstimator(3), x, w)
    mu = np.average(x, axis=0, weights=w)
    np.testing.assert_allclose(m.mu, mu, rtol=1e-10)
    np.testing.assert_allclose(m.var, np.average((x - mu) ** 2, axis=0, weights=w), rtol=1e-9)


def test_full_covariance_gaussian_density_and_mle():
    rng = np.random.default_rng(4)
    cov = np.array([[2.0, 0.6, 0.1], [0.6, 1.0, -0.3], [0.1, -0.3, 0.5]])
    x, w = rng.multivariate_normal([1, 2, 3], cov, 500), rng.random(500)
    d = MultivariateGaussianDistribution([1, 2, 3], cov)
    ref = stats.multivariate_normal.logpdf(x, [1, 2, 3], cov)
    np.testing.assert_allclose(d.log_density(d.encoder().encode(x)), ref, rtol=1e-11)
    m = _fit_weighted(MultivariateGaussianEstimator(3, reg_var=0.0), x, w)
    np.testing.assert_allclose(m.mu, np.average(x, axis=0, weights=w), rtol=1e-10)
    np.testing.assert_allclose(m.covar, np.cov(x.T, aweights=w, bias=True), rtol=1e-9)
    # A degenerate (rank-deficient) component still yields a positive-definite covariance.
    flat = _fit_weighted(MultivariateGaussianEstimator(3), np.ones((4, 3)), np.ones(4))
    assert np.all(np.linalg.eigvalsh(flat.covar) > 0)


def test_mixture_log_density_is_stable_log_sum_exp():
    comps = [GaussianDistribution(-2, 1), GaussianDistribution(40, 0.01), GaussianDistribution(3, 4)]
    mix = MixtureDistribution(comps, [0.2, 0.3, 0.5])
    x = np.array([-2.0, 40.0, 3.0, 1e3, -1e3])  # far tails: naive exp underflows
    ref = logsumexp(np.stack([np.log(w) + stats.norm.logpdf(x, c.mu, np.sqrt(c.sigma2))
                              for w, c in zip(mix.weights, comps)]), axis=0)
    np.testing.assert_allclose(mix.log_density(mix.encoder().encode(x)), ref, rtol=1e-12)
    post = mix.posterior(mix.encoder().encode(x))
    np.testing.assert_allclose(post.sum(axis=1), 1.0, rtol=1e-12)


def test_mixture_zero_weight_and_empty_components_stay_finite():
    x = np.random.default_rng(5).normal(0, 1, 200)
    mix = MixtureDistribution([GaussianDistribution(0, 1), GaussianDistribution(1e6, 1)], [1.0, 0.0])
    est = MixtureEstimator([GaussianEstimator(), GaussianEstimator()])
    acc = est.accumulator_factory().make()
    ll = acc.update(est.encoder().encode(x), None, mix)
    assert np.all(np.isfinite(ll))
    new = est.estimate(200.0, acc.value())
    assert new.weights.tolist() == [1.0, 0.0]  # the empty component keeps weight 0, no NaN
    assert np.isfinite(new.components[1].mu) and new.components[1].sigma2 > 0
    # Rows no component can explain give -inf, not NaN.
    only_pos = MixtureDistribution([ExponentialDistribution(1.0)], [1.0])
    assert only_pos.log_density(np.array([-1.0, 1.0])).tolist() == [-np.inf, -1.0]


def test_composite_over_tuple_fields():
    rows = [(1.0, "a", 3), (2.5, "b", 0), (0.5, "a", 1)]
    d = CompositeDistribution([GaussianDistribution(1, 1), CategoricalDistribution({"a": 0.75, "b": 0.25}),
                               PoissonDistribution(2.0)])
    enc = d.encoder().encode(rows)
    ref = (stats.norm.logpdf([1.0, 2.5, 0.5], 1, 1) + np.log([0.75, 0.25, 0.75])
           + stats.poisson.logpmf([3, 0, 1], 2.0))
    np.testing.assert_allclose(d.log_density(enc), ref, rtol=1e-12)
    est = CompositeEstimator([GaussianEstimator(), CategoricalEstimator(), PoissonEstimator()])
    m = _fit_weighted(est, rows, np.ones(3))
    assert m.dists[0].mu == pytest.approx(4 / 3) and m.dists[2].lam == pytest.approx(4 / 3)
    assert m.dists[1].probs == pytest.approx({"a": 2 / 3, "b": 1 / 3})
