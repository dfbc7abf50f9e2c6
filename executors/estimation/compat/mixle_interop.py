"""Fit mixle (0.8) estimators through our backends: adapters from mixle's seq_* API to our protocol.

``optimize(data, mixle_estimator, backend="mp")`` wraps the estimator automatically and returns
a mixle distribution. The E-step calls mixle's own ``seq_update`` per chunk, so with one chunk
the statistics are mixle's bits, and with many chunks they differ only by summation order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "MixleAccumulator", "MixleAccumulatorFactory", "MixleEncoder", "MixleEstimator", "MixleModel",
    "adapt_mixle_objects", "as_estimator", "is_mixle_estimator", "unwrap_mixle", "wrap_mixle_model",
]


def is_mixle_estimator(obj: Any) -> bool:
    """True for a mixle ParameterEstimator (it has accumulator_factory and mixle's seq_update)."""
    if not (hasattr(obj, "accumulator_factory") and hasattr(obj, "estimate")):
        return False
    try:
        acc = obj.accumulator_factory().make()
    except Exception:  # noqa: BLE001 - not a mixle estimator then
        return False
    return hasattr(acc, "seq_update") and hasattr(acc, "acc_to_encoder")


class MixleEncoder:
    """Encodes rows with a mixle data encoder (``seq_encode``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def encode(self, rows: Any) -> Any:
        """Rows -> mixle's encoded form."""
        return self.inner.seq_encode(rows)


class MixleModel:
    """A mixle distribution seen through our model protocol."""

    def __init__(self, dist: Any) -> None:
        self.dist = dist

    def log_density(self, enc: Any) -> np.ndarray:
        """Per-row log density (mixle's ``seq_log_density``)."""
        return np.asarray(self.dist.seq_log_density(enc), dtype=np.float64)

    def encoder(self) -> MixleEncoder:
        """mixle's encoder for this distribution."""
        return MixleEncoder(self.dist.dist_to_encoder())

    def __repr__(self) -> str:
        return f"MixleModel({self.dist!r})"


class MixleAccumulator:
    """A mixle accumulator seen through our accumulator protocol."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def update(self, enc: Any, weights: np.ndarray | None, model: MixleModel) -> None:
        """mixle's ``seq_update`` (weights of 1 when None)."""
        n = self.inner.acc_to_encoder().row_count(enc) if weights is None else len(weights)
        w = np.ones(n, dtype=np.float64) if weights is None else weights
        self.inner.seq_update(enc, w, model.dist)
        return None

    def initialize(self, enc: Any, weights: np.ndarray, rng: np.random.Generator) -> None:
        """mixle's ``seq_initialize`` with a RandomState drawn from the chunk's generator."""
        self.inner.seq_initialize(enc, weights, np.random.RandomState(int(rng.integers(2**31 - 1))))

    def combine(self, stats: Any) -> MixleAccumulator:
        """mixle's ``combine``."""
        self.inner.combine(stats)
        return self

    def value(self) -> Any:
        """mixle's ``value()`` (tuples of arrays and floats)."""
        return self.inner.value()

    def from_value(self, stats: Any) -> MixleAccumulator:
        """mixle's ``from_value``."""
        self.inner.from_value(stats)
        return self


class MixleAccumulatorFactory:
    """Makes wrapped mixle accumulators."""

    def __init__(self, estimator: Any) -> None:
        self.estimator = estimator

    def make(self) -> MixleAccumulator:
        """A fresh wrapped accumulator."""
        return MixleAccumulator(self.estimator.accumulator_factory().make())


class MixleEstimator:
    """A mixle ParameterEstimator seen through our estimator protocol."""

    def __init__(self, inner: Any) -> None:
        if not is_mixle_estimator(inner):
            raise TypeError(f"{type(inner).__name__} is not a mixle estimator (no seq_update accumulator)")
        self.inner = inner

    def accumulator_factory(self) -> MixleAccumulatorFactory:
        """Factory of wrapped accumulators."""
        return MixleAccumulatorFactory(self.inner)

    def encoder(self) -> MixleEncoder:
        """mixle's encoder for this estimator."""
        return MixleEncoder(self.inner.accumulator_factory().make().acc_to_encoder())

    def estimate(self, nobs: float | None, stats: Any) -> MixleModel:
        """mixle's M-step, after mixle's key merge (shared parameters) as in ``seq_estimate``."""
        acc = self.inner.accumulator_factory().make()
        acc.from_value(stats)
        keyed: dict[Any, Any] = {}
        acc.key_merge(keyed)
        acc.key_replace(keyed)
        return MixleModel(self.inner.estimate(nobs, acc.value()))

    def __repr__(self) -> str:
        return f"MixleEstimator({self.inner!r})"


def wrap_mixle_model(model: Any) -> Any:
    """A mixle distribution wrapped as a MixleModel (anything else unchanged)."""
    if model is None or isinstance(model, MixleModel) or hasattr(model, "log_density") and hasattr(model, "encoder"):
        return model
    return MixleModel(model) if hasattr(model, "seq_log_density") else model


def unwrap_mixle(model: Any) -> Any:
    """The mixle distribution inside a MixleModel (anything else unchanged)."""
    return model.dist if isinstance(model, MixleModel) else model


def as_estimator(estimator: Any) -> Any:
    """Our estimator as is; a mixle estimator wrapped; a distribution prototype turned into its estimator."""
    if estimator is None:
        raise ValueError("optimize needs an estimator (e.g. MixtureEstimator([GaussianEstimator()] * 3))")
    if hasattr(estimator, "accumulator_factory") and hasattr(estimator, "estimate"):
        if hasattr(estimator, "encoder") or hasattr(estimator, "make_accumulator"):
            return estimator
        if is_mixle_estimator(estimator):
            return MixleEstimator(estimator)
        return estimator
    if hasattr(estimator, "estimator") and hasattr(estimator, "log_density"):
        return estimator.estimator()
    if hasattr(estimator, "estimator") and hasattr(estimator, "seq_log_density"):
        return as_estimator(estimator.estimator())  # a mixle distribution prototype
    raise TypeError(
        f"{type(estimator).__name__} is not an estimator: it needs accumulator_factory() and "
        "estimate(nobs, stats) (see docs/estimation.md)"
    )


def adapt_mixle_objects(estimator: Any, model: Any, encoder: Any) -> tuple[Any, Any, Any]:
    """mixle 0.8.2 estimator, distribution and encoder (``seq_*`` protocol) seen through ours; others unchanged."""
    if estimator is not None and not hasattr(estimator, "encoder") and is_mixle_estimator(estimator):
        estimator = MixleEstimator(estimator)
    model = wrap_mixle_model(model)
    if encoder is not None and not hasattr(encoder, "encode") and hasattr(encoder, "seq_encode"):
        encoder = MixleEncoder(encoder)
    return estimator, model, encoder
