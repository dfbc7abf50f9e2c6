"""Which worker runs which chunks, and results put back in chunk order (placement never changes the bits)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ['block_assignment', 'home_blocks', 'ordered_results', 'place_blocks', 'requested_ids']


def block_assignment(num_chunks: int, num_workers: int) -> list[list[int]]:
    """Contiguous blocks of chunk ids per worker (worker ``w`` gets ``[a_w, b_w)``).

    Only placement depends on the worker count; results are always combined in chunk order.
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    edges = [(w * num_chunks) // num_workers for w in range(num_workers + 1)]
    return [list(range(edges[w], edges[w + 1])) for w in range(num_workers)]


def block_owners(blocks: Sequence[Sequence[int]], num_chunks: int) -> list[int]:
    """The worker of each chunk id, from per-worker blocks of chunk ids (worker ``w`` holds ``blocks[w]``)."""
    owners = [0] * num_chunks
    for w, ids in enumerate(blocks):
        for i in ids:
            owners[i] = w
    return owners


def home_blocks(chunks: Sequence[Any], workers: Sequence[str]) -> list[list[int]]:
    """The chunk ids each of ``workers`` takes: where each chunk already is (a recipe's ``home``, e.g. a dask
    collection's chunk future) when every chunk is on one of them, else contiguous blocks."""
    homes = [getattr(c, "home", None) for c in chunks]
    if homes and all(h in workers for h in homes):
        return [[i for i, h in enumerate(homes) if h == w] for w in workers]
    return block_assignment(len(chunks), len(workers))


def place_blocks(blocks: Any, num_workers: int, num_chunks: int, backend: str) -> list[list[int]]:
    """Validate a plan's chunk blocks: one per worker, together every chunk exactly once."""
    out = [sorted(int(c) for c in b) for b in blocks]
    if len(out) != num_workers:
        raise ValueError(f"the placement has {len(out)} device shard(s) but the {backend} backend has {num_workers} "
                         f"worker(s); pass num_workers={len(out)} or plan for {num_workers} devices")
    flat = sorted(c for b in out for c in b)
    if flat != list(range(num_chunks)):
        raise ValueError(f"the placement's shards must cover chunks 0..{num_chunks - 1} once each, got {flat}")
    return out


def requested_ids(chunk_ids: Sequence[int] | None, num_chunks: int) -> list[int]:
    """The chunk ids a map runs over, ascending: all (default) or the given ones, validated."""
    if chunk_ids is None:
        return list(range(num_chunks))
    ids = sorted(int(i) for i in chunk_ids)
    bad = [i for i in ids if not 0 <= i < num_chunks]
    if bad:
        raise IndexError(f"chunk ids {bad} are out of range: this runner holds chunks 0..{num_chunks - 1}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"chunk ids must be distinct, got {ids}")
    return ids


def ordered_results(results: dict[int, Any], ids: Sequence[int], backend: str) -> list[Any]:
    """Results in the order of ``ids`` (ascending chunk id); a missing id is a backend bug, reported as such."""
    missing = [i for i in ids if i not in results]
    if missing:
        raise RuntimeError(f"{backend} runner lost the results of chunks {missing}; this is a bug in the runner")
    return [results[i] for i in ids]
