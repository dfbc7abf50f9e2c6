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

import hashlib
import struct
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

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


class StatisticFormatError(TypeError):
    """A statistic holds something other than plain data, so it has no canonical bytes."""


# ---- canonical bytes -------------------------------------------------------------------------
# Every value is a one-byte tag followed by a fixed layout; containers carry their length, so the
# encoding is prefix-free and two statistics have equal bytes iff they are equal bit for bit
# (NaN payloads and the sign of zero included). Arrays are written little-endian, C order.
_TAG_NONE, _TAG_BOOL, _TAG_INT, _TAG_FLOAT, _TAG_STR, _TAG_BYTES = b"N", b"B", b"I", b"F", b"S", b"Y"
_TAG_SEQ, _TAG_MAP, _TAG_ARRAY, _TAG_COMPLEX = b"T", b"M", b"A", b"C"


def _length(n: int) -> bytes:
    return struct.pack("<Q", n)


def _write(value: Any, out: list[bytes], path: str) -> None:
    if value is None:
        out.append(_TAG_NONE)
    elif isinstance(value, (bool, np.bool_)):
        out.append(_TAG_BOOL + (b"\x01" if value else b"\x00"))
    elif isinstance(value, (int, np.integer)):
        raw = int(value).to_bytes((int(value).bit_length() + 8) // 8, "little", signed=True)
        out.append(_TAG_INT + _length(len(raw)) + raw)
    elif isinstance(value, (float, np.floating)):
        if isinstance(value, np.floating) and value.dtype != np.float64:
            _write(np.asarray(value), out, path)  # keep the narrow dtype visible
            return
        out.append(_TAG_FLOAT + struct.pack("<d", float(value)))
    elif isinstance(value, (complex, np.complexfloating)):
        c = complex(value)
        out.append(_TAG_COMPLEX + struct.pack("<dd", c.real, c.imag))
    elif isinstance(value, str):
        raw = value.encode("utf-8")
        out.append(_TAG_STR + _length(len(raw)) + raw)
    elif isinstance(value, (bytes, bytearray)):
        out.append(_TAG_BYTES + _length(len(value)) + bytes(value))
    elif isinstance(value, np.ndarray):
        if value.dtype.hasobject or value.dtype.fields is not None:
            raise StatisticFormatError(
                f"statistic at {path} is an array of dtype {value.dtype}; only plain numeric/bool "
                "arrays have canonical bytes: convert it (e.g. to tuples) in value()"
            )
        arr = np.ascontiguousarray(value)
        if arr.dtype.itemsize > 1 and arr.dtype.str[0] != "<":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        descr = arr.dtype.str.encode("ascii")
        out.append(_TAG_ARRAY + _length(len(descr)) + descr + _length(arr.ndim))
        out.extend(_length(d) for d in arr.shape)
        out.append(arr.tobytes(order="C"))
    elif isinstance(value, (tuple, list)):
        out.append(_TAG_SEQ + _length(len(value)))
        for i, item in enumerate(value):
            _write(item, out, f"{path}[{i}]")
    elif isinstance(value, Mapping):
        keys = list(value.keys())
        if not all(isinstance(k, (str, int, np.integer)) and not isinstance(k, bool) for k in keys):
            raise StatisticFormatError(f"statistic dict at {path} has keys other than str/int: {keys!r}")
        # Sort by (kind, key) so int and str keys never compare with each other.
        ordered = sorted(keys, key=lambda k: (0, int(k), "") if not isinstance(k, str) else (1, 0, k))
        out.append(_TAG_MAP + _length(len(ordered)))
        for k in ordered:
            _write(k if isinstance(k, str) else int(k), out, path)
            _write(value[k], out, f"{path}[{k!r}]")
    else:
        raise StatisticFormatError(
            f"statistic at {path} is a {type(value).__name__}; statistics must be plain data "
            "(numpy arrays, floats, ints, bools, str, None, tuples, dicts): return those from value()"
        )


def canonical_statistic_bytes(stats: Any) -> bytes:
    """The canonical, pickle-free byte form of a statistic: equal bytes iff equal bits."""
    out: list[bytes] = [b"mixle-parallel-stats-v1\x00"]
    _write(stats, out, "$")
    return b"".join(out)


def statistic_digest(stats: Any) -> str:
    """``sha256:<hex>`` of :func:`canonical_statistic_bytes`; compare shards by this checksum."""
    return "sha256:" + hashlib.sha256(canonical_statistic_bytes(stats)).hexdigest()


def statistics_equal(a: Any, b: Any) -> bool:
    """True when two statistics are bitwise identical (same canonical bytes)."""
    return canonical_statistic_bytes(a) == canonical_statistic_bytes(b)

