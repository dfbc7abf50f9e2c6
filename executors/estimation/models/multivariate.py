"""Multivariate Gaussians: diagonal and full covariance (vectorized, float64, no BLAS reductions)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ._base import LOG_2PI, AccumulatorFactory, as_weights

__all__ = [
    "DiagonalGaussianAccumulator", "DiagonalGaussianDistribution", "DiagonalGaussianEstimator",
    "MultivariateGaussianAccumulator", "MultivariateGaussianDistribution", "MultivariateGaussianEstimator",
    "VectorEncoder",
]


class VectorEncoder:
    """Encodes rows of d numbers as a C-contiguous float64[n, d] array."""

    NUMERIC_ROWS = True
    """Rows are real numbers (``encoded_data`` checks them before any worker starts)."""

    def encode(self, rows: Any) -> np.ndarray:
        """Rows -> float64[n, d]."""
        x = np.ascontiguousarray(np.asarray(rows, dtype=np.float64))
        if x.ndim == 1 and len(rows) == 0:
            return x.reshape(0, 0)
        if x.ndim != 2:
            raise ValueError(f"vector rows expected (an n x d array), got shape {x.shape}")
        return x


def _wsums(x: np.ndarray, w: np.ndarray | None) -> tuple[float, np.ndarray, np.ndarray]:
    if w is None:
        return float(len(x)), np.sum(x, axis=0), np.einsum("ij,ij->j", x, x)
    wx = x * w[:, None]
    return float(np.sum(w)), np.sum(wx, axis=0), np.einsum("ij,ij->j", wx, x)


# ---- diagonal -------------------------------------------------------------------------------------
class DiagonalGaussianDistribution:
    """Independent Gaussian coordinates: mean ``mu[d]``, variances ``var[d]``."""

    stacked_log_density: ClassVar[Callable[[Any, np.ndarray], np.ndarray]]  # set below the stacked kernels

    def __init__(self, mu: Any, var: Any) -> None:
        self.mu = np.array(mu, dtype=np.float64).reshape(-1)
        self.var = np.array(var, dtype=np.float64).reshape(-1)
        if self.mu.shape != self.var.shape or not np.all(np.isfinite(self.mu)) or not np.all(self.var > 0):
            raise ValueError("DiagonalGaussianDistribution needs finite mu and var > 0 of the same length")
        self._prec = 1.0 / self.var
        self._c = -0.5 * (len(self.mu) * LOG_2PI + float(np.sum(np.log(self.var))))

    def log_density(self, x: np.ndarray) -> np.ndarray:
        """Per-row log density."""
        d = x - self.mu
        d *= d
        out = np.einsum("ij,j->i", d, self._prec)
        out *= -0.5
        out += self._c
        return out

    def encoder(self) -> VectorEncoder:
        """The encoder of its rows."""
        return VectorEncoder()

    def estimator(self, **kwargs: Any) -> DiagonalGaussianEstimator:
        """A matching estimator."""
        return DiagonalGaussianEstimator(len(self.mu), **kwargs)

    def params(self) -> tuple[np.ndarray, np.ndarray]:
        """(mu, var)."""
        return (self.mu, self.var)

    def __repr__(self) -> str:
        return f"DiagonalGaussianDistribution(mu={self.mu.tolist()!r}, var={self.var.tolist()!r})"


class DiagonalGaussianAccumulator:
    """Statistics (sum w, sum w x [d], sum w x^2 [d])."""

    stacked_update: ClassVar[Callable[[Any, np.ndarray, np.ndarray], None]]  # set below the stacked kernels

    def __init__(self, dim: int) -> None:
        self.sw = 0.0
        self.sx = np.zeros(dim)
        self.sx2 = np.zeros(dim)

    def update(self, x: np.ndarray, weights: np.ndarray | None, model: Any) -> None:
        """Add weighted rows."""
        sw, sx, sx2 = _wsums(x, as_weights(weights, len(x)))
        self.sw += sw
        self.sx += sx
        self.sx2 += sx2
        return None

    def initialize(self, x: np.ndarray, weights: np.ndarray, rng: np.random.Generator) -> None:
        """Random start: the weighted rows."""
        self.update(x, weights, None)

    def combine(self, stats: tuple[float, np.ndarray, np.ndarray]) -> DiagonalGaussianAccumulator:
        """Add another accumulator's value."""
        self.sw += stats[0]
        self.sx += stats[1]
        self.sx2 += stats[2]
        return self

    def value(self) -> tuple[float, np.ndarray, np.ndarray]:
        """Plain-data statistics."""
        return (self.sw, self.sx.copy(), self.sx2.copy())

    def from_value(self, stats: tuple[float, np.ndarray, np.ndarray]) -> DiagonalGaussianAccumulator:
        """Load statistics."""
        self.sw, self.sx, self.sx2 = float(stats[0]), np.array(stats[1], float), np.array(stats[2], float)
        return self


class DiagonalGaussianEstimator:
    """M-step of a diagonal Gaussian of dimension ``dim``; ``reg_var`` added, ``min_var`` floor."""

    def __init__(self, dim: int, min_var: float = 1e-12, reg_var: float = 0.0, name: str | None = None) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"DiagonalGaussianEstimator needs dim >= 1, got {dim!r}")
        self.dim, self.min_var, self.reg_var, self.name = dim, float(min_var), float(reg_var), name

    def accumulator_factory(self) -> AccumulatorFactory:
        """Factory of empty accumulators."""
        return AccumulatorFactory(self)

    def make_accumulator(self) -> DiagonalGaussianAccumulator:
        """An empty accumulator."""
        return DiagonalGaussianAccumulator(self.dim)

    def encoder(self) -> VectorEncoder:
        """The encoder of its rows."""
        return VectorEncoder()

    def estimate(self, nobs: float | None, stats: tuple[float, np.ndarray, np.ndarray]) -> DiagonalGaussianDistribution:
        """Weighted MLE; an empty component gets N(0, I)."""
        sw, sx, sx2 = stats
        if not sw > 0.0:
            return DiagonalGaussianDistribution(np.zeros(self.dim), np.ones(self.dim))
        mu = sx / sw
        var = np.maximum(sx2 / sw - mu * mu, 0.0) + self.reg_var
        return DiagonalGaussianDistribution(mu, np.maximum(var, self.min_var))


# ---- full covariance ----------------------------------------------------------------------------------
class MultivariateGaussianDistribution:
    """Gaussian with mean ``mu[d]`` and positive-definite covariance ``covar[d, d]``."""

    def __init__(self, mu: Any, covar: Any) -> None:
        self.mu = np.array(mu, dtype=np.float64).reshape(-1)
        self.covar = np.array(covar, dtype=np.float64)
        d = len(self.mu)
        if self.covar.shape != (d, d) or not np.all(np.isfinite(self.covar)):
            raise ValueError(f"MultivariateGaussianDistribution needs a finite {d}x{d} covariance")
        try:
            chol = np.linalg.cholesky(self.covar)
        except np.linalg.LinAlgError:
            raise ValueError("MultivariateGaussianDistribution covariance is not positive definite") from None
        self._inv_chol_t = np.ascontiguousarray(np.linalg.inv(chol).T)
        self._c = -0.5 * d * LOG_2PI - float(np.sum(np.log(np.diag(chol))))

    def log_density(self, x: np.ndarray) -> np.ndarray:
        """Per-row log density (Mahalanobis distance through the inverse Cholesky factor)."""
        z = np.einsum("ij,jk->ik", x - self.mu, self._inv_chol_t)
        out = np.einsum("ij,ij->i", z, z)
        out *= -0.5
        out += self._c
        return out

    def encoder(self) -> VectorEncoder:
        """The encoder of its rows."""
        return VectorEncoder()

    def estimator(self, **kwargs: Any) -> MultivariateGaussianEstimator:
        """A matching estimator."""
        return MultivariateGaussianEstimator(len(self.mu), **kwargs)

    def params(self) -> tuple[np.ndarray, np.ndarray]:
        """(mu, covar)."""
        return (self.mu, self.covar)

    def __repr__(self) -> str:
        return f"MultivariateGaussianDistribution(mu={self.mu.tolist()!r}, covar={self.covar.tolist()!r})"


class MultivariateGaussianAccumulator:
    """Statistics (sum w, sum w x [d], sum w x x^T [d, d])."""

    def __init__(self, dim: int) -> None:
        self.sw = 0.0
        self.sx = np.zeros(dim)
        self.sxx = np.zeros((dim, dim))

    def update(self, x: np.ndarray, weights: np.ndarray | None, model: Any) -> None:
        """Add weighted rows."""
        w = as_weights(weights, len(x))
        wx = x if w is None else x * w[:, None]
        self.sw += float(len(x)) if w is None else float(np.sum(w))
        self.sx += np.sum(wx, axis=0)
        self.sxx += np.einsum("ni,nj->ij", wx, x)
        return None

    def initialize(self, x: np.ndarray, weights: np.ndarray, rng: np.random.Generator) -> None:
        """Random start: the weighted rows."""
        self.update(x, weights, None)

    def combine(self, stats: tuple[float, np.ndarray, np.ndarray]) -> MultivariateGaussianAccumulator:
        """Add another accumulator's value."""
        self.sw += stats[0]
        self.sx += stats[1]
        self.sxx += stats[2]
        return self

    def value(self) -> tuple[float, np.ndarray, np.ndarray]:
        """Plain-data statistics."""
        return (self.sw, self.sx.copy(), self.sxx.copy())

    def from_value(self, stats: tuple[float, np.ndarray, np.ndarray]) -> MultivariateGaussianAccumulator:
        """Load statistics."""
        self.sw, self.sx, self.sxx = float(stats[0]), np.array(stats[1], float), np.array(stats[2], float)
        return self


class MultivariateGaussianEstimator:
    """M-step of a full-covariance Gaussian; ``reg_var`` is added to the diagonal."""

    def __init__(self, dim: int, reg_var: float = 1e-9, name: str | None = None) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"MultivariateGaussianEstimator needs dim >= 1, got {dim!r}")
        if not reg_var >= 0.0:
            raise ValueError(f"reg_var must be >= 0, got {reg_var}")
        self.dim, self.reg_var, self.name = dim, float(reg_var), name

    def accumulator_factory(self) -> AccumulatorFactory:
        """Factory of empty accumulators."""
        return AccumulatorFactory(self)

    def make_accumulator(self) -> MultivariateGaussianAccumulator:
        """An empty accumulator."""
        return MultivariateGaussianAccumulator(self.dim)

    def encoder(self) -> VectorEncoder:
        """The encoder of its rows."""
        return VectorEncoder()

    def estimate(
        self, nobs: float | None, stats: tuple[float, np.ndarray, np.ndarray]
    ) -> MultivariateGaussianDistribution:
        """Weighted MLE; an empty or degenerate component gets a covariance made positive definite."""
        sw, sx, sxx = stats
        if not sw > 0.0:
            return MultivariateGaussianDistribution(np.zeros(self.dim), np.eye(self.dim))
        mu = sx / sw
        cov = sxx / sw - np.outer(mu, mu)
        cov = 0.5 * (cov + cov.T) + self.reg_var * np.eye(self.dim)
        jitter = max(self.reg_var, 1e-12)
        for _ in range(12):
            try:
                np.linalg.cholesky(cov)
                break
            except np.linalg.LinAlgError:
                cov = cov + jitter * np.eye(self.dim)
                jitter *= 10.0
        return MultivariateGaussianDistribution(mu, cov)


# ---- stacked kernels (used by MixtureDistribution when every component is a diagonal Gaussian) -----
def diagonal_stacked_log_density(components: Any, x: np.ndarray) -> np.ndarray:
    """(K, n) log densities of K diagonal Gaussians through one matrix product (as scikit-learn)."""
    prec = np.stack([c._prec for c in components])
    mu = np.stack([c.mu for c in components])
    coef = np.concatenate([prec, -2.0 * mu * prec], axis=1)  # (K, 2d)
    feats = np.concatenate([x * x, x], axis=1)  # (n, 2d)
    out = coef @ feats.T
    const = np.array([c._c for c in components]) - 0.5 * np.sum(mu * mu * prec, axis=1)
    out *= -0.5
    out += const[:, None]
    return out


def diagonal_stacked_update(accumulators: Any, x: np.ndarray, resp: np.ndarray) -> None:
    """Add (K, n) responsibilities to K diagonal-Gaussian accumulators with one 2-D matrix product."""
    d = x.shape[1]
    sums = resp @ np.concatenate([x, x * x], axis=1)  # (K, 2d) GEMM
    sw = np.sum(resp, axis=1)
    for k, acc in enumerate(accumulators):
        acc.sw += float(sw[k])
        acc.sx += sums[k, :d]
        acc.sx2 += sums[k, d:]


DiagonalGaussianDistribution.stacked_log_density = staticmethod(diagonal_stacked_log_density)
DiagonalGaussianAccumulator.stacked_update = staticmethod(diagonal_stacked_update)
