"""Stochastic (stepwise, mini-batch) EM on any handle or on rows: the functional front of ``minibatch``.

The method ``handle.stochastic_em(...)`` (every handle; ``backend="lightning"`` draws its batches
through a Lightning ``DataModule``) and :func:`stochastic_em` here run the same core,
:func:`~mixle_parallel.executors.estimation.fitting.minibatch.stepwise_em`: Robbins-Monro averaging of
sufficient statistics over runs of whole chunks, the batch order a function of ``(seed, epoch,
batch_size, num_rows)`` only, so every worker count and backend gives the same bits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ..api import handle_for, is_encoded_data_handle, options_from_keywords
from ..compat.mixle_interop import adapt_mixle_objects
from ..em_pass.runner_protocols import MinibatchHandle
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

__all__ = ["StochasticFit", "StochasticOptions", "minibatches", "scale_statistic", "stochastic_em"]


def minibatches(handle: MinibatchHandle, batch_size: int | None = None, *, shuffle: bool = True, seed: int = 0,
                epoch: int = 0) -> list[list[int]]:
    """The chunk ids of each mini-batch of one epoch of ``handle``: runs of whole chunks holding about
    ``batch_size`` rows (default: one chunk), in a permutation seeded by ``(seed, epoch)`` (chunk order
    without ``shuffle``)."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be an int >= 1 (rows per mini-batch), got {batch_size!r}")
    return batch_plan(handle.num_chunks, handle.num_rows, batch_size, shuffle=shuffle, seed=seed, epoch=epoch)


@attrs.frozen(kw_only=True, eq=False)
class StochasticOptions:
    """The options of stepwise mini-batch EM (:func:`stochastic_em`): the batches (``batch_size`` rows,
    ``shuffle``d by ``seed`` each epoch), how long (``epochs`` passes), the step size (``schedule(t)``, else
    ``(t + step_offset) ** -step_exponent``) and the start (``init``, ``init_p``, ``init_seed``)."""

    batch_size: int | None = None
    epochs: float = 1.0
    shuffle: bool = True
    seed: int = 0
    step_exponent: float = DEFAULT_STEP_EXPONENT
    step_offset: float = DEFAULT_STEP_OFFSET
    schedule: Callable[[int], float] | None = None
    init_p: float = 0.2
    init_seed: int = 0
    init: str | None = None

    def __attrs_post_init__(self) -> None:
        check_minibatch_options(self.batch_size, self.shuffle, self.seed)
        step_gains(self.schedule, self.step_exponent, self.step_offset)  # raises for a bad step


STOCHASTIC_OPTIONS = tuple(a.name for a in attrs.fields(StochasticOptions))
"""The keywords of :class:`StochasticOptions`."""


def stochastic_em(data: Any, estimator: Any, model: Any = None, **keywords: Any) -> StochasticFit:
    """Stepwise EM from ``model`` (None: a start from the first batch) over ``epochs`` passes of mini-batches.

    ``keywords`` are made into the options objects at once (``backend=`` aside): the :class:`StochasticOptions` fields
    (``batch_size``, ``epochs``, ``shuffle``, ``seed``, ``step_exponent``, ``step_offset``, ``schedule``,
    ``init_p``, ``init_seed``, ``init``) and, for rows, ``encoded_data``'s options and verification
    controls: ``data`` is a handle (which refuses any of those: its data is already placed) or rows, which
    get a handle with ``chunk_size=batch_size`` (so a mini-batch is one chunk) unless chunking is given.
    """
    run = StochasticOptions(**{k: keywords.pop(k) for k in STOCHASTIC_OPTIONS if k in keywords})
    gains = step_gains(run.schedule, run.step_exponent, run.step_offset)
    backend = keywords.pop("backend", None)
    options, verification = options_from_keywords(keywords)
    owned = not is_encoded_data_handle(data)
    if owned:
        if options.estimator is not None:
            raise ValueError("stochastic_em takes the estimator as its second argument; drop estimator=")
        chunked = options.num_chunks is not None or options.chunk_size is not None
        options = options.replace(estimator=estimator,
                                  chunk_size=run.batch_size if not chunked else options.chunk_size)
    handle, _ = handle_for(data, backend, options, verification)
    estimator, model, _ = adapt_mixle_objects(estimator, model, None)
    try:
        if not isinstance(handle, MinibatchHandle):
            raise TypeError(f"stochastic_em steps through mini-batches of chosen chunks, which a "
                            f"{type(handle).__name__} cannot compute (no batch_statistics/map_batch); pass the rows "
                            "or a handle from encoded_data(...)")
        def batches(epoch: int) -> list[list[int]]:
            return minibatches(handle, run.batch_size, shuffle=run.shuffle, seed=run.seed, epoch=epoch)

        return stepwise_em(handle, estimator, model, batches, epochs=run.epochs, gains=gains, init_p=run.init_p,
                           init_seed=run.init_seed, init=run.init)
    finally:
        if owned:
            handle.close()
