"""Where the chunks of a source lie: chunk identity is (part, row offset), parts in source order.

A source is an ordered list of *parts* (files, RDD partitions, dask partitions, Ray blocks, the rows of
each rank), each with a row count. Chunks never span parts: each part is cut on its own, so a worker
builds a chunk from one part where the part lives. The cut depends on the parts' row counts and the
chunking options only -- never on the engine or the worker count -- so one logical source gives the
same chunks, hence the same bits, everywhere. A source of one part is cut exactly as in-memory rows of
that length (:func:`~..chunks.chunk_bounds`), so ``files("x.npy")`` fits the bits of ``numpy.load("x.npy")``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from ..em_pass.chunks import chunk_bounds

__all__ = ["ChunkPlace", "allocate_chunks", "source_layout", "source_places"]


class ChunkPlace(NamedTuple):
    """One chunk of a source: its id, its part and row range in the part, and its global row range."""

    chunk_id: int
    part: int
    offset: int
    """First row of the chunk within its part."""
    stop_offset: int
    start: int
    """First row of the chunk in the whole source (parts concatenated in order)."""
    stop: int


def allocate_chunks(part_rows: Sequence[int], total_chunks: int) -> list[int]:
    """Chunks per part: ``total_chunks`` shared by rows (largest remainder, ties to the earlier part), at
    least one per non-empty part and none for an empty one. A function of the row counts only."""
    total = sum(part_rows)
    nonempty = [i for i, n in enumerate(part_rows) if n > 0]
    if not nonempty:
        return [0] * len(part_rows)
    want = max(int(total_chunks), len(nonempty))
    shares = {i: want * part_rows[i] / total for i in nonempty}
    counts = {i: max(1, math.floor(shares[i])) for i in nonempty}
    left = want - sum(counts.values())
    order = sorted(nonempty, key=lambda i: (-(shares[i] - math.floor(shares[i])), i))
    for i in order[:max(0, left)]:
        counts[i] += 1
    return [min(counts.get(i, 0), part_rows[i]) for i in range(len(part_rows))]


def _per_part_counts(part_rows: Sequence[int], num_chunks: int | None, chunk_size: int | None) -> list[int]:
    """How many chunks each part is cut into under the chunking options."""
    if chunk_size is not None:
        return [len(chunk_bounds(n, chunk_size=chunk_size)) if n > 0 else 0 for n in part_rows]
    total = sum(part_rows)
    count = num_chunks if num_chunks is not None else len(chunk_bounds(total))
    return allocate_chunks(part_rows, count)


def source_layout(part_rows: Sequence[int], num_chunks: int | None = None,
                  chunk_size: int | None = None) -> tuple[ChunkPlace, ...]:
    """The chunks of a source whose parts hold ``part_rows`` rows, in (part, offset) order.

    ``chunk_size``: each part cut into chunks of at most that many rows. ``num_chunks``: that many chunks
    shared over the parts by rows. Neither: the chunk count in-memory rows of the total would get
    (chunks of at most ``DEFAULT_CHUNK_SIZE`` rows), shared the same way. One part is cut exactly as
    ``chunk_bounds(rows, num_chunks, chunk_size)``.
    """
    rows = [int(n) for n in part_rows]
    if any(n < 0 for n in rows):
        raise ValueError(f"part row counts must be >= 0, got {rows}")
    if num_chunks is not None and chunk_size is not None:
        raise ValueError("give num_chunks or chunk_size, not both")
    if len(rows) == 1:
        cuts = [chunk_bounds(rows[0], num_chunks, chunk_size)] if rows[0] > 0 else [()]
    else:
        cuts = [chunk_bounds(n, num_chunks=c) if c else () for n, c in
                zip(rows, _per_part_counts(rows, num_chunks, chunk_size))]
    places: list[ChunkPlace] = []
    first = 0
    for part, (n, bounds) in enumerate(zip(rows, cuts)):
        for a, b in bounds:
            places.append(ChunkPlace(len(places), part, a, b, first + a, first + b))
        first += n
    return tuple(places)


def source_places(bounds: Sequence[tuple[int, int]], part_rows: Sequence[int]) -> tuple[ChunkPlace, ...]:
    """The :class:`ChunkPlace` of each chunk of ``bounds`` (global row ranges that never span parts)."""
    firsts = [0]
    for n in part_rows:
        firsts.append(firsts[-1] + int(n))
    out = []
    part = 0
    for i, (a, b) in enumerate(bounds):
        while part + 1 < len(part_rows) and a >= firsts[part + 1]:
            part += 1
        if b > firsts[part + 1]:
            raise ValueError(f"chunk {i} (rows {a}..{b - 1}) spans parts {part} and {part + 1}; a source's chunks "
                             "are cut within its parts")
        out.append(ChunkPlace(i, part, a - firsts[part], b - firsts[part], a, b))
    return tuple(out)
