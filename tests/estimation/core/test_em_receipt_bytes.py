"""EM receipts report the bytes that really crossed process boundaries (models out, statistics back)."""

from __future__ import annotations

import pickle

import numpy as np

from mixle_parallel.executors.estimation import (
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    encoded_data,
)


def _mixture(k: int) -> tuple[MixtureEstimator, MixtureDistribution]:
    estimator = MixtureEstimator([GaussianEstimator() for _ in range(k)])
    model = MixtureDistribution([GaussianDistribution(float(m), 1.0) for m in np.linspace(-1, 1, k)], np.full(k, 1 / k))
    return estimator, model


def _pass_bytes(backend: str, k: int) -> tuple[int, bool]:
    data = np.random.default_rng(0).normal(size=400)
    estimator, model = _mixture(k)
    handle = encoded_data(data, estimator=estimator, backend=backend, num_workers=2, num_chunks=4,
                          admission="unverified", audit=False)
    try:
        handle.estep(estimator, model)
        receipt = handle.last_receipt
    finally:
        handle.close()
    return receipt.collective_bytes, receipt.extra["bytes_observed"]


def test_mp_receipts_count_models_out_and_statistics_back():
    small, observed = _pass_bytes("mp", 2)
    assert observed
    estimator, model = _mixture(2)
    # each of the 2 workers is sent the estimator and the model, and returns statistics
    assert small > 2 * len(pickle.dumps((estimator, model)))
    large, _ = _pass_bytes("mp", 12)
    assert large > small  # six times the components: more model out, more statistics back


def test_local_threads_move_nothing_across_processes():
    assert _pass_bytes("local", 3) == (0, True)
