"""Stochastic EM on the engine backends (dask, ray, spark): local's batch order and bits, workers supplying
only the statistics of a batch's chunks (the shared session engines, 2 workers each)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mixle_parallel import GaussianDistribution, GaussianEstimator, MixtureDistribution, MixtureEstimator, encoded_data

EST = MixtureEstimator([GaussianEstimator()] * 3)
START = MixtureDistribution([GaussianDistribution(m, 4.0) for m in (-1.5, 0.5, 2.0)], [1 / 3] * 3)
X = np.random.default_rng(7).normal(size=4_000) * np.where(np.arange(4_000) % 3 == 0, 1.0, 3.0)
MINIBATCH = {"batch_size": 500, "seed": 9}


def _stochastic(backend: str, **options: Any) -> tuple[str, str, tuple[int, float]]:
    """The batch plans of two epochs, the model after 1.5 passes from START, and (steps, passes)."""
    with encoded_data(X, estimator=EST, backend=backend, admission="unverified", **MINIBATCH, **options) as h:
        plans = repr([h.minibatch_plan(epoch=e) for e in range(2)])
        model = repr(h.stochastic_em(EST, epochs=1.5, model=START))
        return plans, model, (h.last_stochastic_fit.steps, h.last_stochastic_fit.passes)


REFERENCE = _stochastic("local")


def test_the_local_reference_is_a_real_stochastic_fit():
    plans, model, (steps, passes) = REFERENCE
    assert (steps, passes) == (12, 1.5) and model != repr(START) and "[[" in plans


def test_dask(dask_client):
    assert _stochastic("dask", client=dask_client, num_workers=2) == REFERENCE


def test_ray(ray_session):
    assert _stochastic("ray", num_workers=2) == REFERENCE


@pytest.mark.slow  # each mini-batch is a Spark job: ~28 s under a loaded machine
def test_spark(spark_context):
    assert _stochastic("spark", client=spark_context, num_workers=2) == REFERENCE
