"""Stochastic (stepwise, mini-batch) EM on any handle or on rows: the functional front of ``minibatch``.

The method ``handle.stochastic_em(...)`` (every handle; ``backend="lightning"`` draws its batches
through a Lightning ``DataModule``) and :func:`stochastic_em` here run the same core,
:func:`~mixle_parallel.executors.estimation.minibatch.stepwise_em`: Robbins-Monro averaging of
sufficient statistics over runs of whole chunks, the batch order a function of ``(seed, epoch,
batch_size, num_rows)`` only, so every worker count and backend gives the same bits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .api import encoded_data, is_encoded_data_handle
from .minibatch import (
    DEFAULT_STEP_EXPONENT,
    DEFAULT_STEP_OFFSET,
    StochasticFit,
    batch_plan,
    check_minibatch_options,
    scale_statistic,
    step_gains,
    stepwise_em,
)
from .mixle_interop import adapt_mixle_objects

__all__ = ["StochasticFit", "minibatches", "scale_statistic", "stochastic_em"]


def minibatches(handle: Any, batch_size: int | None = None, *, shuffle: bool = True, seed: int = 0,
                epoch: int = 0) -> list[list[int]]:
    """The chunk ids of each mini-batch of one epoch of ``handle``: runs of whole chunks holding about
    ``batch_size`` rows (default: one chunk), in a permutation seeded by ``(seed, epoch)`` (chunk order
    without ``shuffle``)."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be an int >= 1 (rows per mini-batch), got {batch_size!r}")
    return batch_plan(handle.num_chunks, handle.num_rows, batch_size, shuffle=shuffle, seed=seed, epoch=epoch)


def stochastic_em(data: Any, estimator: Any, model: Any = None, *, batch_size: int | None = None,
                  epochs: float = 1.0, shuffle: bool = True, seed: int = 0,
                  step_exponent: float = DEFAULT_STEP_EXPONENT, step_offset: float = DEFAULT_STEP_OFFSET,
                  schedule: Callable[[int], float] | None = None, init_p: float = 0.2, init_seed: int = 0,
                  init: str | None = None, **options: Any) -> StochasticFit:
    """Stepwise EM from ``model`` (None: a start from the first batch) over ``epochs`` passes of mini-batches.

    ``data`` is a handle or rows; rows get a handle through ``encoded_data(**options)`` with
    ``chunk_size=batch_size`` (so a mini-batch is one chunk) unless chunking is given.
    """
    gains = step_gains(schedule, step_exponent, step_offset)
    check_minibatch_options(batch_size, shuffle, seed)
    owned = not is_encoded_data_handle(data)
    if owned:
        if batch_size is not None and "num_chunks" not in options and "chunk_size" not in options:
            options["chunk_size"] = batch_size
        handle = encoded_data(data, estimator=estimator, **options)
    else:
        handle = data
    estimator, model, _ = adapt_mixle_objects(estimator, model, None)
    try:
        def batches(epoch: int) -> list[list[int]]:
            return minibatches(handle, batch_size, shuffle=shuffle, seed=seed, epoch=epoch)

        return stepwise_em(handle, estimator, model, batches, epochs=epochs, gains=gains, init_p=init_p,
                           init_seed=init_seed, init=init)
    finally:
        if owned:
            handle.close()
