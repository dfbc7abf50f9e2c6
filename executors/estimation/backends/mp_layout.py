"""The ``mp`` backend's shared-memory layout: numeric arrays of the chunks as placeholders (offset, shape,
dtype) into one block, and their zero-copy, read-only views rebuilt in a worker."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["plan_arrays", "rebuild_arrays"]

_ALIGN = 64


class _ShmArray:
    """Placeholder for an array stored in the shared block: offset, shape, dtype."""

    __slots__ = ("offset", "shape", "dtype")

    def __init__(self, offset: int, shape: tuple[int, ...], dtype: str) -> None:
        self.offset, self.shape, self.dtype = offset, shape, dtype

    def __reduce__(self) -> Any:
        return (_ShmArray, (self.offset, self.shape, self.dtype))


def plan_arrays(value: Any, arrays: list[tuple[int, np.ndarray]], cursor: list[int]) -> Any:
    """Replace every numeric array in ``value`` by a placeholder and record where it goes."""
    if isinstance(value, np.ndarray) and not value.dtype.hasobject:
        cursor[0] = -(-cursor[0] // _ALIGN) * _ALIGN
        ref = _ShmArray(cursor[0], tuple(value.shape), value.dtype.str)
        arrays.append((cursor[0], value))
        cursor[0] += value.nbytes
        return ref
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(plan_arrays(v, arrays, cursor) for v in value)
    if isinstance(value, list):
        return [plan_arrays(v, arrays, cursor) for v in value]
    if isinstance(value, dict):
        return {k: plan_arrays(v, arrays, cursor) for k, v in value.items()}
    return value


def rebuild_arrays(value: Any, buf: memoryview) -> Any:
    """Inverse of ``plan_arrays`` on a worker: placeholders become read-only views into ``buf``."""
    if isinstance(value, _ShmArray):
        dtype = np.dtype(value.dtype)
        count = int(np.prod(value.shape, dtype=np.int64))
        arr = np.frombuffer(buf, dtype=dtype, count=count, offset=value.offset).reshape(value.shape)
        arr.flags.writeable = False
        return arr
    if isinstance(value, tuple):
        return tuple(rebuild_arrays(v, buf) for v in value)
    if isinstance(value, list):
        return [rebuild_arrays(v, buf) for v in value]
    if isinstance(value, dict):
        return {k: rebuild_arrays(v, buf) for k, v in value.items()}
    return value
