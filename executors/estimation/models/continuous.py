"""Univariate continuous models: Gaussian and exponential (vectorized, float64)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ._base import LOG_2PI, AccumulatorFactory, as_weights, weighted_sum

__all__ = [
    "ExponentialAccumulator", "ExponentialDistribution", "ExponentialEstimator", "GaussianAccumulator",
    "GaussianDistribution", "GaussianEstimator", "ScalarEncoder",
]


class ScalarEncoder:
    """Encodes scalar rows as a 1-D float64 array."""

    NUMERIC_ROWS = True
    """Rows are real numbers (``encoded_data`` checks them before any worker starts)."""

    def encode(self, rows: Any) -> np.ndarray:
        """``rows`` -> float64[n]."""
        x = np.asarray(rows, dtype=np.float64)
        if x.ndim != 1:
            x = x.reshape(-1) if x.size == len(rows) else x
        if x.ndim != 1:
            raise ValueError(f"scalar rows expected (a 1-D sequence of numbers), got shape {x.shape}")
        return x

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))


# ---- Gaussian -----------------------------------------------------------------------------------
class GaussianDistribution:
    """N(mu, sigma2) on the real line."""

    stacked_log_density: ClassVar[Callable[[Any, np.ndarray], np.ndarray]]  # set below the stacked kernels

    def __init__(self, mu: float, sigma2: float) -> None:
        mu, sigma2 = float(mu), float(sigma2)
        if not math.isfinite(mu) or not (sigma2 > 0.0 and math.isfinite(sigma2)):
            raise ValueError(f"GaussianDistribution needs a finite mu and a finite sigma2 > 0, got {mu}, {sigma2}")
        self.mu, self.sigma2 = mu, sigma2
        self._c = -0.5 * (LOG_2PI + math.log(sigma2))
        self._h = -0.5 / sigma2

    def log_density(self, x: np.ndarray) -> np.ndarray:
        """Per-row log density."""
        d = x - self.mu
        d *= d
        d *= self._h
        d += self._c
        return d

    def encoder(self) -> ScalarEncoder:
        """The encoder of its rows."""
        return ScalarEncoder()

    def estimator(self, **kwargs: Any) -> GaussianEstimator:
        """A matching estimator."""
        return GaussianEstimator(**kwargs)

    def params(self) -> tuple[float, float]:
        """(mu, sigma2)."""
        return (self.mu, self.sigma2)

    def __repr__(self) -> str:
        return f"GaussianDistribution(mu={self.mu!r}, sigma2={self.sigma2!r})"


class GaussianAccumulator:
    """Statistics (sum w, sum w x, sum w x^2)."""

    stacked_update: ClassVar[Callable[[Any, np.ndarray, np.ndarray], None]]  # set below the stacked kernels

    def __init__(self) -> None:
        self.sw = 0.0
        self.sx = 0.0
        self.sx2 = 0.0

    def update(self, x: np.ndarray, weights: np.ndarray | None, model: Any) -> None:
        """Add weighted rows."""
        w = as_weights(weights, len(x))
        if w is None:
            self.sw += float(len(x))
            self.sx += float(np.sum(x))
            self.sx2 += float(np.einsum("i,i->", x, x))
        else:
            wx = w * x
            self.sw += float(np.sum(w))
            self.sx += float(np.sum(wx))
            self.sx2 += float(np.einsum("i,i->", wx, x))
        return None

    def initialize(self, x: np.ndarray, weights: np.ndarray, rng: np.random.Generator) -> None:
        """Random start: the weighted rows."""
        self.update(x, weights, None)

    def combine(self, stats: tuple[float, float, float]) -> GaussianAccumulator:
        """Add another accumulator's value."""
        self.sw += stats[0]
        self.sx += stats[1]
        self.sx2 += stats[2]
        return self

    def value(self) -> tuple[float, float, float]:
        """Plain-data statistics."""
        return (self.sw, self.sx, self.sx2)

    def from_value(self, stats: tuple[float, float, float]) -> GaussianAccumulator:
        """Load statistics."""
        self.sw, self.sx, self.sx2 = (float(s) for s in stats)
        return self


class GaussianEstimator:
    """M-step of a Gaussian; ``reg_var`` is added to the variance, ``min_var`` floors it."""

    def __init__(self, min_var: float = 1e-12, reg_var: float = 0.0, name: str | None = None) -> None:
        if not (min_var > 0.0) or reg_var < 0.0:
            raise ValueError(f"GaussianEstimator needs min_var > 0 and reg_var >= 0, got {min_var}, {reg_var}")
        self.min_var, self.reg_var, self.name = float(min_var), float(reg_var), name

    def accumulator_factory(self) -> AccumulatorFactory:
        """Factory of empty accumulators."""
        return AccumulatorFactory(self)

    def make_accumulator(self) -> GaussianAccumulator:
        """An empty accumulator."""
        return GaussianAccumulator()

    def encoder(self) -> ScalarEncoder:
        """The encoder of its rows."""
        return ScalarEncoder()

    def estimate(self, nobs: float | None, stats: tuple[float, float, float]) -> GaussianDistribution:
        """Weighted MLE; an empty component (no weight) gets N(0, 1)."""
        sw, sx, sx2 = stats
        if not sw > 0.0:
            return GaussianDistribution(0.0, 1.0)
        mu = sx / sw
        var = max(sx2 / sw - mu * mu, 0.0) + self.reg_var
        return GaussianDistribution(mu, max(var, self.min_var))


# ---- exponential ----------------------------------------------------------------------------------
class ExponentialDistribution:
    """Exponential with rate ``rate`` on x >= 0."""

    def __init__(self, rate: float) -> None:
        rate = float(rate)
        if not (rate > 0.0 and math.isfinite(rate)):
            raise ValueError(f"ExponentialDistribution needs a finite rate > 0, got {rate}")
        self.rate = rate
        self._log_rate = math.log(rate)

    def log_density(self, x: np.ndarray) -> np.ndarray:
        """Per-row log density (-inf below 0)."""
        out = self._log_rate - self.rate * x
        out[x < 0.0] = -np.inf
        return out

    def encoder(self) -> ScalarEncoder:
        """The encoder of its rows."""
        return ScalarEncoder()

    def estimator(self, **kwargs: Any) -> ExponentialEstimator:
        """A matching estimator."""
        return ExponentialEstimator(**kwargs)

    def params(self) -> tuple[float]:
        """(rate,)."""
        return (self.rate,)

    def __repr__(self) -> str:
        return f"ExponentialDistribution(rate={self.rate!r})"


class ExponentialAccumulator:
    """Statistics (sum w, sum w x)."""

    def __init__(self) -> None:
        self.sw = 0.0
        self.sx = 0.0

    def update(self, x: np.ndarray, weights: np.ndarray | None, model: Any) -> None:
        """Add weighted rows."""
        w = as_weights(weights, len(x))
        self.sw += float(len(x)) if w is None else float(np.sum(w))
        self.sx += float(weighted_sum(w, x))
        return None

    def initialize(self, x: np.ndarray, weights: np.ndarray, rng: np.random.Generator) -> None:
        """Random start: the weighted rows."""
        self.update(x, weights, None)

    def combine(self, stats: tuple[float, float]) -> ExponentialAccumulator:
        """Add another accumulator's value."""
        self.sw += stats[0]
        self.sx += stats[1]
        return self

    def value(self) -> tuple[float, float]:
        """Plain-data statistics."""
        return (self.sw, self.sx)

    def from_value(self, stats: tuple[float, float]) -> ExponentialAccumulator:
        """Load statistics."""
        self.sw, self.sx = float(stats[0]), float(stats[1])
        return self


class ExponentialEstimator:
    """M-step of an exponential: rate = sum w / sum w x (``max_rate`` caps all-zero data)."""

    def __init__(self, max_rate: float = 1e12, name: str | None = None) -> None:
        if not max_rate > 0.0:
            raise ValueError(f"ExponentialEstimator needs max_rate > 0, got {max_rate}")
        self.max_rate, self.name = float(max_rate), name

    def accumulator_factory(self) -> AccumulatorFactory:
        """Factory of empty accumulators."""
        return AccumulatorFactory(self)

    def make_accumulator(self) -> ExponentialAccumulator:
        """An empty accumulator."""
        return ExponentialAccumulator()

    def encoder(self) -> ScalarEncoder:
        """The encoder of its rows."""
        return ScalarEncoder()

    def estimate(self, nobs: float | None, stats: tuple[float, float]) -> ExponentialDistribution:
        """Weighted MLE; an empty component gets rate 1."""
        sw, sx = stats
        if not sw > 0.0:
            return ExponentialDistribution(1.0)
        if not sx > 0.0:
            return ExponentialDistribution(self.max_rate)
        return ExponentialDistribution(min(sw / sx, self.max_rate))


# ---- stacked kernels (used by MixtureDistribution when every component is a Gaussian) ----------
def gaussian_stacked_log_density(components: Any, x: np.ndarray) -> np.ndarray:
    """(K, n) log densities of K univariate Gaussians in one vectorized pass."""
    mu = np.array([c.mu for c in components])[:, None]
    h = np.array([c._h for c in components])[:, None]
    c0 = np.array([c._c for c in components])[:, None]
    d = x[None, :] - mu
    d *= d
    d *= h
    d += c0
    return d


def gaussian_stacked_update(accumulators: Any, x: np.ndarray, resp: np.ndarray) -> None:
    """Add (K, n) responsibilities to K Gaussian accumulators with one (K, n) x (n, 2) product."""
    feats = np.empty((2, len(x)))
    feats[0] = x
    np.multiply(x, x, out=feats[1])
    sums = np.einsum("kn,qn->kq", resp, feats)  # (K, 2), numpy's own loops: the same bits at any BLAS thread count
    sw = np.sum(resp, axis=1)
    for k, acc in enumerate(accumulators):
        acc.sw += float(sw[k])
        acc.sx += float(sums[k, 0])
        acc.sx2 += float(sums[k, 1])


GaussianDistribution.stacked_log_density = staticmethod(gaussian_stacked_log_density)
GaussianAccumulator.stacked_update = staticmethod(gaussian_stacked_update)
