"""The EM estimation protocol and the canonical byte form of sufficient statistics.

A model family is four small objects, all plain Python (no base class needed):

* ``Encoder.encode(rows) -> encoded``: turns a slice of raw rows into the vectorized form the
  model reads (numpy arrays, tuples of them, dicts of them). Called once per chunk.
* ``Model`` (a fitted distribution): ``log_density(encoded) -> float64[n]`` per-row log density,
  and ``encoder() -> Encoder``.
* ``Accumulator``: ``initialize(encoded, weights, rng)`` (random start), ``update(encoded,
  weights, model)`` (E-step; returns the per-row log density of ``model`` when it computed it
  anyway, else ``None``), ``combine(stats) -> self`` (adds another accumulator's ``value()``),
  ``value() -> stats`` and ``from_value(stats) -> self``.
* ``Estimator``: ``accumulator_factory().make() -> Accumulator``, ``estimate(nobs, stats) ->
  Model`` (the M-step) and ``encoder() -> Encoder``.

Statistics (``value()``) are plain data only: numpy arrays, Python/numpy floats and ints,
bools, strings, ``None``, tuples/lists and str- or int-keyed dicts of those. That makes them
comparable across processes by :func:`statistic_digest` without pickle.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from .canonical_bytes import (  # re-exported: their home before the one walker
    StatisticFormatError,
    canonical_statistic_bytes,
    statistic_digest,
    statistics_equal,
)

__all__ = [
    "Accumulator", "AccumulatorFactory", "Encoder", "EncodedDataHandle", "EncodedFold", "Estimator", "MemorySized",
    "Model", "StatisticFormatError", "canonical_statistic_bytes", "statistic_digest", "statistics_equal",
]


@runtime_checkable
class Encoder(Protocol):
    """Turns a slice of raw rows into the vectorized data a model reads."""

    def encode(self, rows: Any) -> Any: ...


@runtime_checkable
class Model(Protocol):
    """A fitted distribution: per-row log density over encoded rows, and its encoder."""

    def log_density(self, encoded: Any) -> np.ndarray: ...

    def encoder(self) -> Encoder: ...


@runtime_checkable
class Accumulator(Protocol):
    """Sufficient statistics of one model over weighted encoded rows."""

    def initialize(self, encoded: Any, weights: np.ndarray, rng: np.random.Generator) -> None: ...

    def update(self, encoded: Any, weights: np.ndarray | None, model: Any) -> np.ndarray | None: ...

    def combine(self, stats: Any) -> Accumulator: ...

    def value(self) -> Any: ...

    def from_value(self, stats: Any) -> Accumulator: ...


@runtime_checkable
class AccumulatorFactory(Protocol):
    """Makes empty accumulators (one per chunk, one for the combine)."""

    def make(self) -> Accumulator: ...


@runtime_checkable
class Estimator(Protocol):
    """The M-step of a model family: statistics in, fitted model out."""

    def accumulator_factory(self) -> AccumulatorFactory: ...

    def estimate(self, nobs: float, stats: Any) -> Any: ...

    def encoder(self) -> Encoder: ...


@runtime_checkable
class EncodedDataHandle(Protocol):
    """Encoded data resident on some backend, driven by the EM loop through these methods."""

    def pysp_seq_log_density_sum(self, estimate: Any) -> tuple[float, float]: ...

    def pysp_seq_estimate(self, estimator: Any, prev_estimate: Any) -> Any: ...

    def pysp_seq_initialize(self, estimator: Any, rng: Any, p: float) -> Any: ...

    def close(self) -> None: ...


@runtime_checkable
class EncodedFold(Protocol):
    """mixle's structural fold contract: the four ``pysp_*`` methods a handle answers (no inheritance needed)."""

    def pysp_seq_log_density_sum(self, estimate: Any) -> tuple[float, float]: ...

    def pysp_seq_estimate(self, estimator: Any, prev_estimate: Any) -> Any: ...

    def pysp_seq_initialize(self, estimator: Any, rng: Any, p: float) -> Any: ...

    def pysp_stream_accumulate(self, estimator: Any, model: Any) -> tuple[float, Any]: ...


@runtime_checkable
class MemorySized(Protocol):
    """An object that declares its complete resident footprint in bytes (what the planner sizes by)."""

    def mixle_memory_nbytes(self) -> int: ...
