"""Fault injection for the EM SDC audit: planned bit flips struck inside the worker that computes a chunk.

``index`` counts the flat numeric elements of a chunk's statistic in order (mappings by sorted key).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ....verification.sdc.inject import flip_bit
from ..em_pass.chunks import ChunkResult, chunk_estep

__all__ = ["chunk_estep_struck", "flip_statistic"]


def _numeric_size(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return int(value.size) if value.dtype.kind in "fiuc" else 0
    if isinstance(value, (float, np.floating)):
        return 1
    if isinstance(value, (tuple, list)):
        return sum(_numeric_size(v) for v in value)
    if isinstance(value, dict):
        return sum(_numeric_size(value[k]) for k in sorted(value, key=str))
    return 0


def _flip_in(value: Any, left: list[int], bit: int) -> Any:
    if left[0] < 0:
        return value
    if isinstance(value, np.ndarray) and value.dtype.kind in "fiuc":
        if left[0] >= value.size:
            left[0] -= value.size
            return value
        out = np.array(value, copy=True, order="C")
        flip_bit(out, left[0], bit % (out.dtype.itemsize * 8))
        left[0] = -1
        return out
    if isinstance(value, (float, np.floating)):
        if left[0]:
            left[0] -= 1
            return value
        box = np.array([value], dtype=np.float64)
        flip_bit(box, 0, bit % 64)
        left[0] = -1
        return float(box[0])
    if isinstance(value, tuple):
        items = [_flip_in(v, left, bit) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, list):
        return [_flip_in(v, left, bit) for v in value]
    if isinstance(value, dict):
        return {k: _flip_in(value[k], left, bit) for k in sorted(value, key=str)}
    return value


def flip_statistic(stats: Any, index: int, bit: int) -> Any:
    """A copy of ``stats`` with ``bit`` of flat numeric element ``index`` (modulo the size) flipped."""
    size = _numeric_size(stats)
    if size == 0:
        raise ValueError("this statistic holds no float or numeric-array element to flip")
    return _flip_in(stats, [int(index) % size], int(bit))


def chunk_estep_struck(chunk: Any, payload: tuple[Any, Any, dict[int, tuple[tuple[int, int], ...]]]) -> ChunkResult:
    """``chunk_estep``, then the planned ``(index, bit)`` flips of this chunk applied to its statistic."""
    estimator, model, flips = payload
    result = chunk_estep(chunk, (estimator, model))
    for index, bit in flips.get(chunk.chunk_id, ()):
        result = result._replace(stats=flip_statistic(result.stats, index, bit))
    return result
