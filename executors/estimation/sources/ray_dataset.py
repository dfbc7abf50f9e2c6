"""A ``ray.data.Dataset``, read by the ``ray`` backend's actors from Ray's object store.

The dataset is materialized in its own order (``preserve_order``) and its blocks -- object references
and row counts, never rows -- become the parts. Each actor fetches the blocks of its chunks from the
object store and encodes its slices there (:class:`BlockChunk`); the driver holds the materialized
dataset (the blocks' references, so they stay in the store) for the handle's life. A block column of
tensors gives vector rows, one scalar column scalar rows, several scalar columns one row per record.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from ..backends.deadline import Deadline
from ..em_pass.chunks import ChunkRunner, WorkerTimeoutError
from ..em_pass.runner_protocols import WorkerPlacement, runner_timeout
from .layout import ChunkPlace
from .opened_source import OpenedSource
from .recipes import ChunkRecipe

__all__ = ["BlockChunk", "RayDataset"]


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


@attrs.frozen(kw_only=True)
class BlockChunk(ChunkRecipe):
    """A chunk that is rows ``[lo, hi)`` of one Ray Data block (``block`` holds its object reference)."""

    block: tuple[Any, ...]
    """``(object ref,)``: inside a tuple, so Ray hands the reference itself to the actor, unresolved."""
    lo: int

    @property
    def where(self) -> str:
        """The block, in words."""
        return f"ray dataset block {self.part}"

    def rows(self) -> Any:
        """The rows, fetched from the object store here."""
        import ray

        return block_rows(ray.get(self.block[0]), self.lo + self.offset, self.lo + self.stop_offset, self.where)


def _block_slices(block: Any, ranges: Sequence[tuple[int, int]], where: str) -> list[np.ndarray]:
    """Rows ``[lo, hi)`` of a block for each range, in a Ray task beside the store (``chunks_rows``)."""
    return [block_rows(block, lo, hi, where) for lo, hi in ranges]


@functools.lru_cache(maxsize=1)
def _slicer() -> Any:
    """``_block_slices`` as a Ray remote function needing no CPU (made once; Ray exports it again to a new session)."""
    import ray

    return ray.remote(num_cpus=0, max_retries=0)(_block_slices)


SLICE_TASKS_IN_FLIGHT = 2
"""The most slicing tasks a reference fetch keeps running at once: a task that reserves no CPU is not held back by
Ray's scheduler, and each one running needs a worker process of its own (a batch of a fit's passes asks for many)."""


def _materialized(dataset: Any) -> Any:
    """``dataset.materialize()`` in the dataset's own row order."""
    import ray

    options = ray.data.DataContext.get_current().execution_options
    before = options.preserve_order
    options.preserve_order = True
    try:
        return dataset.materialize()
    finally:
        options.preserve_order = before


class RayDataset:
    """A ``ray.data.Dataset``, to be read by the ``ray`` backend (``as_source`` wraps it)."""

    kind = "ray"

    def __init__(self, data: Any) -> None:
        self.data = data

    def open(self, runner: ChunkRunner) -> OpenedRayDataset:
        """Materialize the dataset in its order; its blocks (references and row counts) are the parts."""
        if not (isinstance(runner, WorkerPlacement) and runner.name == "ray"):  # the actors, not RayTaskRunner
            raise ValueError("a ray.data.Dataset is read by the ray backend's actors; a Ray module without "
                             "cluster_resources cannot hold its chunks: start Ray with ray.init()")
        held = _materialized(self.data)
        blocks: list[tuple[Any, int, int]] = []
        for bundle in held.iter_internal_ref_bundles():
            slices = getattr(bundle, "slices", None) or (None,) * len(bundle.blocks)
            for entry, cut in zip(bundle.blocks, slices):
                ref, rows = ((entry.ref, entry.metadata.num_rows) if hasattr(entry, "ref")
                             else (entry[0], entry[1].num_rows))
                lo, hi = (0, int(rows)) if cut is None else (int(cut.start_offset), int(cut.end_offset))
                blocks.append((ref, lo, hi))
        return OpenedRayDataset(held, blocks, runner_timeout(runner))


class OpenedRayDataset(OpenedSource):
    """A materialized dataset: its blocks are the parts; a :class:`BlockChunk` per chunk."""

    kind = "ray"
    reads_chunks = True

    def __init__(self, held: Any, blocks: list[tuple[Any, int, int]], timeout: float | None = None) -> None:
        self.held = held
        self.blocks = blocks
        self.part_rows = tuple(hi - lo for _, lo, hi in blocks)
        self.timeout = timeout
        """Seconds the audit's read waits for its slicing tasks (the runner's ``timeout``; None: no limit)."""

    def describe_part(self, part: int) -> str:
        """The block, in words."""
        return f"ray dataset block {part}"

    def recipes(self, places: Sequence[ChunkPlace], encoder: Any) -> list[Any]:
        """A :class:`BlockChunk` per chunk."""
        return [BlockChunk(chunk_id=p.chunk_id, start=p.start, stop=p.stop, part=p.part, offset=p.offset,
                           stop_offset=p.stop_offset, encoder=encoder, block=(self.blocks[p.part][0],),
                           lo=self.blocks[p.part][1]) for p in places]

    def chunk_rows(self, place: ChunkPlace) -> Any:
        """The chunk's rows: the one-chunk form of ``chunks_rows``."""
        return self.chunks_rows([place])[0]

    def chunks_rows(self, places: Sequence[ChunkPlace]) -> list[Any]:
        """The rows of every chunk at ``places``: one Ray task per block holding some of them (no CPU reserved, so
        the actors holding every CPU do not block it) slices them where the block is, at most
        :data:`SLICE_TASKS_IN_FLIGHT` at once; only the chunks' rows cross."""

        if not self.blocks:
            raise RuntimeError("this ray dataset source is closed; its blocks are gone")
        wanted: dict[int, list[int]] = {}
        for k, place in enumerate(places):
            wanted.setdefault(place.part, []).append(k)
        slicer, found = _slicer(), [None] * len(places)
        running: dict[Any, tuple[int, list[int]]] = {}
        deadline = Deadline(self.timeout)
        for part, ks in wanted.items():
            if len(running) >= SLICE_TASKS_IN_FLIGHT:
                self._take(running, found, deadline)
            ref, lo, _ = self.blocks[part]
            ranges = [(lo + places[k].offset, lo + places[k].stop_offset) for k in ks]
            running[slicer.remote(ref, ranges, self.describe_part(part))] = (part, ks)
        while running:
            self._take(running, found, deadline)
        return found

    def _take(self, running: dict[Any, tuple[int, list[int]]], found: list[Any], deadline: Deadline) -> None:
        """Wait for one slicing task of ``running`` and put its rows in ``found``; past ``deadline`` every running
        task is cancelled and ``WorkerTimeoutError`` names their blocks."""
        import ray

        done, _ = ray.wait(list(running), num_returns=1, timeout=deadline.remaining())
        if not done:
            for ref in running:
                ray.cancel(ref, force=True)
            parts = ", ".join(self.describe_part(part) for part, _ in running.values())
            raise WorkerTimeoutError(f"the audit's rows of {parts} did not come back within {self.timeout} s: the "
                                     "Ray worker slicing them is hung or overloaded. Raise timeout= (seconds) or "
                                     "check the cluster")
        for k, rows in zip(running.pop(done[0])[1], ray.get(done[0]), strict=True):
            found[k] = rows

    def close(self) -> None:
        """Drop the dataset's blocks (the store frees them)."""
        self.held, self.blocks = None, []
