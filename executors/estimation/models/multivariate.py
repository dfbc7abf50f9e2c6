"""Multivariate Gaussians: diagonal and full covariance (vectorized, float64, no BLAS: see ``_base``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple

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

    stacked_log_density: ClassVar[Callable[[Any, Any], np.ndarray]]  # set below the stacked kernels
    stacked_prepare: ClassVar[Callable[[Any, np.ndarray], Any]]

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
        prec = np.einsum("ij,kj->ik", self._inv_chol_t, self._inv_chol_t)
        self._prec = 0.5 * (prec + prec.T)
        """The precision matrix (inverse covariance), exactly symmetric."""
        upper = _upper(d)
        self._quad = np.where(upper[0] == upper[1], 1.0, 2.0) * self._prec[upper]
        """The precision's upper triangle, off-diagonal entries doubled: x^T P x = _quad . (x_i x_j, i <= j)."""

    def log_density(self, x: np.ndarray) -> np.ndarray:
        """Per-row log density (Mahalanobis distance through the inverse Cholesky factor)."""
        z = np.einsum("ij,jk->ik", x - self.mu, self._inv_chol_t)
        z *= z
        out = np.sum(z, axis=1)
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

    stacked_update: ClassVar[Callable[[Any, Any, np.ndarray], None]]  # set below the stacked kernels
    stacked_prepare: ClassVar[Callable[[Any, np.ndarray], Any]]

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
    """(K, n) log densities of K diagonal Gaussians through one (K, 2d) x (2d, n) product (as scikit-learn),
    expanded about 0: sum_j prec_j x_j^2 - 2 mu_j prec_j x_j + mu_j^2 prec_j."""
    prec = np.stack([c._prec for c in components])
    mu = np.stack([c.mu for c in components])
    coef = np.concatenate([prec, -2.0 * mu * prec], axis=1)  # (K, 2d)
    coef *= -0.5
    feats = _squares_and_rows(x)
    out = np.einsum("kq,qn->kn", coef, feats)
    const = np.array([c._c for c in components]) - 0.5 * np.sum(mu * mu * prec, axis=1)
    out += const[:, None]
    return out


def _squares_and_rows(x: np.ndarray) -> np.ndarray:
    """(2d, n): the squared coordinates of the rows, then the coordinates."""
    n, d = x.shape
    feats = np.empty((2 * d, n))
    np.copyto(feats[d:], x.T)
    np.multiply(feats[d:], feats[d:], out=feats[:d])
    return feats


def diagonal_stacked_update(accumulators: Any, x: np.ndarray, resp: np.ndarray) -> None:
    """Add (K, n) responsibilities to K diagonal-Gaussian accumulators: one (K, n) x (n, 2d) product."""
    d = x.shape[1]
    sums = np.einsum("kn,qn->kq", resp, _squares_and_rows(x))  # (K, 2d): sum r x^2, sum r x
    sw = np.sum(resp, axis=1)
    for k, acc in enumerate(accumulators):
        acc.sw += float(sw[k])
        acc.sx += sums[k, d:]
        acc.sx2 += sums[k, :d]


DiagonalGaussianDistribution.stacked_log_density = staticmethod(diagonal_stacked_log_density)
DiagonalGaussianAccumulator.stacked_update = staticmethod(diagonal_stacked_update)


# ---- stacked kernels (used by MixtureDistribution when every component is a full-covariance Gaussian) --
@functools.lru_cache(maxsize=64)
def _upper(d: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-major indices of the upper triangle (diagonal included) of a d x d matrix (read-only)."""
    rows, cols = np.triu_indices(d)
    rows.flags.writeable = cols.flags.writeable = False
    return rows, cols


class QuadraticRows(NamedTuple):
    """A chunk's rows prepared once per E-step for the full-covariance kernels: ``feats`` is the
    (d(d+1)/2 + d, n) array of the products (x_i - c_i)(x_j - c_j), i <= j, then the coordinates
    x_i - c_i, about the point ``center``; ``dim`` is d."""

    feats: np.ndarray
    center: np.ndarray
    dim: int


class _Terms(NamedTuple):
    """The components' side of the stacked log density about ``center``: (K, p + d) coefficients of the
    features, already times -1/2, and the (K,) constants."""

    center: np.ndarray
    coef: np.ndarray
    const: np.ndarray


def _terms_about(components: Sequence[Any], center: np.ndarray) -> _Terms:
    """-1/2 (x - mu)^T P (x - mu) + c = coef . features(x - center) + const, for each component."""
    k, d = len(components), len(center)
    p = d * (d + 1) // 2
    m = np.stack([c.mu for c in components]) - center
    pm = np.einsum("kij,kj->ki", np.stack([c._prec for c in components]), m)
    coef = np.empty((k, p + d))
    np.multiply(np.stack([c._quad for c in components]), -0.5, out=coef[:, :p])
    coef[:, p:] = pm
    const = np.array([c._c for c in components]) - 0.5 * np.einsum("ki,ki->k", m, pm)
    return _Terms(center, coef, const)


_LAST_TERMS: list[tuple[Any, _Terms] | None] = [None]
"""The terms of the last components tuple (a model's components are one tuple for every chunk of a pass)."""


def _model_terms(components: Sequence[Any]) -> _Terms:
    """The terms about the components' mean point, made once per model (components tuple) and process."""
    last = _LAST_TERMS[0]
    if last is not None and last[0] is components:
        return last[1]
    center = np.sum(np.stack([c.mu for c in components]), axis=0) / len(components)
    terms = _terms_about(components, center)
    if isinstance(components, tuple):
        _LAST_TERMS[0] = (components, terms)
    return terms


def _rows_about(x: np.ndarray, center: np.ndarray) -> QuadraticRows:
    """The quadratic features of the rows ``x`` about ``center``."""
    n, d = x.shape
    p = d * (d + 1) // 2
    feats = np.empty((p + d, n))
    lin = feats[p:]
    np.subtract(x.T, center[:, None], out=lin)
    for r, (i, j) in enumerate(zip(*_upper(d))):
        np.multiply(lin[i], lin[j], out=feats[r])
    return QuadraticRows(feats, center, d)


def full_stacked_prepare(components: Any, x: np.ndarray) -> QuadraticRows:
    """The features of ``x`` about the components' mean point, shared by the log densities and the statistics."""
    return _rows_about(x, _model_terms(components).center)


def full_stacked_log_density(components: Any, x: np.ndarray | QuadraticRows) -> np.ndarray:
    """(K, n) log densities of K full-covariance Gaussians through one (K, p) x (p, n) product.

    Each Mahalanobis form (x - mu)^T P (x - mu) is expanded about the components' mean point c, so the
    expansion cancels no more than the distances from c carry: the products (x - c)_i (x - c)_j times P's
    upper triangle (off-diagonal doubled), (x - c) times -2 P (mu - c), and (mu - c)^T P (mu - c). P comes
    from each component's Cholesky factor, made once when the component is made (once per M-step).
    """
    terms = _model_terms(components)
    rows = x if isinstance(x, QuadraticRows) else _rows_about(x, terms.center)
    if rows.center is not terms.center:
        terms = _terms_about(components, rows.center)
    out = np.einsum("kq,qn->kn", terms.coef, rows.feats)
    out += terms.const[:, None]
    return out


def full_stacked_update(accumulators: Any, x: np.ndarray | QuadraticRows, resp: np.ndarray) -> None:
    """Add (K, n) responsibilities to K full-covariance accumulators with one (K, n) x (n, p + d) product.

    The sums are taken about the rows' center c and moved to the accumulators' raw moments:
    sum w x = s_c + w c, sum w x x^T = S_c + c s_c^T + s_c c^T + w c c^T."""
    rows = x if isinstance(x, QuadraticRows) else _rows_about(x, np.zeros(x.shape[1]))
    d, c = rows.dim, rows.center
    upper = _upper(d)
    p = len(upper[0])
    sums = np.einsum("kn,qn->kq", resp, rows.feats)  # (K, p + d)
    sw = np.sum(resp, axis=1)
    sxx = np.empty((len(sw), d, d))
    sxx[:, upper[0], upper[1]] = sums[:, :p]
    sxx[:, upper[1], upper[0]] = sums[:, :p]
    sx = sums[:, p:]
    if c.any():
        cs = c[None, :, None] * sx[:, None, :]  # c s_c^T per component
        cs += cs.transpose(0, 2, 1).copy()  # c s^T + s c^T, exactly symmetric
        cs += sw[:, None, None] * (c[:, None] * c[None, :])
        sxx += cs
        sx = sx + sw[:, None] * c
    for k, acc in enumerate(accumulators):
        acc.sw += float(sw[k])
        acc.sx += sx[k]
        acc.sxx += sxx[k]


MultivariateGaussianDistribution.stacked_log_density = staticmethod(full_stacked_log_density)
MultivariateGaussianDistribution.stacked_prepare = staticmethod(full_stacked_prepare)
MultivariateGaussianAccumulator.stacked_update = staticmethod(full_stacked_update)
MultivariateGaussianAccumulator.stacked_prepare = staticmethod(full_stacked_prepare)
