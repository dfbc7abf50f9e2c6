"""The one stochastic-EM case the engine backends must reproduce bit for bit (4,000 rows, 500-row batches)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mixle_parallel import GaussianDistribution, GaussianEstimator, MixtureDistribution, MixtureEstimator

EST = MixtureEstimator([GaussianEstimator()] * 3)
START = MixtureDistribution([GaussianDistribution(m, 4.0) for m in (-1.5, 0.5, 2.0)], [1 / 3] * 3)
MINIBATCH = {"batch_size": 500, "seed": 9}


def data() -> np.ndarray:
    """Rows of two scales interleaved."""
    return np.random.default_rng(7).normal(size=4_000) * np.where(np.arange(4_000) % 3 == 0, 1.0, 3.0)


def signature(handle: Any) -> tuple[str, str, tuple[int, float]]:
    """The batch plans of two epochs, the model after 1.5 passes from START, and (steps, passes)."""
    plans = repr([handle.minibatch_plan(epoch=e) for e in range(2)])
    model = repr(handle.stochastic_em(EST, epochs=1.5, model=START))
    return plans, model, (handle.last_stochastic_fit.steps, handle.last_stochastic_fit.passes)
