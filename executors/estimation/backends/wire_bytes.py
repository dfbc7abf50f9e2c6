"""Bytes of a data pass's serialized traffic that crossed this process's boundary, as measured by a runner.

Each runner counts the serialized payloads it really hands to its transport during ``map_chunks`` and
``run_on_workers`` (the pickled ``(fn, model)`` request, the pickled statistics in the reply), at the
point where they exist as bytes: the socket frames of the direct channel (dask, ray), the bytes given to
and returned by the engine's RPC, the blobs of mpi4py's and torch.distributed's object collectives,
Spark's task closure and collected records. A transport's own framing (headers, size prefixes) is not
counted. ``sent`` is what left this process, ``received`` what arrived; a broadcast from this process
to ``n`` peers counts its blob ``n`` times (one delivery per peer). ``messages`` counts the deliveries
the same way (one per peer a blob is sent to, one per blob received): the EM harness reads it per
round as the collective count it judges, observed, never derived from the worker count.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import Any

__all__ = ["WireBytes", "blob_size", "dumps"]


def dumps(value: Any) -> bytes:
    """``value`` pickled (highest protocol), the form the SPMD runners put on the wire."""
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def blob_size(value: Any) -> int:
    """Length of a bytes-like value; of a mapping's values or a sequence's items summed; 0 for anything else."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if isinstance(value, Mapping):
        return sum(blob_size(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(blob_size(v) for v in value)
    return 0


class WireBytes:
    """Running totals of pass bytes sent and received by this process."""

    __slots__ = ("messages", "received", "sent")

    def __init__(self) -> None:
        self.sent = 0
        self.received = 0
        self.messages = 0
        """Messages handed to the transport or taken from it: one per delivery sent, one per blob received."""

    @property
    def total(self) -> int:
        """Bytes sent plus bytes received."""
        return self.sent + self.received

    def count_sent(self, *blobs: Any, copies: int = 1) -> None:
        """Add the sizes of ``blobs`` (``blob_size``), each delivered ``copies`` times, to ``sent``."""
        self.sent += copies * sum(blob_size(b) for b in blobs)
        self.messages += copies

    def count_received(self, *blobs: Any) -> None:
        """Add the sizes of ``blobs`` to ``received``."""
        self.received += sum(blob_size(b) for b in blobs)
        self.messages += len(blobs)

    def count_message_sent(self, size: int) -> None:
        """One message of ``size`` bytes handed to the transport (a payload whose bytes were measured elsewhere)."""
        self.sent += size
        self.messages += 1
