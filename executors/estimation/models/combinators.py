"""Combinators: a mixture over any component type, and a composite over tuple fields."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._base import AccumulatorFactory, as_weights

__all__ = [
    "CompositeAccumulator", "CompositeDistribution", "CompositeEncoder", "CompositeEstimator",
    "MixtureAccumulator", "MixtureDistribution", "MixtureEstimator", "component_log_densities",
    "posterior_from_log_densities",
]


# ---- mixture ---------------------------------------------------------------------------------------
def _stacked_kernel(objects: Sequence[Any], name: str) -> Any:
    """The shared vectorized kernel ``name`` of objects that all have the same type, else None."""
    first = type(objects[0]) if objects else None
    if first is None or not all(type(o) is first for o in objects):
        return None
    return getattr(first, name, None)


def _shared_rows(model: MixtureDistribution, accumulators: Sequence[Any], enc: Any) -> Any:
    """The rows prepared once for an E-step whose stacked kernels share them (``stacked_prepare``, e.g. the
    quadratic features of full-covariance Gaussians), else ``enc`` as it is."""
    prepare = _stacked_kernel(model.components, "stacked_prepare")
    if prepare is None or _stacked_kernel(accumulators, "stacked_prepare") is not prepare:
        return enc
    return prepare(model.components, enc)


def component_log_densities(
    model: MixtureDistribution, enc: Any, components: Sequence[int] | None = None
) -> np.ndarray:
    """(K, n) matrix: log weight + log density of each component (rows are components)."""
    if components is None:
        stacked = _stacked_kernel(model.components, "stacked_log_density")
        if stacked is not None:
            out = stacked(model.components, enc)
            out += model.log_weights[:, None]
            return out
    ids = range(len(model.components)) if components is None else components
    rows = [model.components[k].log_density(enc) + model.log_weights[k] for k in ids]
    return np.stack(rows) if rows else np.empty((0, 0))


def posterior_from_log_densities(ll: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stable log-sum-exp over components: (per-row log density, responsibilities), in place on ``ll``.

    Rows where every component has -inf get log density -inf and zero responsibilities.
    """
    m = ll.max(axis=0)
    dead = None if np.isfinite(np.sum(m)) else ~np.isfinite(m)
    if dead is not None:
        m[dead] = 0.0
    ll -= m
    np.exp(ll, out=ll)
    s = ll.sum(axis=0)
    with np.errstate(divide="ignore"):
        lse = np.log(s)
    lse += m
    if dead is not None:
        s[dead] = 1.0
        lse[dead] = -np.inf
    np.reciprocal(s, out=s)
    ll *= s
    return lse, ll


class MixtureDistribution:
    """A finite mixture of any component models with weights summing to 1 (zeros allowed)."""

    def __init__(self, components: Sequence[Any], weights: Sequence[float] | np.ndarray) -> None:
        self.components = tuple(components)
        w = np.asarray(weights, dtype=np.float64).reshape(-1)
        if len(self.components) == 0 or w.shape != (len(self.components),):
            raise ValueError(
                f"MixtureDistribution needs one weight per component; got {len(self.components)} components "
                f"and weights of shape {w.shape}"
            )
        if not (np.all(w >= 0.0) and np.all(np.isfinite(w)) and w.sum() > 0.0):
            raise ValueError(f"mixture weights must be finite, >= 0 and not all 0, got {w.tolist()}")
        self.weights = w / w.sum() if abs(w.sum() - 1.0) > 1e-12 else w
        with np.errstate(divide="ignore"):
            self.log_weights = np.log(self.weights)

    @property
    def num_components(self) -> int:
        """K."""
        return len(self.components)

    def log_density(self, enc: Any) -> np.ndarray:
        """Per-row log density (stable log-sum-exp)."""
        return posterior_from_log_densities(component_log_densities(self, enc))[0]

    def posterior(self, enc: Any) -> np.ndarray:
        """(n, K) responsibilities."""
        return posterior_from_log_densities(component_log_densities(self, enc))[1].T.copy()

    def encoder(self) -> Any:
        """The components' (shared) encoder."""
        return self.components[0].encoder()

    def estimator(self, **kwargs: Any) -> MixtureEstimator:
        """A matching estimator."""
        return MixtureEstimator([c.estimator() for c in self.components], **kwargs)

    def params(self) -> tuple[Any, ...]:
        """(weights, component params...)."""
        return (self.weights, tuple(c.params() for c in self.components))

    def __repr__(self) -> str:
        return f"MixtureDistribution({list(self.components)!r}, weights={self.weights.tolist()!r})"


class MixtureAccumulator:
    """Statistics (per-component weight sums, per-component statistics)."""

    def __init__(self, accumulators: Sequence[Any]) -> None:
        self.accumulators = list(accumulators)
        self.counts = np.zeros(len(self.accumulators))

    def update(self, enc: Any, weights: np.ndarray | None, model: MixtureDistribution) -> np.ndarray:
        """E-step: responsibilities, component statistics; returns the per-row log density."""
        stacked = _stacked_kernel(self.accumulators, "stacked_update")
        rows = _shared_rows(model, self.accumulators, enc) if stacked is not None else enc
        lse, resp = posterior_from_log_densities(component_log_densities(model, rows))
        w = as_weights(weights, resp.shape[1])
        if w is not None:
            resp *= w
        self.counts += np.sum(resp, axis=1)
        if stacked is not None:
            stacked(self.accumulators, rows, resp)
            return lse
        for k, acc in enumerate(self.accumulators):
            acc.update(enc, resp[k], model.components[k])
        return lse

    def initialize(self, enc: Any, weights: np.ndarray, rng: np.random.Generator) -> None:
        """Random start: each kept row is given to one uniformly drawn component."""
        k = len(self.accumulators)
        labels = rng.integers(0, k, size=len(weights))
        for j, acc in enumerate(self.accumulators):
            wj = weights * (labels == j)
            self.counts[j] += float(np.sum(wj))
            acc.initialize(enc, wj, rng)

    def combine(self, stats: tuple[np.ndarray, tuple[Any, ...]]) -> MixtureAccumulator:
        """Add another accumulator's value."""
        self.counts += stats[0]
        for acc, s in zip(self.accumulators, stats[1]):
            acc.combine(s)
        return self

    def value(self) -> tuple[np.ndarray, tuple[Any, ...]]:
        """Plain-data statistics."""
        return (self.counts.copy(), tuple(acc.value() for acc in self.accumulators))

    def from_value(self, stats: tuple[np.ndarray, tuple[Any, ...]]) -> MixtureAccumulator:
        """Load statistics."""
        self.counts = np.array(stats[0], dtype=np.float64)
        for acc, s in zip(self.accumulators, stats[1]):
            acc.from_value(s)
        return self


class MixtureEstimator:
    """M-step of a mixture: weights from responsibilities, each component by its estimator.

    ``pseudo_count`` adds that weight to every component's count before normalizing (keeps empty
    components alive); ``fixed_weights`` holds the weights fixed; ``init`` is the EM start
    (``"kmeans++"``, ``"dirichlet"`` or ``"random"``; None: k-means++ when the rows are scalar or
    vector floats, as in mixle 0.8.2), used when ``optimize`` is not given ``init=``.
    """

    def __init__(
        self,
        estimators: Sequence[Any],
        fixed_weights: Sequence[float] | None = None,
        pseudo_count: float | None = None,
        name: str | None = None,
        init: str | None = None,
    ) -> None:
        if init is not None and init not in ("kmeans++", "dirichlet", "random"):
            raise ValueError(f"MixtureEstimator: init must be 'kmeans++', 'dirichlet', 'random' or None, got {init!r}")
        self.init = init
        self.estimators = list(estimators)
        if not self.estimators:
            raise ValueError("MixtureEstimator needs at least one component estimator")
        self.fixed_weights = None if fixed_weights is None else np.asarray(fixed_weights, dtype=np.float64)
        if pseudo_count is not None and not pseudo_count >= 0.0:
            raise ValueError(f"pseudo_count must be >= 0, got {pseudo_count}")
        self.pseudo_count = pseudo_count
        self.name = name

    def accumulator_factory(self) -> AccumulatorFactory:
        """Factory of empty accumulators."""
        return AccumulatorFactory(self)

    def make_accumulator(self) -> MixtureAccumulator:
        """An empty accumulator."""
        return MixtureAccumulator([e.accumulator_factory().make() for e in self.estimators])

    def encoder(self) -> Any:
        """The components' (shared) encoder."""
        return self.estimators[0].encoder()

    def estimate(self, nobs: float | None, stats: tuple[np.ndarray, tuple[Any, ...]]) -> MixtureDistribution:
        """Weighted MLE of weights and components."""
        counts, comp_stats = stats
        comps = [e.estimate(c, s) for e, c, s in zip(self.estimators, counts, comp_stats)]
        if self.fixed_weights is not None:
            return MixtureDistribution(comps, self.fixed_weights)
        c = np.asarray(counts, dtype=np.float64)
        if self.pseudo_count is not None:
            c = c + self.pseudo_count
        total = float(np.sum(c))
        w = c / total if total > 0.0 else np.full(len(comps), 1.0 / len(comps))
        return MixtureDistribution(comps, w)


# ---- composite -------------------------------------------------------------------------------------
class CompositeEncoder:
    """Encodes tuple rows field by field with each field's encoder."""

    def __init__(self, encoders: Sequence[Any]) -> None:
        self.encoders = tuple(encoders)

    def encode(self, rows: Any) -> tuple[Any, ...]:
        """Rows of ``len(encoders)`` fields -> a tuple of per-field encodings."""
        columns: list[Any]  # per field: an array column, or a tuple of the field's values
        if isinstance(rows, np.ndarray) and rows.ndim == 2:
            columns = [rows[:, i] for i in range(rows.shape[1])]
        else:
            columns = list(zip(*rows)) if len(rows) else [() for _ in self.encoders]
        if len(columns) != len(self.encoders):
            raise ValueError(f"composite rows must have {len(self.encoders)} fields, got {len(columns)}")
        return tuple(e.encode(list(c) if isinstance(c, tuple) else c) for e, c in zip(self.encoders, columns))


class CompositeDistribution:
    """Independent fields: the log density is the sum of the fields' log densities."""

    def __init__(self, dists: Sequence[Any]) -> None:
        self.dists = tuple(dists)
        if not self.dists:
            raise ValueError("CompositeDistribution needs at least one field distribution")

    def log_density(self, enc: tuple[Any, ...]) -> np.ndarray:
        """Per-row log density."""
        out = self.dists[0].log_density(enc[0])
        for d, e in zip(self.dists[1:], enc[1:]):
            out = out + d.log_density(e)
        return out

    def encoder(self) -> CompositeEncoder:
        """Field-by-field encoder."""
        return CompositeEncoder([d.encoder() for d in self.dists])

    def estimator(self, **kwargs: Any) -> CompositeEstimator:
        """A matching estimator."""
        return CompositeEstimator([d.estimator() for d in self.dists], **kwargs)

    def params(self) -> tuple[Any, ...]:
        """Per-field params."""
        return tuple(d.params() for d in self.dists)

    def __repr__(self) -> str:
        return f"CompositeDistribution({list(self.dists)!r})"


class CompositeAccumulator:
    """Statistics: a tuple of per-field statistics."""

    def __init__(self, accumulators: Sequence[Any]) -> None:
        self.accumulators = list(accumulators)

    def update(self, enc: tuple[Any, ...], weights: np.ndarray | None, model: CompositeDistribution) -> None:
        """Add weighted rows to every field."""
        dists = model.dists if model is not None else (None,) * len(self.accumulators)
        for acc, e, d in zip(self.accumulators, enc, dists):
            acc.update(e, weights, d)
        return None

    def initialize(self, enc: tuple[Any, ...], weights: np.ndarray, rng: np.random.Generator) -> None:
        """Random start of every field with the same row weights."""
        for acc, e in zip(self.accumulators, enc):
            acc.initialize(e, weights, rng)

    def combine(self, stats: tuple[Any, ...]) -> CompositeAccumulator:
        """Add another accumulator's value."""
        for acc, s in zip(self.accumulators, stats):
            acc.combine(s)
        return self

    def value(self) -> tuple[Any, ...]:
        """Plain-data statistics."""
        return tuple(acc.value() for acc in self.accumulators)

    def from_value(self, stats: tuple[Any, ...]) -> CompositeAccumulator:
        """Load statistics."""
        for acc, s in zip(self.accumulators, stats):
            acc.from_value(s)
        return self


class CompositeEstimator:
    """M-step of a composite: each field by its own estimator."""

    def __init__(self, estimators: Sequence[Any], name: str | None = None) -> None:
        self.estimators = list(estimators)
        if not self.estimators:
            raise ValueError("CompositeEstimator needs at least one field estimator")
        self.name = name

    def accumulator_factory(self) -> AccumulatorFactory:
        """Factory of empty accumulators."""
        return AccumulatorFactory(self)

    def make_accumulator(self) -> CompositeAccumulator:
        """An empty accumulator."""
        return CompositeAccumulator([e.accumulator_factory().make() for e in self.estimators])

    def encoder(self) -> CompositeEncoder:
        """Field-by-field encoder."""
        return CompositeEncoder([e.encoder() for e in self.estimators])

    def estimate(self, nobs: float | None, stats: tuple[Any, ...]) -> CompositeDistribution:
        """Each field's M-step."""
        return CompositeDistribution([e.estimate(nobs, s) for e, s in zip(self.estimators, stats)])
