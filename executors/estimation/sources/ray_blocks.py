"""Rows out of Ray Data blocks: the slicing, and the warm reader actors that slice for the audit's reads.

Why readers: the audit reads its sampled rows once per batch of a fit's passes, and a Ray task for it needs a worker
process. Where the backend's actors hold every CPU (the usual setup), Ray counts that process over its soft limit and
reaps it about a second after it idles; a new one costs 1.5-2 s to start. Measured (1,000,000 rows, two actors,
``ray.init(num_cpus=2)``): fits of 20 passes two seconds apart each waited 1.4-2.1 s on their read, where a warm
process takes 15-30 ms. A :class:`BlockReaders` keeps one reader actor (no CPU reserved) per node that holds a block
read, placed on that node, for the source's life: a block is still sliced where it lives, and only the audited rows
cross, as with the tasks.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["BlockReaders", "block_rows", "block_slices"]

READER_CALLS_IN_FLIGHT = 2
"""The most slicing calls one reader actor runs at once (threads of the actor's process)."""


def block_rows(block: Any, lo: int, hi: int, where: str) -> np.ndarray:
    """Rows ``[lo, hi)`` of a Ray Data block (an Arrow table or a pandas frame) as one numpy array."""
    from ray.data.block import BlockAccessor

    accessor = BlockAccessor.for_block(BlockAccessor.for_block(block).slice(lo, hi, copy=False))
    names = list(accessor.column_names())  # type: ignore[attr-defined]  # every table block accessor has it
    values = accessor.to_numpy(names if len(names) > 1 else names[0])
    arrays = [values[n] for n in names] if isinstance(values, dict) else [values]
    bad = [n for n, a in zip(names, arrays) if np.asarray(a).dtype.kind not in "biuf"]
    if bad:
        raise ValueError(f"{where}: column(s) {bad} are not numeric; select the numeric columns first "
                         "(dataset.select_columns([...]))")
    rows = arrays[0] if len(arrays) == 1 else np.column_stack(arrays)
    return np.array(rows)  # memory of its own, not a view into the object store


def block_slices(block: Any, ranges: Sequence[tuple[int, int]], where: str) -> list[np.ndarray]:
    """Rows ``[lo, hi)`` of a block for each range (what a reader does, beside the store)."""
    return [block_rows(block, lo, hi, where) for lo, hi in ranges]


class BlockReader:
    """The body of a reader actor: slices of the blocks it is handed (resolved from the store on its node)."""

    def slices(self, block: Any, ranges: Sequence[tuple[int, int]], where: str) -> list[np.ndarray]:
        """Rows ``[lo, hi)`` of ``block`` for each range."""
        return block_slices(block, ranges, where)


@functools.lru_cache(maxsize=1)
def reader_class() -> Any:
    """:class:`BlockReader` as a Ray actor class reserving no CPU (made once; Ray exports it again to a new session)."""
    import ray

    return ray.remote(num_cpus=0, max_restarts=0)(BlockReader)


def nodes_of(refs: Sequence[Any]) -> list[str | None]:
    """For each of ``refs``, the id of a node whose object store holds it (None where Ray does not say); one
    request for all of them."""
    from ray.experimental import get_object_locations

    try:
        found = get_object_locations(list(refs))
    except Exception:  # noqa: BLE001 - an experimental API: the readers go where Ray puts them
        return [None] * len(refs)
    nodes = [(found.get(ref) or {}).get("node_ids") or [] for ref in refs]
    return [str(n[0]) if n else None for n in nodes]


class BlockReaders:
    """The reader actors of one opened dataset, one per node holding a block read (module doc): started by
    :meth:`prepare` (without waiting for them) or on first need, dropped when one hung or died, killed at
    :meth:`close`."""

    def __init__(self) -> None:
        self._by_node: dict[str | None, Any] = {}

    def prepare(self, refs: Sequence[Any]) -> None:
        """Start a reader on every node that holds one of ``refs`` (their processes start while the fit runs)."""
        self.readers_for(refs)

    def readers_for(self, refs: Sequence[Any]) -> list[Any]:
        """The reader beside each of ``refs``' blocks (started where there is none yet)."""
        return [self._reader_on(node) for node in nodes_of(refs)]

    def drop(self, reader: Any) -> None:
        """Kill ``reader`` (it hung past the deadline, or died); the next read beside its blocks starts another."""
        import ray

        for node, held in list(self._by_node.items()):
            if held is reader:
                del self._by_node[node]
        try:
            ray.kill(reader)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def close(self) -> None:
        """Kill every reader."""
        for reader in list(self._by_node.values()):
            self.drop(reader)

    def _reader_on(self, node: str | None) -> Any:
        reader = self._by_node.get(node)
        if reader is None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            placed = "DEFAULT" if node is None else NodeAffinitySchedulingStrategy(node, soft=True)
            reader = self._by_node[node] = reader_class().options(
                max_concurrency=READER_CALLS_IN_FLIGHT, scheduling_strategy=placed).remote()
        return reader
