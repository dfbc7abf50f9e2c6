"""The one stochastic (stepwise, mini-batch) EM core every backend shares; backends supply batch statistics.

Stepwise EM (Cappé & Moulines 2009; Liang & Klein 2009): after mini-batch ``B_t`` the running
statistic is ``s_t = (1 - g_t) s_(t-1) + g_t (n / |B_t|) S(B_t; theta_(t-1))`` with ``g_1 = 1`` and,
by default, ``g_t = (t + offset) ** -exponent`` (``0.5 < exponent <= 1``), and ``theta_t =
estimate(n, s_t)``. A mini-batch is a run of whole chunks; :func:`batch_plan` draws the runs from a
permutation of chunk ids seeded by ``(seed, epoch)``. Chunk bounds depend only on the rows and the
chunking (``batch_size`` sets ``chunk_size`` when no chunking is given), so the batch order is a
pure function of ``(seed, epoch, batch_size, num_rows)`` and, with a batch's chunks folded in chunk
order, every bit is the same for any worker count and backend. A handle only has to answer
``batch_statistics(estimator, model, chunk_ids)`` (and ``batch_initialize`` for a start).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..em_pass.chunks import chunk_initialize, combine_in_chunk_order, ordered_sum
from ..em_pass.combine_order import fold_group
from ..em_pass.runner_protocols import MinibatchHandle
from .initialization import initial_model

__all__ = [
    "DEFAULT_STEP_EXPONENT",
    "DEFAULT_STEP_OFFSET",
    "MinibatchSpec",
    "StochasticFit",
    "batch_plan",
    "batch_start",
    "epoch_seed",
    "check_minibatch_options",
    "default_batch_size",
    "minibatch_spec",
    "scale_statistic",
    "step_gains",
    "stepwise_em",
]

DEFAULT_STEP_EXPONENT = 0.6
DEFAULT_STEP_OFFSET = 2.0
"""The default step ``g_t = (t + 2) ** -0.6`` (``g_1 = 1``)."""


class StochasticFit(NamedTuple):
    """What stochastic EM returns: the model, the mini-batch steps taken and the data passes used."""

    model: Any
    steps: int
    passes: float


class MinibatchSpec(NamedTuple):
    """A handle's mini-batching: rows per batch (None: one chunk), whether to shuffle, the order's seed."""

    batch_size: int | None = None
    shuffle: bool = True
    seed: int = 0


def _exact_int(value: Any, name: str, minimum: int, what: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be an int >= {minimum} ({what}), got the bool {value!r}")
    try:
        out = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int >= {minimum} ({what}), got {type(value).__name__} {value!r}") from None
    if out < minimum:
        raise ValueError(f"{name} must be an int >= {minimum} ({what}), got {value!r}")
    return int(out)


def check_minibatch_options(batch_size: Any = None, shuffle: Any = None, seed: Any = None) -> None:
    """Raise ``ValueError`` for a bad ``batch_size`` (int >= 1) or ``seed`` (int >= 0), ``TypeError`` for a
    ``shuffle`` that is not a bool (mixle's errors), naming it and what it must be; None means the default."""
    if batch_size is not None:
        _exact_int(batch_size, "batch_size", 1, "rows per mini-batch")
    if shuffle is not None and not isinstance(shuffle, (bool, np.bool_)):
        raise TypeError(f"shuffle must be True or False (shuffle the batch order each epoch), got "
                        f"{type(shuffle).__name__} {shuffle!r}")
    if seed is not None:
        _exact_int(seed, "seed", 0, "the seed of the batch order")


def default_batch_size(num_rows: int) -> int:
    """mixle's default rows per mini-batch: a tenth of the data (at least one row)."""
    return max(1, int(num_rows) // 10)


def minibatch_spec(num_rows: int, batch_size: Any = None, shuffle: Any = None, seed: Any = None,
                   *, resolve_batch: bool = True) -> MinibatchSpec:
    """A checked :class:`MinibatchSpec`: ``shuffle`` None is True, ``seed`` None is 0 and, with
    ``resolve_batch``, ``batch_size`` None is :func:`default_batch_size`."""
    check_minibatch_options(batch_size, shuffle, seed)
    if batch_size is None and resolve_batch:
        batch_size = default_batch_size(num_rows)
    return MinibatchSpec(None if batch_size is None else int(batch_size), True if shuffle is None else bool(shuffle),
                         0 if seed is None else int(seed))


def epoch_seed(seed: int, epoch: int) -> int:
    """The 64-bit seed of one epoch's batch order: a pure function of ``(seed, epoch)``, distinct per epoch
    (NumPy's ``SeedSequence`` mixing, so nearby seeds and epochs give unrelated orders)."""
    return int(np.random.SeedSequence([int(seed), int(epoch)]).generate_state(1, np.uint64)[0])


def batch_plan(num_chunks: int, num_rows: int, batch_size: int | None = None, *, shuffle: bool = True,
               seed: int = 0, epoch: int = 0) -> list[list[int]]:
    """The chunk ids of each mini-batch of one epoch: runs of whole chunks holding about ``batch_size`` rows
    (None: one chunk), drawn from a permutation seeded by ``(seed, epoch)`` (chunk order without ``shuffle``)."""
    check_minibatch_options(batch_size, shuffle, seed)
    epoch = _exact_int(epoch, "epoch", 0, "the data pass")
    n = int(num_chunks)
    rows = num_rows / max(1, n)
    per = 1 if batch_size is None or not rows else max(1, round(batch_size / rows))
    order = (np.random.default_rng(epoch_seed(int(seed), epoch)).permutation(n)
             if shuffle else np.arange(n))
    return [sorted(int(c) for c in order[i:i + per]) for i in range(0, n, per)]


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


def step_gains(schedule: Callable[[int], float] | None = None, step_exponent: float = DEFAULT_STEP_EXPONENT,
               step_offset: float = DEFAULT_STEP_OFFSET) -> Callable[[int], float]:
    """The step size ``g(t)`` of step ``t >= 2`` (``g(1) = 1``): ``schedule(t)`` (mixle's streaming
    schedules, e.g. ``harmonic(0.7)``), else ``(t + step_offset) ** -step_exponent``; a gain outside (0, 1]
    raises ``ValueError`` at the step that produced it."""
    if schedule is None:
        if not 0.5 < float(step_exponent) <= 1.0:
            raise ValueError(f"step_exponent must be in (0.5, 1] (Robbins-Monro: sum g = inf, sum g^2 < inf), "
                             f"got {step_exponent!r}")
        if not float(step_offset) >= 0.0:
            raise ValueError(f"step_offset must be >= 0, got {step_offset!r}")
        exponent, offset = float(step_exponent), float(step_offset)
        return lambda t: (t + offset) ** -exponent
    if not callable(schedule):
        raise TypeError(f"schedule must be a callable step -> gain in (0, 1], got {type(schedule).__name__}")

    def checked(t: int) -> float:
        gain = float(schedule(t))
        if not (math.isfinite(gain) and 0.0 < gain <= 1.0):
            raise ValueError(f"schedule({t}) returned {gain!r}; a step size must be finite and in (0, 1]")
        return gain

    return checked


class _BatchView:
    """One mini-batch of a handle as a handle of its own, for ``initial_model`` (``map_chunks`` on its chunks)."""

    def __init__(self, handle: MinibatchHandle, chunk_ids: Sequence[int]) -> None:
        self.handle, self.ids = handle, sorted(int(c) for c in chunk_ids)
        self.num_rows = sum(handle.bounds[c][1] - handle.bounds[c][0] for c in self.ids)

    def map_chunks(self, fn: Callable[[Any, Any], Any], payload: Any, estimator: Any = None) -> list[Any]:
        return list(self.handle.map_batch(fn, payload, self.ids, estimator))

    def pysp_seq_initialize(self, estimator: Any, rng: Any, p: float) -> Any:
        results = self.map_chunks(chunk_initialize, (estimator, rng, float(p)), estimator)
        nobs = ordered_sum([r[0] for r in results])
        if nobs == 0.0:  # nothing drawn (a small batch and p): start from every row of the batch
            results = self.map_chunks(chunk_initialize, (estimator, rng, 1.0), estimator)
            nobs = ordered_sum([r[0] for r in results])
        return estimator.estimate(nobs, combine_in_chunk_order(estimator, [r[1] for r in results]))


def batch_start(handle: MinibatchHandle, estimator: Any, seed: int, p: float, chunk_ids: Sequence[int],
                init: str | None = None) -> Any:
    """A start drawn from one mini-batch only, by ``optimize``'s ``init`` strategies (k-means++ for mixtures of
    scalar or vector rows, else random with rows kept with probability ``p``); draws from (seed, chunk id)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < float(p) <= 1.0:
        raise ValueError(f"init_p must be in (0, 1], got {p!r}")
    return initial_model(_BatchView(handle, chunk_ids), estimator, init=init, seed=int(seed), p=float(p))[0]


def _check_epochs(epochs: Any) -> float:
    if isinstance(epochs, bool) or not isinstance(epochs, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(epochs)) or not float(epochs) > 0:
        raise ValueError(f"epochs must be a finite number > 0 (data passes), got {epochs!r}")
    return float(epochs)


def stepwise_em(handle: MinibatchHandle, estimator: Any, model: Any,
                batches: Callable[[int], Iterable[Sequence[int]]], *, epochs: float = 1.0,
                gains: Callable[[int], float] | None = None, init_p: float = 0.2, init_seed: int = 0,
                init: str | None = None) -> StochasticFit:
    """Stepwise EM on ``handle`` over ``epochs`` passes; ``batches(epoch)`` yields each batch's chunk ids.

    ``model`` None starts from the first batch (:func:`batch_start`). The handle supplies
    ``batch_statistics(estimator, model, chunk_ids)`` (and ``map_batch`` for the start).
    """
    limit = _check_epochs(epochs)
    gain_of = step_gains() if gains is None else gains
    n = float(handle.num_rows)
    running, steps, seen, epoch = None, 0, 0.0, 0
    while seen < limit * n:
        before = seen
        for ids in batches(epoch):
            if seen >= limit * n:
                break
            if model is None:
                model = batch_start(handle, estimator, init_seed, init_p, ids, init)
            batch = fold_group(estimator, handle.batch_statistics(estimator, model, ids))
            steps += 1
            gain = 1.0 if steps == 1 else gain_of(steps)
            scaled = scale_statistic(batch.stats, gain * n / batch.count)
            running = scaled if running is None else _add(scale_statistic(running, 1.0 - gain), scaled)
            model = estimator.estimate(n, running)
            seen += batch.count
        if seen == before:
            raise RuntimeError(f"epoch {epoch} of stochastic EM yielded no rows; the handle has {handle.num_rows} rows "
                               f"in {handle.num_chunks} chunks")
        epoch += 1
    return StochasticFit(model, steps, seen / n if n else math.nan)
