"""Shared pieces of the built-in models: the accumulator factory, weights, deterministic sums.

Products and reductions over rows use numpy's own loops (``np.sum``, ``np.einsum`` without
``optimize``), never BLAS: a threaded BLAS may compute a product differently with its thread count
(measured with OpenBLAS 0.3: a (6, 16384) x (16384, 20) GEMM gave other bits on 2 and 4 threads than
on 1), numpy's loops do not depend on threads or on the arrays' alignment, so a chunk's statistics
are the same bits in any process: an engine's worker with one BLAS thread, the driver with many.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ....contracts.estimation import statistic_digest

LOG_2PI = float(np.log(2.0 * np.pi))

__all__ = ["AccumulatorFactory", "LOG_2PI", "as_weights", "model_digest", "weighted_sum"]


class AccumulatorFactory:
    """Makes empty accumulators of one estimator (picklable: holds only the estimator)."""

    __slots__ = ("estimator",)

    def __init__(self, estimator: Any) -> None:
        self.estimator = estimator

    def make(self) -> Any:
        """A fresh, empty accumulator."""
        return self.estimator.make_accumulator()

    def __reduce__(self) -> Any:
        return (AccumulatorFactory, (self.estimator,))


def as_weights(weights: np.ndarray | None, n: int) -> np.ndarray | None:
    """Validate row weights (None means every row weighs 1)."""
    if weights is None:
        return None
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n,):
        raise ValueError(f"weights must have shape ({n},) to match the rows, got {w.shape}")
    return w


def weighted_sum(w: np.ndarray | None, x: np.ndarray) -> Any:
    """Sum of rows of ``x`` weighted by ``w`` (plain sum when ``w`` is None); no BLAS."""
    if w is None:
        return np.sum(x, axis=0)
    if x.ndim == 1:
        return np.einsum("i,i->", w, x)
    return np.einsum("i,ij->j", w, x)


def model_digest(model: Any) -> str:
    """``sha256:`` digest of a built-in model's parameters (equal digests: same bits)."""
    return statistic_digest(model.params())
