"""The one canonical-bytes walker: a value tree (arrays, numbers, text, containers) to bytes through a layout.

``walk`` does the traversal and the type dispatch once; a ``ByteLayout`` says how each kind of value is
written. Two layouts exist and both are frozen, because their digests are recorded (ledgers, receipts,
audit records): ``STATISTIC_LAYOUT`` here (EM sufficient statistics: ``canonical_statistic_bytes``,
``statistic_digest``) and ``verification.sdc.digest``'s checksum layout (arrays, tensors, containers).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import numpy as np

__all__ = [
    "STATISTIC_LAYOUT", "ByteLayout", "StatisticFormatError", "StatisticLayout", "canonical_statistic_bytes",
    "statistic_digest", "statistics_equal", "walk",
]

Chunk = bytes | memoryview
"""One piece of the output (a memoryview lets an array's bytes go to a hash without a copy)."""


class StatisticFormatError(TypeError):
    """A statistic holds something other than plain data, so it has no canonical bytes."""


class ByteLayout(Protocol):
    """How each kind of value is written; ``walk`` asks ``leaf`` first, then dispatches on the plain kinds."""

    def leaf(self, value: Any, path: str) -> Iterable[Chunk] | None:
        """The bytes of a value this layout writes before the plain dispatch (else None). Not asked about
        values of exactly a plain type (None, bool, int, float, complex, str, bytes, bytearray, dict, tuple,
        list, numpy.ndarray): it must return None for those, or for an ndarray what ``array`` returns."""
        ...

    def none(self) -> Chunk: ...

    def boolean(self, value: bool) -> Chunk: ...

    def integer(self, value: int) -> Chunk: ...

    def floating(self, value: float) -> Chunk: ...

    def complex_number(self, value: complex, path: str) -> Chunk: ...

    def text(self, value: str) -> Chunk: ...

    def blob(self, value: bytes | bytearray, path: str) -> Chunk: ...

    def array(self, value: np.ndarray, path: str) -> Iterable[Chunk]: ...

    def sequence(self, length: int) -> Chunk: ...

    def mapping(self, value: Mapping[Any, Any], path: str) -> tuple[Chunk, list[tuple[Any, Any, str]]]:
        """The mapping's header and its (key as written, value, path of the value) in canonical order."""
        ...

    def unsupported(self, value: Any, path: str) -> Exception: ...


_ARRAY, _SEQUENCE, _OTHER = "array", "sequence", "other"
_PLAIN: dict[type, str] = {np.ndarray: _ARRAY, tuple: _SEQUENCE, list: _SEQUENCE, **{
    t: _OTHER for t in (type(None), bool, int, float, complex, str, bytes, bytearray, dict)}}
"""Exact types whose kind is known without asking the layout's ``leaf`` (a layout's ``leaf`` returns None for
them, or for an ndarray what its ``array`` returns)."""


def walk(value: Any, layout: ByteLayout, emit: Callable[[Chunk], object], path: str = "$") -> None:
    """Feed ``value``'s canonical bytes under ``layout`` to ``emit``, piece by piece, depth first."""
    leaf, array, mapping = layout.leaf, layout.array, layout.mapping  # bound once: the walk is on a hot path

    def visit(value: Any, path: str) -> None:
        kind = _PLAIN.get(type(value))  # exact plain types skip ``leaf`` and the isinstance chain
        if kind is _ARRAY:
            for chunk in array(value, path):
                emit(chunk)
            return
        if kind is _SEQUENCE:
            emit(layout.sequence(len(value)))
            for i, item in enumerate(value):
                visit(item, f"{path}[{i}]")
            return
        special = None if kind is not None else leaf(value, path)
        if special is not None:
            for chunk in special:
                emit(chunk)
        elif value is None:
            emit(layout.none())
        elif isinstance(value, (bool, np.bool_)):
            emit(layout.boolean(bool(value)))
        elif isinstance(value, (int, np.integer)):
            emit(layout.integer(int(value)))
        elif isinstance(value, (float, np.floating)):
            emit(layout.floating(float(value)))
        elif isinstance(value, (complex, np.complexfloating)):
            emit(layout.complex_number(complex(value), path))
        elif isinstance(value, str):
            emit(layout.text(value))
        elif isinstance(value, (bytes, bytearray)):
            emit(layout.blob(value, path))
        elif isinstance(value, np.ndarray):
            for chunk in array(value, path):
                emit(chunk)
        elif isinstance(value, (tuple, list)):
            emit(layout.sequence(len(value)))
            for i, item in enumerate(value):
                visit(item, f"{path}[{i}]")
        elif isinstance(value, Mapping):
            header, items = mapping(value, path)
            emit(header)
            for key, item, item_path in items:
                visit(key, path)
                visit(item, item_path)
        else:
            raise layout.unsupported(value, path)

    visit(value, path)


# ---- the statistic layout (stats-v1) ------------------------------------------------------------
# Every value is a one-byte tag followed by a fixed layout; containers carry their length, so the
# encoding is prefix-free and two statistics have equal bytes iff they are equal bit for bit
# (NaN payloads and the sign of zero included). Arrays are written little-endian, C order.
_TAG_NONE, _TAG_BOOL, _TAG_INT, _TAG_FLOAT, _TAG_STR, _TAG_BYTES = b"N", b"B", b"I", b"F", b"S", b"Y"
_TAG_SEQ, _TAG_MAP, _TAG_ARRAY, _TAG_COMPLEX = b"T", b"M", b"A", b"C"


def _length(n: int) -> bytes:
    return struct.pack("<Q", n)


class StatisticLayout:
    """stats-v1: the tagged, prefix-free layout of EM sufficient statistics (plain data only)."""

    def leaf(self, value: Any, path: str) -> Iterable[Chunk] | None:
        """A numpy float narrower than float64 is written as a 0-d array, so its dtype stays visible."""
        if isinstance(value, np.floating) and value.dtype != np.float64:
            return self.array(np.asarray(value), path)
        return None

    def none(self) -> Chunk:
        """``N``."""
        return _TAG_NONE

    def boolean(self, value: bool) -> Chunk:
        """``B`` and one byte."""
        return _TAG_BOOL + (b"\x01" if value else b"\x00")

    def integer(self, value: int) -> Chunk:
        """``I``, the length, then the shortest signed little-endian bytes."""
        raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
        return _TAG_INT + _length(len(raw)) + raw

    def floating(self, value: float) -> Chunk:
        """``F`` and the IEEE-754 double, little-endian."""
        return _TAG_FLOAT + struct.pack("<d", value)

    def complex_number(self, value: complex, path: str) -> Chunk:
        """``C``, then the real and imaginary doubles."""
        return _TAG_COMPLEX + struct.pack("<dd", value.real, value.imag)

    def text(self, value: str) -> Chunk:
        """``S``, the length, then UTF-8."""
        raw = value.encode("utf-8")
        return _TAG_STR + _length(len(raw)) + raw

    def blob(self, value: bytes | bytearray, path: str) -> Chunk:
        """``Y``, the length, then the bytes."""
        return _TAG_BYTES + _length(len(value)) + bytes(value)

    def array(self, value: np.ndarray, path: str) -> Iterable[Chunk]:
        """``A``, the dtype descriptor, the shape, then the little-endian C-order bytes."""
        if value.dtype.hasobject or value.dtype.fields is not None:
            raise StatisticFormatError(
                f"statistic at {path} is an array of dtype {value.dtype}; only plain numeric/bool "
                "arrays have canonical bytes: convert it (e.g. to tuples) in value()"
            )
        arr = np.ascontiguousarray(value)
        if arr.dtype.itemsize > 1 and arr.dtype.str[0] != "<":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        descr = arr.dtype.str.encode("ascii")
        shape = struct.pack(f"<{arr.ndim}Q", *arr.shape)  # one length per axis
        return (_TAG_ARRAY + _length(len(descr)) + descr + _length(arr.ndim) + shape, arr.tobytes(order="C"))

    def sequence(self, length: int) -> Chunk:
        """``T`` and the length (tuples and lists alike)."""
        return _TAG_SEQ + _length(length)

    def mapping(self, value: Mapping[Any, Any], path: str) -> tuple[Chunk, list[tuple[Any, Any, str]]]:
        """``M`` and the length; str or int keys only, ints first in numeric order, then strs."""
        keys = list(value.keys())
        if not all(isinstance(k, (str, int, np.integer)) and not isinstance(k, bool) for k in keys):
            raise StatisticFormatError(f"statistic dict at {path} has keys other than str/int: {keys!r}")
        # Sort by (kind, key) so int and str keys never compare with each other.
        ordered = sorted(keys, key=lambda k: (0, int(k), "") if not isinstance(k, str) else (1, 0, k))
        items = [(k if isinstance(k, str) else int(k), value[k], f"{path}[{k!r}]") for k in ordered]
        return _TAG_MAP + _length(len(ordered)), items

    def unsupported(self, value: Any, path: str) -> Exception:
        """What a statistic of any other type is refused with."""
        return StatisticFormatError(
            f"statistic at {path} is a {type(value).__name__}; statistics must be plain data "
            "(numpy arrays, floats, ints, bools, str, None, tuples, dicts): return those from value()"
        )


STATISTIC_LAYOUT = StatisticLayout()
"""The layout of :func:`canonical_statistic_bytes`."""


def canonical_statistic_bytes(stats: Any) -> bytes:
    """The canonical, pickle-free byte form of a statistic: equal bytes iff equal bits."""
    out: list[Chunk] = [b"mixle-parallel-stats-v1\x00"]
    walk(stats, STATISTIC_LAYOUT, out.append)
    return b"".join(out)


def statistic_digest(stats: Any) -> str:
    """``sha256:<hex>`` of :func:`canonical_statistic_bytes`; compare shards by this checksum."""
    return "sha256:" + hashlib.sha256(canonical_statistic_bytes(stats)).hexdigest()


def statistics_equal(a: Any, b: Any) -> bool:
    """True when two statistics are bitwise identical (same canonical bytes)."""
    return canonical_statistic_bytes(a) == canonical_statistic_bytes(b)
