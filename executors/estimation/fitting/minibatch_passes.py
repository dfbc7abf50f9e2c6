"""A handle's mini-batch passes and its stochastic EM: E-steps over chosen chunks, the epochs' batches.

:class:`MinibatchPasses` is a base of ``ChunkedEncodedData``: ``handle.stochastic_em(...)`` runs
:func:`~mixle_parallel.executors.estimation.fitting.minibatch.stepwise_em` over the handle's mini-batches
(``minibatch_plan``), each an E-step of whole chunks (``batch_statistics``), through the handle's runner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from ..compat.mixle_interop import adapt_mixle_objects, unwrap_mixle
from ..em_pass.chunks import ChunkResult, chunk_estep
from ..em_pass.runner_protocols import MinibatchHandle
from ..observability.metering import MeteredRunner
from .minibatch import (
    DEFAULT_STEP_EXPONENT,
    DEFAULT_STEP_OFFSET,
    MinibatchSpec,
    batch_plan,
    step_gains,
    stepwise_em,
)

__all__ = ["MinibatchPasses"]


class _MinibatchHost(MinibatchHandle, Protocol):
    """What the mini-batch passes use of the handle they are part of."""

    minibatch: MinibatchSpec
    last_stochastic_fit: Any
    _metered: MeteredRunner

    def _ensure_scattered(self, estimator: Any, model: Any) -> None: ...

    def _bound(self, estimator: Any, model: Any) -> tuple[Any, Any]: ...

    def _epoch_batches(self, epoch: int) -> Iterable[Sequence[int]]: ...

    def minibatch_plan(self, *, epoch: int = 0) -> list[list[int]]: ...


class MinibatchPasses:
    """Mini-batch E-steps and stepwise EM over a handle's chunks (module doc)."""

    last_stochastic_fit: Any
    """The ``StochasticFit`` (model, steps, passes) of the last ``stochastic_em`` call."""

    def batch_statistics(self: _MinibatchHost, estimator: Any, model: Any,
                         chunk_ids: Sequence[int]) -> list[ChunkResult]:
        """E-step results of the chosen chunks, in ascending chunk order (mini-batch EM; collective on SPMD)."""
        self._ensure_scattered(estimator, model)
        estimator, model = self._bound(estimator, model)
        return [ChunkResult(*r) for r in self.map_batch(chunk_estep, (estimator, model), chunk_ids)]

    def map_batch(self: _MinibatchHost, fn: Callable[[Any, Any], Any], payload: Any, chunk_ids: Sequence[int],
                  estimator: Any = None) -> list[Any]:
        """``fn(chunk, payload)`` on the chosen chunks only, in ascending chunk order (a mini-batch)."""
        self._ensure_scattered(estimator, None)
        return self._metered.map_chunks(fn, payload, sorted(int(c) for c in chunk_ids))

    def minibatch_plan(self: _MinibatchHost, *, epoch: int = 0) -> list[list[int]]:
        """The chunk ids of each mini-batch of ``epoch`` under ``self.minibatch`` (a function of the seed, the
        epoch, the batch size and the rows only)."""
        spec = self.minibatch
        return batch_plan(self.num_chunks, self.num_rows, spec.batch_size, shuffle=spec.shuffle, seed=spec.seed,
                          epoch=epoch)

    def stochastic_em(self: _MinibatchHost, estimator: Any, *, epochs: float = 5,
                      schedule: Callable[[int], float] | None = None, init_p: float = 0.2, seed: int = 0,
                      model: Any = None, init: str | None = None, step_exponent: float = DEFAULT_STEP_EXPONENT,
                      step_offset: float = DEFAULT_STEP_OFFSET) -> Any:
        """Stepwise mini-batch EM over ``epochs`` passes of this handle's mini-batches; returns the model.

        Starts from ``model``, else from the first batch (``init`` as ``optimize``'s: k-means++ for mixtures;
        ``init_p``, ``seed``); steps and passes are in
        ``last_stochastic_fit``. ``schedule(t)`` (mixle's) replaces ``(t + step_offset) ** -step_exponent``.
        """
        estimator, model, _ = adapt_mixle_objects(estimator, model, None)
        gains = step_gains(schedule, step_exponent, step_offset)
        fit = stepwise_em(self, estimator, model, self._epoch_batches, epochs=epochs, gains=gains, init_p=init_p,
                          init_seed=seed, init=init)
        self.last_stochastic_fit = fit
        return unwrap_mixle(fit.model)

    def _epoch_batches(self: _MinibatchHost, epoch: int) -> Iterable[Sequence[int]]:
        """The batches stochastic EM takes in ``epoch`` (a subclass may draw them through a data loader)."""
        return self.minibatch_plan(epoch=epoch)
