"""Canonical digests of numbers, arrays, tensors and nested containers (the audit's checksums).

The bytes are walked by the one walker (``contracts.canonical_bytes.walk``) under this module's layout.

The digest covers dtype, shape and the raw bytes (little-endian), so any single bit flip changes
it; mappings are hashed in sorted key order. torch is never imported: tensors are read through
their methods (``detach().cpu()``; bfloat16 is read as its 16-bit pattern).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ...contracts.canonical_bytes import walk


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


class ChecksumLayout:
    """The audit checksum's layout (``contracts.canonical_bytes.walk`` does the walking): dtype, shape and raw
    little-endian bytes of arrays and tensors, mappings in ``str(key)`` order; frozen, since digests are recorded."""

    def leaf(self, value: Any, path: str) -> Iterable[bytes | memoryview] | None:
        """Tensors (read through their methods) and numpy arrays or scalars, as tagged arrays."""
        if hasattr(value, "detach") and hasattr(value, "element_size"):
            array, dtype = _tensor_array(value)
            return [f"T{dtype}:{','.join(map(str, array.shape))};".encode(), _little_endian_bytes(array).data]
        if isinstance(value, (np.ndarray, np.generic)):
            return self.array(np.asarray(value), path)
        return None

    def none(self) -> bytes:
        """``BNone;``."""
        return b"BNone;"

    def boolean(self, value: bool) -> bytes:
        """``BTrue;`` or ``BFalse;``."""
        return f"B{value!r};".encode()

    def integer(self, value: int) -> bytes:
        """``I<decimal>;``."""
        return f"I{value};".encode()

    def floating(self, value: float) -> bytes:
        """``F`` and the IEEE-754 double, little-endian."""
        return b"F" + struct.pack("<d", value)

    def complex_number(self, value: complex, path: str) -> bytes:
        """Refused: a Python complex has no checksum form (a numpy complex array has)."""
        raise self.unsupported(value, path)

    def text(self, value: str) -> bytes:
        """``S<length>;`` then UTF-8."""
        raw = value.encode("utf-8")
        return f"S{len(raw)};".encode() + raw

    def blob(self, value: bytes | bytearray, path: str) -> bytes:
        """``Y<length>;`` then the bytes (``bytes`` only)."""
        if not isinstance(value, bytes):
            raise self.unsupported(value, path)
        return f"Y{len(value)};".encode() + value

    def array(self, value: np.ndarray, path: str) -> Iterable[bytes | memoryview]:
        """``A<dtype>:<shape>;`` then the little-endian bytes; object arrays are refused."""
        if value.dtype.kind == "O":
            raise TypeError("cannot digest an object array; convert it to a numeric dtype")
        return [f"A{value.dtype.str}:{','.join(map(str, value.shape))};".encode(), _little_endian_bytes(value).data]

    def sequence(self, length: int) -> bytes:
        """``L<length>;`` (lists and tuples alike)."""
        return f"L{length};".encode()

    def mapping(self, value: Mapping[Any, Any], path: str) -> tuple[bytes, list[tuple[Any, Any, str]]]:
        """``D<length>;``, then each ``str(key)`` and value in ``str(key)`` order."""
        return f"D{len(value)};".encode(), [(str(k), value[k], f"{path}[{k!r}]") for k in sorted(value, key=str)]

    def unsupported(self, value: Any, path: str) -> Exception:
        """What any other type is refused with."""
        return TypeError(f"cannot digest a {type(value).__name__}; use arrays, tensors, numbers, str or containers")


CHECKSUM_LAYOUT = ChecksumLayout()
"""The layout of :func:`digest`."""


def digest(value: Any) -> str:
    """``sha256:<hex>`` of ``value``'s canonical bytes (any bit flip changes it)."""
    h = hashlib.sha256()
    walk(value, CHECKSUM_LAYOUT, h.update)
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
