"""Canonical digests of numbers, arrays, tensors and nested containers (the audit's checksums).

The digest covers dtype, shape and the raw bytes (little-endian), so any single bit flip changes
it; mappings are hashed in sorted key order. torch is never imported: tensors are read through
their methods (``detach().cpu()``; bfloat16 is read as its 16-bit pattern).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np


def _tensor_array(value: Any) -> tuple[np.ndarray, str]:
    tensor = value.detach()
    if hasattr(tensor, "full_tensor"):
        tensor = tensor.full_tensor()
    tensor = tensor.cpu().contiguous()
    dtype = str(tensor.dtype).replace("torch.", "")
    if dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import torch

        width = {"bfloat16": torch.int16}.get(dtype, torch.int8)
        return tensor.view(width).numpy(), dtype
    return tensor.numpy(), dtype


def _little_endian_bytes(array: np.ndarray) -> np.ndarray:
    """The array's little-endian bytes as a flat uint8 view (no copy on a little-endian host)."""
    flat = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).reshape(-1)
    return flat.view(np.uint8)


def _feed(h: hashlib._Hash, value: Any) -> None:
    if hasattr(value, "detach") and hasattr(value, "element_size"):
        array, dtype = _tensor_array(value)
        shape = ",".join(map(str, array.shape))
        h.update(f"T{dtype}:{shape};".encode())
        h.update(_little_endian_bytes(array).data)
    elif isinstance(value, np.ndarray) or isinstance(value, np.generic):
        array = np.asarray(value)
        if array.dtype.kind == "O":
            raise TypeError("cannot digest an object array; convert it to a numeric dtype")
        shape = ",".join(map(str, array.shape))
        h.update(f"A{array.dtype.str}:{shape};".encode())
        h.update(_little_endian_bytes(array).data)
    elif isinstance(value, Mapping):
        h.update(f"D{len(value)};".encode())
        for key in sorted(value, key=str):
            _feed(h, str(key))
            _feed(h, value[key])
    elif isinstance(value, (list, tuple)):
        h.update(f"L{len(value)};".encode())
        for item in value:
            _feed(h, item)
    elif isinstance(value, bool) or value is None:
        h.update(f"B{value!r};".encode())
    elif isinstance(value, int):
        h.update(f"I{value};".encode())
    elif isinstance(value, float):
        h.update(b"F" + struct.pack("<d", value))
    elif isinstance(value, str):
        raw = value.encode("utf-8")
        h.update(f"S{len(raw)};".encode() + raw)
    elif isinstance(value, bytes):
        h.update(f"Y{len(value)};".encode() + value)
    else:
        raise TypeError(f"cannot digest a {type(value).__name__}; use arrays, tensors, numbers, str or containers")


def digest(value: Any) -> str:
    """``sha256:<hex>`` of ``value``'s canonical bytes (any bit flip changes it)."""
    h = hashlib.sha256()
    _feed(h, value)
    return "sha256:" + h.hexdigest()


def max_abs_difference(a: Any, b: Any) -> float:
    """Largest elementwise |a - b| over matching arrays/tensors/containers (inf on a shape or key mismatch)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            return float("inf")
        return max((max_abs_difference(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return float("inf")
        return max((max_abs_difference(x, y) for x, y in zip(a, b)), default=0.0)
    x, y = _float_array(a), _float_array(b)
    if x.shape != y.shape:
        return float("inf")
    if x.size == 0:
        return 0.0
    diff = np.abs(x - y)
    diff = np.where(np.isnan(diff), np.inf, diff)
    return float(diff.max())


def _float_array(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        tensor = value.detach()
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        return tensor.cpu().double().numpy()
    return np.asarray(value, dtype=np.float64)
