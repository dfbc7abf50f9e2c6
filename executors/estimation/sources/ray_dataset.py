"""A ``ray.data.Dataset``, read by the ``ray`` backend's actors from Ray's object store.

The dataset is materialized in its own order (``preserve_order``) and its blocks -- object references
and row counts, never rows -- become the parts. Each actor fetches the blocks of its chunks from the
object store and encodes its slices there (:class:`BlockChunk`); the driver holds the materialized
dataset (the blocks' references, so they stay in the store) for the handle's life. A block column of
tensors gives vector rows, one scalar column scalar rows, several scalar columns one row per record.
The SDC audit's reads of sampled rows go to warm reader actors beside the blocks (``ray_blocks``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from ..backends.deadline import Deadline
from ..em_pass.chunks import ChunkRunner, WorkerTimeoutError
from ..em_pass.runner_protocols import WorkerPlacement, runner_timeout
from .layout import ChunkPlace
from .opened_source import OpenedSource
from .ray_blocks import BlockReaders, block_rows
from .recipes import ChunkRecipe

__all__ = ["BlockChunk", "RayDataset"]


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


@attrs.frozen
class _BlockRead:
    """One block's part of a read: the block, the places (``ks`` of ``places``) it holds, the reader slicing it,
    and whether it is the second try (its first reader died)."""

    part: int
    ks: list[int]
    places: Sequence[ChunkPlace]
    reader: Any = None
    again: bool = False


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
        """Seconds the audit's read waits for its readers (the runner's ``timeout``; None: no limit)."""
        self.readers = BlockReaders()
        """The reader actors of the audit's reads, beside the blocks (``ray_blocks``)."""

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

    def prepare_reads(self) -> None:
        """Start the reader actors beside the blocks (``ray_blocks``) while the fit runs: the audit reads here."""
        self.readers.prepare([ref for ref, _, _ in self.blocks])

    def chunks_rows(self, places: Sequence[ChunkPlace]) -> list[Any]:
        """The rows of every chunk at ``places``: one call per block holding some of them to the reader actor on
        that block's node (``ray_blocks``: warm for the source's life, no CPU reserved), which slices them where the
        block is; only the chunks' rows cross. A reader that died is replaced, once per block."""
        if not self.blocks:
            raise RuntimeError("this ray dataset source is closed; its blocks are gone")
        wanted: dict[int, list[int]] = {}
        for k, place in enumerate(places):
            wanted.setdefault(place.part, []).append(k)
        found: list[Any] = [None] * len(places)
        deadline = Deadline(self.timeout)
        parts = list(wanted)
        readers = self.readers.readers_for([self.blocks[part][0] for part in parts])
        running = dict(self._slice(_BlockRead(part, wanted[part], places, reader))
                       for part, reader in zip(parts, readers, strict=True))
        while running:
            self._take(running, found, deadline)
        return found

    def _slice(self, read: _BlockRead) -> tuple[Any, _BlockRead]:
        """``read`` sent to its reader: the call's object reference, and the read."""
        ref, lo, _ = self.blocks[read.part]
        ranges = [(lo + read.places[k].offset, lo + read.places[k].stop_offset) for k in read.ks]
        return read.reader.slices.remote(ref, ranges, self.describe_part(read.part)), read

    def _take(self, running: dict[Any, _BlockRead], found: list[Any], deadline: Deadline) -> None:
        """Wait for one call of ``running`` and put its rows in ``found``; past ``deadline`` the readers still
        slicing are killed (Ray cannot cancel an actor's call) and ``WorkerTimeoutError`` names their blocks."""
        import ray
        from ray.exceptions import RayActorError

        done, _ = ray.wait(list(running), num_returns=1, timeout=deadline.remaining())
        if not done:
            for read in running.values():
                self.readers.drop(read.reader)
            parts = ", ".join(self.describe_part(read.part) for read in running.values())
            raise WorkerTimeoutError(f"the audit's rows of {parts} did not come back within {self.timeout} s: the "
                                     "Ray reader slicing them is hung or overloaded. Raise timeout= (seconds) or "
                                     "check the cluster")
        read = running.pop(done[0])
        try:
            rows = ray.get(done[0])
        except RayActorError:
            self.readers.drop(read.reader)
            if read.again:
                raise
            (reader,) = self.readers.readers_for([self.blocks[read.part][0]])
            call, retried = self._slice(attrs.evolve(read, reader=reader, again=True))
            running[call] = retried
            return
        for k, value in zip(read.ks, rows, strict=True):
            found[k] = value

    def close(self) -> None:
        """Drop the dataset's blocks (the store frees them) and the readers."""
        self.readers.close()
        self.held, self.blocks = None, []
