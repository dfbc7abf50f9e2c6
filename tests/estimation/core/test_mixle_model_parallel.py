"""ModelParallelEstimator around a mixle estimator, driven by mixle's own optimize and by ours: mixle's bits."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

mstats = pytest.importorskip("mixle.stats", reason="the mixle extra (mixle==0.8.2) is not installed")
from mixle.inference import optimize as mixle_optimize  # noqa: E402

from mixle_parallel import optimize  # noqa: E402
from mixle_parallel.model_parallel import ModelParallelEstimator  # noqa: E402


def _mixture() -> tuple[object, object, list[float]]:
    est = mstats.MixtureEstimator([mstats.GaussianEstimator() for _ in range(4)])
    init = mstats.MixtureDistribution([mstats.GaussianDistribution(float(i) - 1.5, 1.0) for i in range(4)], [0.25] * 4)
    rng = np.random.RandomState(1)
    return est, init, [float(rng.randn() + 3 * (rng.randint(4) - 1.5)) for _ in range(300)]


def test_mixles_optimize_accepts_the_wrapper_and_returns_mixles_bits():
    est, init, data = _mixture()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = mixle_optimize(data, est, prev_estimate=init, max_its=5, out=None, backend="local")
        wrapped = mixle_optimize(data, ModelParallelEstimator(est, num_workers=2), prev_estimate=init, max_its=5,
                                 out=None, backend="local")
    assert type(wrapped) is type(base) and str(wrapped) == str(base)


def test_a_mixle_hmm_through_the_wrapper_on_mixles_driver_and_ours():
    emit = [mstats.GaussianDistribution(float(i) * 3, 1.0) for i in range(3)]
    init = mstats.HiddenMarkovModelDistribution(emit, [1 / 3] * 3, (np.ones((3, 3)) / 3).tolist(),
                                                len_dist=mstats.PoissonDistribution(5.0))
    est = mstats.HiddenMarkovEstimator([mstats.GaussianEstimator() for _ in range(3)],
                                       len_estimator=mstats.PoissonEstimator())
    data = [init.sampler(seed=s).sample() for s in range(30)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = mixle_optimize(data, est, prev_estimate=init, max_its=3, out=None, backend="local")
        wrapped = mixle_optimize(data, ModelParallelEstimator(est, num_workers=2), prev_estimate=init, max_its=3,
                                 out=None, backend="local")
    assert str(wrapped) == str(base)
    ours = optimize(data, ModelParallelEstimator(est), prev_estimate=init, max_its=3, delta=None, num_chunks=1)
    plain = optimize(data, est, prev_estimate=init, max_its=3, delta=None, num_chunks=1)
    assert type(ours) is type(base) and str(ours) == str(plain)


def test_mixle_protocol_methods_are_refused_on_our_own_accumulators():
    from mixle_parallel import GaussianEstimator

    acc = ModelParallelEstimator(GaussianEstimator()).accumulator_factory().make()
    with pytest.raises(TypeError, match="key_merge is mixle's accumulator protocol"):
        acc.key_merge({})
