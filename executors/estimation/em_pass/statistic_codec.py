"""Read back the canonical statistic bytes (``contracts.estimation.canonical_statistic_bytes``), no pickle.

``statistic_from_bytes(canonical_statistic_bytes(s))`` has the bits of ``s``; sequences come back
as tuples (the byte form does not tell lists from tuples) and arrays as read-only-free copies.
Mid-fit checkpoints (``resilient_em``) store statistics this way.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

__all__ = ["statistic_from_bytes"]

_MAGIC = b"mixle-parallel-stats-v1\x00"


class _Reader:
    def __init__(self, raw: bytes) -> None:
        self.raw, self.at = raw, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.raw):
            raise ValueError(f"statistic bytes end early at byte {self.at} (wanted {n} more)")
        out = self.raw[self.at:self.at + n]
        self.at += n
        return out

    def length(self) -> int:
        return int(struct.unpack("<Q", self.take(8))[0])

    def value(self) -> Any:
        tag = self.take(1)
        if tag == b"N":
            return None
        if tag == b"B":
            return self.take(1) == b"\x01"
        if tag == b"I":
            return int.from_bytes(self.take(self.length()), "little", signed=True)
        if tag == b"F":
            return float(struct.unpack("<d", self.take(8))[0])
        if tag == b"C":
            re, im = struct.unpack("<dd", self.take(16))
            return complex(re, im)
        if tag == b"S":
            return self.take(self.length()).decode("utf-8")
        if tag == b"Y":
            return self.take(self.length())
        if tag == b"A":
            dtype = np.dtype(self.take(self.length()).decode("ascii"))
            shape = tuple(self.length() for _ in range(self.length()))
            count = int(np.prod(shape, dtype=np.int64))
            return np.frombuffer(self.take(count * dtype.itemsize), dtype=dtype).reshape(shape).copy()
        if tag == b"T":
            return tuple(self.value() for _ in range(self.length()))
        if tag == b"M":
            n = self.length()
            pairs = [(self.value(), self.value()) for _ in range(n)]
            return dict(pairs)
        raise ValueError(f"unknown tag {tag!r} at byte {self.at - 1} of the statistic bytes")


def statistic_from_bytes(raw: bytes) -> Any:
    """The statistic whose canonical bytes are ``raw`` (``ValueError`` for anything else)."""
    if not isinstance(raw, (bytes, bytearray)) or not bytes(raw).startswith(_MAGIC):
        raise ValueError("not canonical statistic bytes (they start with b'mixle-parallel-stats-v1\\x00')")
    reader = _Reader(bytes(raw))
    reader.take(len(_MAGIC))
    out = reader.value()
    if reader.at != len(raw):
        raise ValueError(f"{len(raw) - reader.at} trailing byte(s) after the statistic")
    return out
