"""mixle interop: a mixle estimator fitted through our backends equals mixle's own local fit."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

mixle_stats = pytest.importorskip("mixle.stats", reason="the mixle extra (mixle==0.8.2) is not installed")
from mixle.inference.estimation import optimize as mixle_optimize  # noqa: E402
from mixle.stats.compute.sequence import seq_encode, seq_initialize  # noqa: E402

from mixle_parallel.executors.estimation import optimize  # noqa: E402


def _params(m):
    return np.array([[c.mu, c.sigma2, w] for c, w in zip(m.components, m.w)])


@pytest.fixture(scope="module")
def start_and_reference(gmm_1d):
    est = mixle_stats.MixtureEstimator([mixle_stats.GaussianEstimator()] * 3)
    m0 = seq_initialize(seq_encode(gmm_1d, estimator=est), est, np.random.RandomState(1), 0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = mixle_optimize(gmm_1d, est, max_its=6, delta=None, prev_estimate=m0)
    return est, m0, ref


def test_single_chunk_local_fit_is_mixles_bits(gmm_1d, start_and_reference):
    est, m0, ref = start_and_reference
    ours = optimize(gmm_1d, est, max_its=6, delta=None, prev_estimate=m0, num_chunks=1)
    assert type(ours) is type(ref)  # a mixle distribution comes back
    assert _params(ours).tobytes() == _params(ref).tobytes()


@pytest.mark.parametrize("backend,workers", [("local", 2), ("mp", 2)])
def test_chunked_fit_on_our_backends_equals_mixles(gmm_1d, start_and_reference, backend, workers):
    est, m0, ref = start_and_reference
    ours = optimize(gmm_1d, est, max_its=6, delta=None, prev_estimate=m0, backend=backend,
                    num_workers=workers, chunk_size=1000, admission="unverified")  # a test mesh
    # Only the summation order of chunk statistics differs from mixle's single pass.
    np.testing.assert_allclose(_params(ours), _params(ref), rtol=1e-10)


def test_encoded_data_takes_a_mixle_estimator_and_mixles_optimize_runs_on_the_handle(gmm_1d):
    from mixle_parallel.executors.estimation import encoded_data, fit

    leaf = mixle_stats.GaussianEstimator()
    with encoded_data(gmm_1d, estimator=leaf, num_chunks=3) as h:  # was AttributeError: ... 'encoder'
        ours = fit(h, leaf, max_its=2, seed=0).model
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = mixle_optimize(None, leaf, max_its=2, enc_data=h, rng=np.random.RandomState(0))
    assert type(ours) is type(theirs)  # mixle distributions come back
    assert abs(ours.mu - float(np.mean(gmm_1d))) < 1e-9 and abs(theirs.mu - ours.mu) < 1e-9
