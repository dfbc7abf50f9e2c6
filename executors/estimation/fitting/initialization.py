"""EM starts: k-means++ (the default for mixtures of scalar or vector components), Dirichlet, random.

Every start is drawn from per-chunk generators seeded by ``(seed, chunk id)`` and, for k-means++,
a driver-side k-means on a seeded sample gathered in chunk order, so a start is the same bits on
every backend and every worker count. The k-means++ start is scikit-learn's ``GaussianMixture``
default: k-means centers, each kept row given to its nearest center, one M-step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..em_pass.chunks import (
    EncodedChunk,
    chunk_rng,
    combine_in_chunk_order,
    ordered_sum,
    seed_from,
)
from ..em_pass.runner_protocols import ChunkedHandle, InitializableHandle, SizedHandle
from ..models.combinators import _stacked_kernel

__all__ = [
    "INIT_STRATEGIES",
    "KMEANS_MAX_ITERATIONS",
    "KMEANS_SAMPLE_ROWS",
    "initial_model",
    "kmeans_centers",
    "numeric_features",
    "resolve_init",
]

INIT_STRATEGIES = ("kmeans++", "dirichlet", "random")
"""``init=`` choices: k-means++ centers, Dirichlet responsibilities, one uniform label per row."""

KMEANS_SAMPLE_ROWS = 20_000
"""At most about this many kept rows are gathered to the driver for the k-means of a k-means++ start."""

KMEANS_MAX_ITERATIONS = 100
"""Lloyd iterations after k-means++ seeding (they stop earlier once no label changes)."""

_SAMPLE_SALT = 0x6B6D65616E73
"""Mixed into the seed of the sample thinning, so it is independent of the row-keeping draw."""


def numeric_features(enc: Any) -> np.ndarray | None:
    """The ``(n, d)`` float matrix of an encoded chunk (scalar or vector rows), or None when it has none."""
    if not isinstance(enc, np.ndarray) or not np.issubdtype(enc.dtype, np.floating):
        return None
    if enc.ndim == 1:
        return enc[:, None]
    return enc if enc.ndim == 2 else None


def _mixture_of(estimator: Any) -> Any:
    """One of our mixture estimators itself, or the one inside a wrapper's ``inner``.

    A wrapper holding one of our mixtures as ``inner`` (``ModelParallelEstimator``, the fault-injection
    estimators of the tests) is taken to keep its inner's statistics, so it gets the same start.
    """
    inner = getattr(estimator, "inner", None)
    return inner if type(inner).__name__ == "MixtureEstimator" and hasattr(inner, "make_accumulator") else estimator


def _mixture_parts(estimator: Any) -> tuple[Any, ...] | None:
    """The component estimators of one of our mixtures (None for anything else)."""
    estimator = _mixture_of(estimator)
    estimators = getattr(estimator, "estimators", None)
    if type(estimator).__name__ != "MixtureEstimator" or not hasattr(estimator, "make_accumulator"):
        return None
    return tuple(estimators) if estimators else None


def resolve_init(estimator: Any, init: str | None) -> str:
    """The start asked for: ``init`` checked, or the estimator's own ``init``; ``"auto"`` for a mixture
    left to the default (k-means++ when its rows are scalar or vector floats, else random)."""
    chosen = init if init is not None else getattr(_mixture_of(estimator), "init", None)
    if chosen is None:
        return "auto" if _mixture_parts(estimator) is not None else "random"
    if chosen not in INIT_STRATEGIES:
        raise ValueError(f"init must be one of {', '.join(INIT_STRATEGIES)} (or None for the default), got {chosen!r}")
    if chosen != "random" and _mixture_parts(estimator) is None:
        raise ValueError(f"init={chosen!r} starts a mixture; {type(estimator).__name__} is not one of our "
                         "MixtureEstimators, so use init='random' (or None)")
    return str(chosen)


def _kept(chunk: EncodedChunk, seed: int, p: float) -> tuple[np.random.Generator, np.ndarray]:
    """The chunk's generator and its row-keeping weights (the same draw as the random start)."""
    rng = chunk_rng(seed, chunk.chunk_id)
    weights = (rng.random(chunk.count) < p).astype(np.float64) if p < 1.0 else np.ones(chunk.count)
    return rng, weights


def chunk_feature_sample(chunk: EncodedChunk, payload: tuple[int, float, float]) -> np.ndarray | None:
    """Kept rows of one chunk as features, thinned to the sample rate (None: not numeric)."""
    seed, p, rate = payload
    features = numeric_features(chunk.data)
    if features is None:
        return None
    _, weights = _kept(chunk, seed, p)
    keep = weights > 0.0
    if rate < 1.0:
        thin = chunk_rng(seed ^ _SAMPLE_SALT, chunk.chunk_id).random(chunk.count) < rate
        keep &= thin
    return np.array(features[keep], dtype=np.float64)


def _sq_distances(x: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """(n, k) squared distances ``|x|^2 - 2 x.c + |c|^2`` (clipped at 0), by numpy's own einsum loops
    (no BLAS: the same bits in any process and thread count)."""
    cross = np.einsum("ij,kj->ik", x, centers)
    out = np.einsum("ij,ij->i", x, x)[:, None] - 2.0 * cross + np.einsum("ij,ij->i", centers, centers)[None, :]
    return np.maximum(out, 0.0, out=out)


def _nearest(x: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """Index of the nearest center of every row (``argmin |c|^2 - 2 x.c``)."""
    score = np.einsum("ij,kj->ik", x, centers)
    score *= -2.0
    score += np.einsum("ij,ij->i", centers, centers)[None, :]
    return np.argmin(score, axis=1)


def kmeans_centers(x: np.ndarray, k: int, rng: np.random.Generator,
                   max_iterations: int = KMEANS_MAX_ITERATIONS) -> np.ndarray:
    """k-means++ seeding then Lloyd iterations on the rows of ``x``: the ``(k, d)`` centers."""
    n = x.shape[0]
    if n < k:
        raise ValueError(f"a k-means++ start of {k} components needs at least {k} sampled rows, got {n}; "
                         "raise init_p or use init='random'")
    centers = np.empty((k, x.shape[1]))
    centers[0] = x[int(rng.integers(n))]
    closest = _sq_distances(x, centers[:1])[:, 0]
    trials = 2 + int(np.log(k))  # greedy k-means++ (as scikit-learn): the best of a few D^2 draws
    for c in range(1, k):
        total = float(np.sum(closest))
        if not total > 0.0:
            picks = rng.integers(n, size=trials)
        else:
            picks = np.searchsorted(np.cumsum(closest), rng.random(trials) * total, side="right").clip(0, n - 1)
        candidates = np.minimum(closest[None, :], _sq_distances(x, x[picks]).T)
        best = int(np.argmin(np.sum(candidates, axis=1)))
        centers[c] = x[picks[best]]
        closest = candidates[best]
    labels = _nearest(x, centers)
    for _ in range(max_iterations):
        for c in range(k):
            members = labels == c
            if np.any(members):
                centers[c] = np.sum(x[members], axis=0) / float(np.count_nonzero(members))
        new = _nearest(x, centers)
        if np.array_equal(new, labels):
            break
        labels = new
    return centers


def chunk_labelled_start(chunk: EncodedChunk, payload: tuple[Any, int, float, str, Any]) -> tuple[float, Any]:
    """One chunk's start statistics: kept rows given to components by nearest center or Dirichlet draw."""
    estimator, seed, p, init, centers = payload
    rng, weights = _kept(chunk, seed, p)
    acc = estimator.make_accumulator()
    k = len(acc.accumulators)
    if init == "kmeans++":
        features = numeric_features(chunk.data)
        if features is None:
            raise ValueError(f"chunk {chunk.chunk_id} holds no scalar or vector float rows for a k-means++ start")
        labels = _nearest(features, centers)
        resp = (labels[None, :] == np.arange(k)[:, None]).astype(np.float64)
    else:
        resp = rng.dirichlet(np.ones(k), size=chunk.count).T if chunk.count else np.zeros((k, 0))
    resp *= weights[None, :]
    acc.counts += np.sum(resp, axis=1)
    stacked = _stacked_kernel(acc.accumulators, "stacked_update")
    if stacked is not None:  # every component in one pass (the kernels' initialize is a weighted update)
        stacked(acc.accumulators, chunk.data, resp)
    else:
        for j, component in enumerate(acc.accumulators):
            component.initialize(chunk.data, resp[j], rng)
    return float(np.sum(weights)), acc.value()


def _kmeans_sample(handle: ChunkedHandle, estimator: Any, seed: int, p: float) -> np.ndarray | None:
    """The seeded k-means sample gathered in chunk order (None: the rows are not numeric)."""
    rows = max(1, handle.num_rows if isinstance(handle, SizedHandle) else 0)
    rate = min(1.0, KMEANS_SAMPLE_ROWS / (rows * p))
    parts: Sequence[Any] = handle.map_chunks(chunk_feature_sample, (seed, p, rate), estimator)
    if any(part is None for part in parts):
        return None
    return np.concatenate(list(parts), axis=0)


def initial_model(handle: InitializableHandle, estimator: Any, *, init: str | None = None, seed: Any = None,
                  p: float = 0.1) -> tuple[Any, str]:
    """The starting model of ``estimator`` on ``handle``'s data by the ``init`` strategy, and the one used."""
    chosen = resolve_init(estimator, init)
    if chosen not in ("random", "auto") and not isinstance(handle, ChunkedHandle):
        raise ValueError(f"init={chosen!r} needs a handle with map_chunks (ChunkedEncodedData); "
                         f"{type(handle).__name__} only starts from its own pysp_seq_initialize: use init='random'")
    if chosen == "random" or not isinstance(handle, ChunkedHandle):
        return handle.pysp_seq_initialize(estimator, seed, p), "random"
    if not (isinstance(p, (int, float)) and 0.0 < float(p) <= 1.0):
        raise ValueError(f"init_p must be in (0, 1], got {p!r}")
    base = seed_from(seed)
    estimator = _mixture_of(estimator)
    k = len(_mixture_parts(estimator) or ())
    centers = None
    if chosen in ("kmeans++", "auto"):
        sample = _kmeans_sample(handle, estimator, base, float(p))
        if sample is not None and sample.shape[0] < k:  # tiny data or a small init_p: sample every row
            p = 1.0
            sample = _kmeans_sample(handle, estimator, base, 1.0)
        if sample is None and chosen == "auto":
            return handle.pysp_seq_initialize(estimator, seed, p), "random"
        if sample is None:
            raise ValueError(f"init='kmeans++' needs scalar or vector float rows; {type(estimator).__name__}'s "
                             "encoding is not one, so use init='dirichlet' or init='random'")
        chosen = "kmeans++"
        centers = kmeans_centers(sample, k, chunk_rng(base ^ _SAMPLE_SALT, -1 & 0xFFFFFFFF))
    results = handle.map_chunks(chunk_labelled_start, (estimator, base, float(p), chosen, centers), estimator)
    nobs = ordered_sum([r[0] for r in results])
    if nobs == 0.0 and chosen == "dirichlet":
        results = handle.map_chunks(chunk_labelled_start, (estimator, base, 1.0, chosen, None), estimator)
        nobs = ordered_sum([r[0] for r in results])
    return estimator.estimate(nobs, combine_in_chunk_order(estimator, [r[1] for r in results])), chosen
