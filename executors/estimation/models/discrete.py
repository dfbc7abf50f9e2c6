"""Discrete models: Poisson counts and categorical values (vectorized, float64)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._base import AccumulatorFactory, as_weights, weighted_sum

__all__ = [
    "CategoricalAccumulator", "CategoricalDistribution", "CategoricalEncoder", "CategoricalEstimator",
    "PoissonAccumulator", "PoissonDistribution", "PoissonEncoder", "PoissonEstimator",
]


def gammaln(x: np.ndarray) -> np.ndarray:
    """log Gamma(x), through scipy when installed (fast), else the standard library."""
    try:
        from scipy.special import gammaln as scipy_gammaln
    except ImportError:  # scipy is optional: fall back to math.lgamma per element
        return np.vectorize(math.lgamma, otypes=[np.float64])(x)
    return scipy_gammaln(x)


# ---- Poisson ---------------------------------------------------------------------------------------
class PoissonEncoder:
    """Encodes non-negative integer counts as (x float64[n], log(x!) float64[n])."""

    NUMERIC_ROWS = True
    """Rows are real numbers (``encoded_data`` checks them before any worker starts)."""

    def encode(self, rows: Any) -> tuple[np.ndarray, np.ndarray]:
        """Counts -> (x, log x!)."""
        x = np.asarray(rows, dtype=np.float64).reshape(-1)
        if x.size and (np.any(x < 0) or np.any(x != np.floor(x))):
            raise ValueError("Poisson rows must be non-negative integers")
        return x, gammaln(x + 1.0)


class PoissonDistribution:
    """Poisson with mean ``lam`` (``lam == 0`` is the point mass at 0)."""

    def __init__(self, lam: float) -> None:
        lam = float(lam)
        if not (lam >= 0.0 and math.isfinite(lam)):
            raise ValueError(f"PoissonDistribution needs a finite lam >= 0, got {lam}")
        self.lam = lam

    def log_density(self, enc: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Per-row log probability."""
        x, lgx = enc
        if self.lam == 0.0:
            return np.where(x == 0.0, 0.0, -np.inf)
        return x * math.log(self.lam) - self.lam - lgx

    def encoder(self) -> PoissonEncoder:
        """The encoder of its rows."""
        return PoissonEncoder()

    def estimator(self, **kwargs: Any) -> PoissonEstimator:
        """A matching estimator."""
        return PoissonEstimator(**kwargs)

    def params(self) -> tuple[float]:
        """(lam,)."""
        return (self.lam,)

    def __repr__(self) -> str:
        return f"PoissonDistribution(lam={self.lam!r})"


class PoissonAccumulator:
    """Statistics (sum w, sum w x)."""

    def __init__(self) -> None:
        self.sw = 0.0
        self.sx = 0.0

    def update(self, enc: tuple[np.ndarray, np.ndarray], weights: np.ndarray | None, model: Any) -> None:
        """Add weighted rows."""
        x = enc[0]
        w = as_weights(weights, len(x))
        self.sw += float(len(x)) if w is None else float(np.sum(w))
        self.sx += float(weighted_sum(w, x))
        return None

    def initialize(self, enc: tuple[np.ndarray, np.ndarray], weights: np.ndarray, rng: np.random.Generator) -> None:
        """Random start: the weighted rows."""
        self.update(enc, weights, None)

    def combine(self, stats: tuple[float, float]) -> PoissonAccumulator:
        """Add another accumulator's value."""
        self.sw += stats[0]
        self.sx += stats[1]
        return self

    def value(self) -> tuple[float, float]:
        """Plain-data statistics."""
        return (self.sw, self.sx)

    def from_value(self, stats: tuple[float, float]) -> PoissonAccumulator:
        """Load statistics."""
        self.sw, self.sx = float(stats[0]), float(stats[1])
        return self


class PoissonEstimator:
    """M-step of a Poisson: lam = sum w x / sum w (an empty component gets lam 1)."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name

    def accumulator_factory(self) -> AccumulatorFactory:
        """Factory of empty accumulators."""
        return AccumulatorFactory(self)

    def make_accumulator(self) -> PoissonAccumulator:
        """An empty accumulator."""
        return PoissonAccumulator()

    def encoder(self) -> PoissonEncoder:
        """The encoder of its rows."""
        return PoissonEncoder()

    def estimate(self, nobs: float | None, stats: tuple[float, float]) -> PoissonDistribution:
        """Weighted MLE."""
        sw, sx = stats
        return PoissonDistribution(sx / sw if sw > 0.0 else 1.0)


# ---- categorical ----------------------------------------------------------------------------------
def _key(value: Any) -> int | str:
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, str):
        return value
    raise TypeError(
        f"categorical values must be str or int (so statistics stay plain data), got "
        f"{type(value).__name__} ({value!r}); map them to str or int first"
    )


class CategoricalEncoder:
    """Encodes values as (distinct values in first-seen order, index of each row into them)."""

    def encode(self, rows: Any) -> tuple[tuple[Any, ...], np.ndarray]:
        """Values -> (uniques, int64 indices)."""
        arr = np.asarray(rows) if not isinstance(rows, np.ndarray) else rows
        if arr.dtype.kind in "iub" and arr.ndim == 1:
            uniques, inverse = np.unique(arr, return_inverse=True)
            return tuple(_key(u) for u in uniques.tolist()), inverse.astype(np.int64)
        index: dict[Any, int] = {}
        inv = np.fromiter((index.setdefault(_key(v), len(index)) for v in rows), dtype=np.int64, count=len(rows))
        return tuple(index), inv


class CategoricalDistribution:
    """A probability per value; values not in the table get ``default_value`` (0: log -inf)."""

    def __init__(self, probs: Mapping[Any, float], default_value: float = 0.0) -> None:
        self.probs = {_key(k): float(v) for k, v in probs.items()}
        if any(not (p >= 0.0 and math.isfinite(p)) for p in self.probs.values()):
            raise ValueError(f"categorical probabilities must be finite and >= 0, got {self.probs}")
        self.default_value = float(default_value)
        with np.errstate(divide="ignore"):
            self._log = {k: math.log(p) if p > 0 else -math.inf for k, p in self.probs.items()}
            self._log_default = math.log(self.default_value) if self.default_value > 0 else -math.inf

    def log_density(self, enc: tuple[tuple[Any, ...], np.ndarray]) -> np.ndarray:
        """Per-row log probability."""
        uniques, inv = enc
        table = np.array([self._log.get(u, self._log_default) for u in uniques], dtype=np.float64)
        return table[inv] if len(table) else np.zeros(len(inv))

    def encoder(self) -> CategoricalEncoder:
        """The encoder of its rows."""
        return CategoricalEncoder()

    def estimator(self, **kwargs: Any) -> CategoricalEstimator:
        """A matching estimator."""
        return CategoricalEstimator(**kwargs)

    def params(self) -> dict[Any, float]:
        """The probability table."""
        return dict(self.probs)

    def __repr__(self) -> str:
        return f"CategoricalDistribution({self.probs!r})"


class CategoricalAccumulator:
    """Statistics: {value: sum of weights}."""

    def __init__(self) -> None:
        self.counts: dict[Any, float] = {}

    def update(self, enc: tuple[tuple[Any, ...], np.ndarray], weights: np.ndarray | None, model: Any) -> None:
        """Add weighted rows."""
        uniques, inv = enc
        w = as_weights(weights, len(inv))
        sums = np.bincount(inv, weights=w, minlength=len(uniques)).astype(np.float64)
        for u, s in zip(uniques, sums.tolist()):
            self.counts[u] = self.counts.get(u, 0.0) + s
        return None

    def initialize(
        self, enc: tuple[tuple[Any, ...], np.ndarray], weights: np.ndarray, rng: np.random.Generator
    ) -> None:
        """Random start: the weighted rows."""
        self.update(enc, weights, None)

    def combine(self, stats: Mapping[Any, float]) -> CategoricalAccumulator:
        """Add another accumulator's value."""
        for k, v in stats.items():
            self.counts[k] = self.counts.get(k, 0.0) + float(v)
        return self

    def value(self) -> dict[Any, float]:
        """Plain-data statistics."""
        return dict(self.counts)

    def from_value(self, stats: Mapping[Any, float]) -> CategoricalAccumulator:
        """Load statistics."""
        self.counts = {k: float(v) for k, v in stats.items()}
        return self


class CategoricalEstimator:
    """M-step of a categorical: normalized counts, plus ``pseudo_count`` per seen value."""

    def __init__(self, pseudo_count: float = 0.0, default_value: float = 0.0, name: str | None = None) -> None:
        if not pseudo_count >= 0.0:
            raise ValueError(f"pseudo_count must be >= 0, got {pseudo_count}")
        self.pseudo_count, self.default_value, self.name = float(pseudo_count), float(default_value), name

    def accumulator_factory(self) -> AccumulatorFactory:
        """Factory of empty accumulators."""
        return AccumulatorFactory(self)

    def make_accumulator(self) -> CategoricalAccumulator:
        """An empty accumulator."""
        return CategoricalAccumulator()

    def encoder(self) -> CategoricalEncoder:
        """The encoder of its rows."""
        return CategoricalEncoder()

    def estimate(self, nobs: float | None, stats: Mapping[Any, float]) -> CategoricalDistribution:
        """Weighted MLE; an empty component gets a uniform table over the values it saw."""
        keys = sorted(stats, key=lambda k: (isinstance(k, str), k))
        counts = np.array([float(stats[k]) + self.pseudo_count for k in keys])
        total = float(np.sum(counts))
        if not total > 0.0:
            probs = {k: 1.0 / len(keys) for k in keys} if keys else {}
        else:
            probs = {k: c / total for k, c in zip(keys, counts.tolist())}
        return CategoricalDistribution(probs, self.default_value)
