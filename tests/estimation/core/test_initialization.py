"""EM starts: k-means++ by default for mixtures, Dirichlet and random on request, n_init restarts.

The bimodal case of issue 14: 60,000 rows from N(-2, 1) and N(3, 0.5), a 2-component Gaussian
mixture with default ``optimize`` arguments, ends within 1e-3 per row of scikit-learn's
log-likelihood for every seed 0..9 (local), and on mp and dask with 2 workers.
"""

from __future__ import annotations

import numpy as np
import pytest

from mixle_parallel.contracts.estimation import canonical_statistic_bytes
from mixle_parallel.executors.estimation import (
    GaussianEstimator,
    MixtureEstimator,
    PoissonEstimator,
    optimize,
)
from mixle_parallel.executors.estimation.fitting.initialization import kmeans_centers, resolve_init
from mixle_parallel.executors.estimation.optimize import _restart_seed, fit


@pytest.fixture(scope="module")
def bimodal() -> tuple[np.ndarray, float]:
    """The issue's data and scikit-learn's mean log-likelihood per row on it."""
    sklearn_mixture = pytest.importorskip("sklearn.mixture")
    rng = np.random.default_rng(2026)
    x = np.concatenate([rng.normal(-2.0, 1.0, 30_000), rng.normal(3.0, 0.5, 30_000)])
    rng.shuffle(x)
    gm = sklearn_mixture.GaussianMixture(2, random_state=0).fit(x[:, None])
    return x, float(gm.score(x[:, None]))


def _per_row(model, x) -> float:
    return float(np.mean(model.log_density(x)))


def _gmm2():
    return MixtureEstimator([GaussianEstimator()] * 2)


def test_default_start_finds_sklearns_optimum_for_every_seed(bimodal):
    x, reference = bimodal
    for seed in range(10):
        model = optimize(x, _gmm2(), seed=seed)  # default max_its=10, delta=1e-9
        assert abs(_per_row(model, x) - reference) < 1e-3, f"seed {seed}"
        assert sorted(np.round([c.mu for c in model.components]).tolist()) == [-2.0, 3.0]


def test_the_old_random_start_is_still_there_and_is_worse(bimodal):
    x, reference = bimodal
    model = optimize(x, _gmm2(), seed=7, init="random")
    assert _per_row(model, x) < reference - 0.1  # both components start at the global mean


def test_mp_two_workers_same_bits_and_optimum(bimodal):
    x, reference = bimodal
    local = fit(x, _gmm2(), seed=3)
    other = fit(x, _gmm2(), seed=3, backend="mp", num_workers=2, admission="unverified")  # a test mesh
    assert other.history == local.history and other.init == "kmeans++"
    assert canonical_statistic_bytes(other.model.params()) == canonical_statistic_bytes(local.model.params())
    assert abs(_per_row(other.model, x) - reference) < 1e-3


def test_dask_two_workers_same_bits_and_optimum(bimodal, dask_client):
    x, reference = bimodal
    local = fit(x, _gmm2(), seed=5)
    other = fit(x, _gmm2(), seed=5, backend="dask", num_workers=2, client=dask_client, admission="unverified")
    assert other.history == local.history
    assert canonical_statistic_bytes(other.model.params()) == canonical_statistic_bytes(local.model.params())
    assert abs(_per_row(other.model, x) - reference) < 1e-3


@pytest.mark.parametrize("init", ["kmeans++", "dirichlet", "random"])
def test_every_start_is_the_same_bits_for_any_worker_count(gmm_1d, init):
    est = MixtureEstimator([GaussianEstimator()] * 3)
    fits = [fit(gmm_1d, est, max_its=3, delta=None, seed=11, init=init, num_workers=n, chunk_size=500)
            for n in (1, 3)]
    assert fits[0].init == fits[1].init == init
    assert fits[0].history == fits[1].history
    assert canonical_statistic_bytes(fits[0].model.params()) == canonical_statistic_bytes(fits[1].model.params())


def test_starts_differ_and_the_seed_matters(gmm_1d):
    est = MixtureEstimator([GaussianEstimator()] * 3)
    firsts = {init: fit(gmm_1d, est, max_its=1, delta=None, seed=1, init=init).history[0]
              for init in ("kmeans++", "dirichlet", "random")}
    assert len(set(firsts.values())) == 3
    assert firsts["kmeans++"] > firsts["random"]  # a start near the clusters scores far better
    assert fit(gmm_1d, est, max_its=1, seed=2, init="dirichlet").history != (firsts["dirichlet"],)


def test_n_init_keeps_the_best_restart(gmm_1d):
    est = MixtureEstimator([GaussianEstimator()] * 3)
    best = fit(gmm_1d, est, max_its=5, delta=None, seed=4, init="random", n_init=3)
    singles = [fit(gmm_1d, est, max_its=5, delta=None, seed=_restart_seed(4, r), init="random") for r in range(3)]
    assert best.log_likelihood == max(s.log_likelihood for s in singles)
    assert len({s.log_likelihood for s in singles}) > 1  # the restarts really differ


def test_stop_reason_says_why(gmm_1d):
    est = MixtureEstimator([GaussianEstimator()] * 3)
    done = fit(gmm_1d, est, max_its=500, seed=0)
    assert done.converged and done.stop_reason == "converged" and done.iterations < 500
    capped = fit(gmm_1d, est, max_its=2, delta=None, seed=0)
    assert not capped.converged and capped.stop_reason == "max_its" and capped.iterations == 2


def test_non_numeric_rows_fall_back_or_refuse():
    counts = np.random.default_rng(0).poisson(4.0, 500).astype(float)
    est = MixtureEstimator([PoissonEstimator()] * 2)
    assert fit(counts, est, max_its=2, seed=0).init == "random"  # the default falls back
    with pytest.raises(ValueError, match="init='kmeans\\+\\+' needs scalar or vector float rows"):
        fit(counts, est, max_its=2, seed=0, init="kmeans++")
    assert fit(counts, est, max_its=2, seed=0, init="dirichlet").init == "dirichlet"
    own = MixtureEstimator([PoissonEstimator()] * 2, init="dirichlet")  # the estimator's own choice
    assert fit(counts, own, max_its=2, seed=0).init == "dirichlet"
    assert fit(counts, own, max_its=2, seed=0, init="random").init == "random"  # optimize's init= wins


def test_bad_start_arguments_are_refused(gmm_1d):
    est = MixtureEstimator([GaussianEstimator()] * 2)
    with pytest.raises(ValueError, match="init must be one of kmeans\\+\\+, dirichlet, random"):
        fit(gmm_1d, est, init="kmeans")
    with pytest.raises(ValueError, match="n_init must be an int >= 1"):
        fit(gmm_1d, est, n_init=0)
    with pytest.raises(ValueError, match="delta must be a finite number > 0"):
        fit(gmm_1d, est, delta=0.0)
    with pytest.raises(ValueError, match="is not one of our MixtureEstimators"):
        resolve_init(GaussianEstimator(), "kmeans++")
    with pytest.raises(ValueError, match="needs at least 3 sampled rows"):
        kmeans_centers(np.zeros((2, 1)), 3, np.random.default_rng(0))
