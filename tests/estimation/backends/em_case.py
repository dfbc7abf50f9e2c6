"""The one EM case every backend must fit to the same bits: a 1-D, 3-component Gaussian mixture."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from mixle_parallel.executors.estimation import GaussianEstimator, MixtureEstimator, fit
from mixle_parallel.executors.estimation.models._base import model_digest

FIT_KWARGS: dict[str, Any] = dict(max_its=12, delta=None, seed=11, init_p=0.2, chunk_size=250, progress=False)
"""4,000 rows in 16 chunks of 250; the chunking is fixed, the worker count varies."""


def data() -> np.ndarray:
    """Rows with a wide dynamic range, so any change of summation order shows in the bits."""
    rng = np.random.default_rng(2024)
    return np.concatenate([rng.normal(-6.0, 1.0, 1500), rng.normal(0.5, 0.3, 1000), rng.normal(7.0, 2.5, 1500)])


def estimator() -> MixtureEstimator:
    """A fresh 3-component Gaussian mixture estimator."""
    return MixtureEstimator([GaussianEstimator() for _ in range(3)])


def signature(result: Any) -> tuple[str, tuple[str, ...]]:
    """Bits of a fit: the model's parameter digest and the log-likelihood trajectory in hex."""
    return model_digest(result.model), tuple(float(v).hex() for v in result.history)


def run(backend: str, num_workers: int | None, est: Any = None, **kwargs: Any) -> tuple[str, tuple[str, ...]]:
    """Fit the case on ``backend`` and return its signature."""
    # admission="unverified": the engines' test meshes are compared bitwise with the reference, no
    # certificate is needed for that (tests/estimation/audit checks the gate itself)
    options = {"admission": "unverified", **FIT_KWARGS, **kwargs}
    return signature(fit(data(), est if est is not None else estimator(), backend=backend,
                         num_workers=num_workers, **options))


@functools.lru_cache(maxsize=1)
def reference() -> tuple[str, tuple[str, ...]]:
    """The signature of the plain in-process fit (local backend, one worker)."""
    return run("local", 1)


def mixle_estimator() -> Any:
    """The same case as a mixle 0.8.2 ``MixtureEstimator`` of three ``GaussianEstimator``s."""
    import mixle.stats as mixle_stats

    return mixle_stats.MixtureEstimator([mixle_stats.GaussianEstimator() for _ in range(3)])


def mixle_signature(result: Any) -> tuple[str, tuple[str, ...]]:
    """Bits of a fit of the mixle estimator: a mixle distribution's parameters and the trajectory."""
    m = result.model
    params = np.array([[c.mu, c.sigma2, w] for c, w in zip(m.components, m.w)], dtype=np.float64)
    return params.tobytes().hex(), tuple(float(v).hex() for v in result.history)


def run_mixle(backend: str, num_workers: int | None, **kwargs: Any) -> tuple[str, tuple[str, ...]]:
    """Fit the case with the mixle estimator on ``backend``; its signature."""
    options = {"admission": "unverified", **FIT_KWARGS, **kwargs}
    result = fit(data(), mixle_estimator(), backend=backend, num_workers=num_workers, **options)
    assert type(result.model).__module__.startswith("mixle."), type(result.model)
    return mixle_signature(result)
