"""Component-parallel EM: a mixture's per-component scoring and statistics on a reused thread pool.

The full model stays resident in every process; only the work over components is threaded. Each
component's log-density row and statistics are computed exactly as in the serial E-step (same
functions, same inputs), and the log-sum-exp across components runs serially, so the result is
bit-identical to serial EM. Composable with any data backend: wrap the estimator and pass it to
``optimize(..., backend=...)``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..backends.backend_declaration import backend_declaration, builtin_declarations, check_backend_options
from ..backends.builtin_backends import BUILTIN_ENCODED_DATA_BACKENDS
from ..backends.local import LocalChunkRunner
from ..compat.mixle_interop import (
    MixleAccumulator,
    MixleEstimator,
    as_estimator,
    unwrap_mixle,
    wrap_mixle_model,
)
from ..em_pass.chunks import EStepResult
from ..handle import ChunkedEncodedData, handle_options
from ..models._base import as_weights
from ..models.combinators import (
    MixtureAccumulator,
    MixtureDistribution,
    _stacked_kernel,
    posterior_from_log_densities,
)

__all__ = [
    "ComponentParallelAccumulator", "ComponentParallelAccumulatorFactory", "ComponentParallelEncodedData",
    "ComponentParallelEstimator", "ModelParallelAccumulator",
    "ModelParallelAccumulatorFactory", "ModelParallelEncodedData", "ModelParallelEstimator",
    "component_parallel_fold", "component_thread_pool", "model_parallel_backend", "model_parallel_fold",
]

_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover
        return max(1, os.cpu_count() or 1)


def component_thread_pool(num_workers: int | None = None) -> ThreadPoolExecutor:
    """The process-wide pool for ``num_workers`` threads: created once, reused by every E-step."""
    n = _default_workers() if num_workers is None else int(num_workers)
    if n < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers!r}")
    with _POOLS_LOCK:
        pool = _POOLS.get(n)
        if pool is None:
            pool = _POOLS[n] = ThreadPoolExecutor(n, thread_name_prefix=f"mixle-em-components-{n}")
        return pool


def model_parallel_fold(
    acc: MixtureAccumulator,
    model: MixtureDistribution,
    enc: Any,
    weights: np.ndarray | None,
    num_workers: int | None = None,
    *,
    parallel_ids: Sequence[int] | None = None,
) -> np.ndarray:
    """Component-parallel E-step of a mixture over one chunk; returns the per-row log density.

    ``parallel_ids`` limits the threaded work to those components (the rest run inline).
    """
    k = len(model.components)
    if _stacked_kernel(model.components, "stacked_log_density") or _stacked_kernel(acc.accumulators, "stacked_update"):
        # A stacked kernel already evaluates every component in one vectorized pass; running it
        # serially is both the fastest path and, trivially, the serial bits.
        return acc.update(enc, weights, model)
    if len(acc.accumulators) != k:
        raise ValueError(f"accumulator has {len(acc.accumulators)} components, model has {k}")
    threaded = set(range(k) if parallel_ids is None else (int(i) for i in parallel_ids))
    pool = component_thread_pool(num_workers)

    def score(j: int) -> np.ndarray:
        return model.components[j].log_density(enc) + model.log_weights[j]

    futures = {j: pool.submit(score, j) for j in range(k) if j in threaded}
    rows = [futures[j].result() if j in futures else score(j) for j in range(k)]
    lse, resp = posterior_from_log_densities(np.stack(rows))
    w = as_weights(weights, resp.shape[1])
    if w is not None:
        resp *= w
    acc.counts += np.sum(resp, axis=1)

    def update(j: int) -> None:
        acc.accumulators[j].update(enc, resp[j], model.components[j])

    done = [pool.submit(update, j) for j in range(k) if j in threaded]
    for j in range(k):
        if j not in threaded:
            update(j)
    for f in done:
        f.result()
    return lse


component_parallel_fold = model_parallel_fold


class ModelParallelAccumulator:
    """Wraps a mixture accumulator so its ``update`` runs component-parallel."""

    def __init__(self, inner: Any, num_workers: int | None) -> None:
        self.inner, self.num_workers = inner, num_workers

    def update(self, enc: Any, weights: np.ndarray | None, model: Any) -> np.ndarray | None:
        """Component-parallel E-step for a mixture; the inner update otherwise."""
        if isinstance(self.inner, MixtureAccumulator) and isinstance(model, MixtureDistribution):
            return model_parallel_fold(self.inner, model, enc, weights, self.num_workers)
        return self.inner.update(enc, weights, model)

    def seq_update(self, enc: Any, weights: np.ndarray | None, model: Any) -> None:
        """mixle's name for :meth:`update` (mixle 0.8.2's ``ModelParallelAccumulator.seq_update``); a mixle
        distribution is taken as is (mixle's own ``optimize``/``seq_estimate`` pass one)."""
        self.update(enc, weights, wrap_mixle_model(model) if isinstance(self.inner, MixleAccumulator) else model)

    def _mixle(self, what: str) -> Any:
        if not isinstance(self.inner, MixleAccumulator):
            raise TypeError(f"{what} is mixle's accumulator protocol; this accumulator wraps "
                            f"{type(self.inner).__name__}, not a mixle accumulator")
        return self.inner.inner

    def seq_initialize(self, enc: Any, weights: np.ndarray, rng: Any) -> None:
        """mixle's ``seq_initialize`` on the wrapped mixle accumulator (mixle's own drivers call it)."""
        self._mixle("seq_initialize").seq_initialize(enc, weights, rng)

    def key_merge(self, stats_dict: dict[Any, Any]) -> None:
        """mixle's keyed-parameter merge on the wrapped mixle accumulator."""
        self._mixle("key_merge").key_merge(stats_dict)

    def key_replace(self, stats_dict: dict[Any, Any]) -> None:
        """mixle's keyed-parameter replace on the wrapped mixle accumulator."""
        self._mixle("key_replace").key_replace(stats_dict)

    def acc_to_encoder(self) -> Any:
        """mixle's data encoder of the wrapped mixle accumulator."""
        return self._mixle("acc_to_encoder").acc_to_encoder()

    def initialize(self, enc: Any, weights: np.ndarray, rng: np.random.Generator) -> None:
        """The inner initialization (serial: it draws from one generator)."""
        self.inner.initialize(enc, weights, rng)

    def combine(self, stats: Any) -> ModelParallelAccumulator:
        """The inner combine."""
        self.inner.combine(stats)
        return self

    def value(self) -> Any:
        """The inner statistics, unchanged."""
        return self.inner.value()

    def from_value(self, stats: Any) -> ModelParallelAccumulator:
        """The inner from_value."""
        self.inner.from_value(stats)
        return self


ComponentParallelAccumulator = ModelParallelAccumulator


class ModelParallelAccumulatorFactory:
    """Makes component-parallel accumulators around the inner estimator's."""

    def __init__(self, inner_factory: Any, num_workers: int | None) -> None:
        self.inner_factory, self.num_workers = inner_factory, num_workers

    def make(self) -> ModelParallelAccumulator:
        """A fresh wrapped accumulator."""
        return ModelParallelAccumulator(self.inner_factory.make(), self.num_workers)


class ModelParallelEstimator:
    """Fully resident component-parallel EM around ``inner`` (its M-step and statistics unchanged)."""

    def __init__(self, inner: Any, num_workers: int | None = None) -> None:
        bad_count = isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1
        if num_workers is not None and bad_count:
            raise ValueError(f"num_workers must be an int >= 1 or None, got {num_workers!r}")
        self.inner, self.num_workers = as_estimator(inner), num_workers  # a mixle estimator is adapted

    def accumulator_factory(self) -> ModelParallelAccumulatorFactory:
        """Wraps the inner estimator's accumulator factory."""
        return ModelParallelAccumulatorFactory(self.inner.accumulator_factory(), self.num_workers)

    def estimate(self, nobs: float | None, stats: Any) -> Any:
        """The inner M-step (a mixle estimator's gives the mixle distribution, for mixle's drivers and ours)."""
        model = self.inner.estimate(nobs, stats)
        return unwrap_mixle(model) if isinstance(self.inner, MixleEstimator) else model

    def encoder(self) -> Any:
        """The inner encoder."""
        return self.inner.encoder()

    def __repr__(self) -> str:
        return f"ModelParallelEstimator({self.inner!r}, num_workers={self.num_workers!r})"


ComponentParallelEstimator = ModelParallelEstimator
ComponentParallelAccumulatorFactory = ModelParallelAccumulatorFactory


class ModelParallelEncodedData(ChunkedEncodedData):
    """A fully resident local handle whose E-step threads a mixture's components.

    mixle's signature ``(data, *, estimator=None, model=None, encoder=None, num_workers=None, **_)``:
    ``num_workers`` are the component threads; the other keywords mixle's ``encoded_data`` passes
    (:class:`EncodedDataOptions`' fields) are accepted when this backend honours them (the chunking)
    and refused, naming them, when set and not honoured; any other keyword is refused.
    """

    def __init__(self, data: Any, *, estimator: Any = None, model: Any = None, encoder: Any = None,
                 num_workers: int | None = None, **mixle_keywords: Any) -> None:
        options = handle_options(None, dict(mixle_keywords, estimator=estimator, model=model, encoder=encoder,
                                            num_workers=num_workers), where="ModelParallelEncodedData")
        declaration = backend_declaration("model_parallel")
        check_backend_options(declaration, options, True, builtin_declarations(BUILTIN_ENCODED_DATA_BACKENDS))
        self.component_workers = num_workers
        super().__init__(LocalChunkRunner(1), data, options.replace(num_workers=None))

    def _wrap(self, estimator: Any) -> Any:
        if isinstance(estimator, ModelParallelEstimator):
            return estimator
        return ModelParallelEstimator(estimator, self.component_workers)

    def estep(self, estimator: Any, model: Any) -> EStepResult:
        """One component-parallel data pass."""
        return super().estep(self._wrap(estimator), model)

    def chunk_statistics(self, estimator: Any, model: Any) -> list[Any]:
        """Per-chunk results of the component-parallel E-step."""
        return super().chunk_statistics(self._wrap(estimator), model)


ComponentParallelEncodedData = ModelParallelEncodedData


def model_parallel_backend(data: Any, **params: Any) -> ModelParallelEncodedData:
    """Factory of the ``model_parallel`` encoded-data backend."""
    return ModelParallelEncodedData(data, **params)


ENCODED_DATA_OPTIONS = frozenset({"num_workers"})
"""The ``encoded_data`` options the model_parallel backend honours besides the handle's own."""

WORKER_PROCESSES = False
"""Component threads inside this process: a world of one process."""


def planned_workers(options: Any) -> int:
    """Component threads: ``num_workers``, else one per local CPU."""
    n = options.num_workers
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"model_parallel num_workers must be an int >= 1, got {n!r}")
    return _default_workers() if n is None else n
