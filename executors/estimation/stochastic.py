"""Stochastic (stepwise, mini-batch) EM on any handle: Robbins-Monro averaging of sufficient statistics.

Stepwise EM (Cappé & Moulines 2009; Liang & Klein 2009): after mini-batch ``B_t`` the running
statistic is ``s_t = (1 - g_t) s_(t-1) + g_t (n / |B_t|) S(B_t; theta_(t-1))`` with the step
``g_t = (t + offset) ** -exponent`` (``0.5 < exponent <= 1``; ``g_1 = 1``), and ``theta_t =
estimate(n, s_t)``. The statistics of EM's exponential families are sums over rows, so scaling
them scales every numeric leaf. A mini-batch is a run of whole chunks, drawn from a permutation of
chunk ids seeded by ``(seed, epoch)`` -- chunk ids do not depend on the workers, and a batch's
chunks are folded in chunk order -- so the batch order and every bit are the same for any worker
count and backend.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from mixle_parallel.executors.estimation.api import encoded_data, is_encoded_data_handle
from mixle_parallel.executors.estimation.combine_order import fold_group

__all__ = ["StochasticFit", "minibatches", "scale_statistic", "stochastic_em"]


class StochasticFit(NamedTuple):
    """What ``stochastic_em`` returns: the model, the mini-batch steps taken and the data passes used."""

    model: Any
    steps: int
    passes: float


def scale_statistic(stats: Any, factor: float) -> Any:
    """``stats`` with every numeric leaf multiplied by ``factor`` (arrays, floats, ints; tuples, lists, dicts)."""
    if isinstance(stats, np.ndarray):
        return stats * factor if stats.dtype.kind in "fiuc" else stats
    if isinstance(stats, (bool, np.bool_)) or stats is None or isinstance(stats, str):
        return stats
    if isinstance(stats, (int, float, np.number)):
        return float(stats) * factor
    if isinstance(stats, tuple):
        items = [scale_statistic(v, factor) for v in stats]
        return type(stats)(*items) if hasattr(stats, "_fields") else tuple(items)
    if isinstance(stats, list):
        return [scale_statistic(v, factor) for v in stats]
    if isinstance(stats, Mapping):
        return {k: scale_statistic(v, factor) for k, v in stats.items()}
    raise TypeError(f"cannot scale a statistic leaf of type {type(stats).__name__}; stochastic EM needs numeric "
                    "statistics (arrays, floats, tuples, dicts)")


def _add(a: Any, b: Any) -> Any:
    """Leaf-wise ``a + b`` of two statistics of the same structure."""
    if isinstance(a, np.ndarray) or isinstance(a, (int, float, np.number)) and not isinstance(a, bool):
        return a + b
    if isinstance(a, tuple):
        items = [_add(x, y) for x, y in zip(a, b)]
        return type(a)(*items) if hasattr(a, "_fields") else tuple(items)
    if isinstance(a, list):
        return [_add(x, y) for x, y in zip(a, b)]
    if isinstance(a, Mapping):
        return {k: _add(a.get(k, 0.0), b.get(k, 0.0)) for k in sorted({*a, *b}, key=str)}
    return a


def minibatches(handle: Any, batch_size: int | None = None, *, shuffle: bool = True, seed: int = 0,
                epoch: int = 0) -> list[list[int]]:
    """The chunk ids of each mini-batch of one epoch: runs of whole chunks holding about ``batch_size`` rows
    (default: one chunk), in a permutation seeded by ``(seed, epoch)`` (chunk order without ``shuffle``)."""
    n = handle.num_chunks
    rows = handle.num_rows / max(1, n)
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be an int >= 1 (rows per mini-batch), got {batch_size!r}")
    per = 1 if batch_size is None else max(1, round(batch_size / rows)) if rows else 1
    order = (np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch)])).permutation(n)
             if shuffle else np.arange(n))
    return [sorted(int(c) for c in order[i:i + per]) for i in range(0, n, per)]


def _check_step(exponent: float, offset: float) -> None:
    if not 0.5 < float(exponent) <= 1.0:
        raise ValueError(f"step_exponent must be in (0.5, 1] (Robbins-Monro: sum g = inf, sum g^2 < inf), "
                         f"got {exponent!r}")
    if not float(offset) >= 0.0:
        raise ValueError(f"step_offset must be >= 0, got {offset!r}")


def stochastic_em(data: Any, estimator: Any, model: Any, *, batch_size: int | None = None, epochs: float = 1.0,
                  shuffle: bool = True, seed: int = 0, step_exponent: float = 0.6, step_offset: float = 2.0,
                  **options: Any) -> StochasticFit:
    """Stepwise EM from ``model`` over ``epochs`` passes of mini-batches (module doc).

    ``data`` is a handle or rows; rows get a handle through ``encoded_data(**options)`` with
    ``chunk_size=batch_size`` (so a mini-batch is one chunk) unless chunking is given.
    """
    _check_step(step_exponent, step_offset)
    if not float(epochs) > 0:
        raise ValueError(f"epochs must be > 0 (data passes), got {epochs!r}")
    owned = not is_encoded_data_handle(data)
    if owned:
        if batch_size is not None and "num_chunks" not in options and "chunk_size" not in options:
            options["chunk_size"] = batch_size
        handle = encoded_data(data, estimator=estimator, **options)
    else:
        handle = data
    try:
        n = float(handle.num_rows)
        running, steps, seen, epoch = None, 0, 0.0, 0
        while seen < float(epochs) * n:
            for ids in minibatches(handle, batch_size, shuffle=shuffle, seed=seed, epoch=epoch):
                if seen >= float(epochs) * n:
                    break
                results = handle.batch_statistics(estimator, model, ids)
                batch = fold_group(estimator, results)
                steps += 1
                gain = 1.0 if steps == 1 else (steps + float(step_offset)) ** -float(step_exponent)
                scaled = scale_statistic(batch.stats, gain * n / batch.count)
                running = scaled if running is None else _add(scale_statistic(running, 1.0 - gain), scaled)
                model = estimator.estimate(n, running)
                seen += batch.count
            epoch += 1
        return StochasticFit(model, steps, seen / n if n else math.nan)
    finally:
        if owned:
            handle.close()
