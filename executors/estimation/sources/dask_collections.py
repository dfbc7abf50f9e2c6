"""A dask Array (chunked along rows), DataFrame or Bag, read by the ``dask`` backend where it lives.

Parts are the collection's partitions, in order. The partitions are computed on the cluster (one future each),
their row counts gathered (numbers only), and every chunk encoded by a task next to its partition
(:func:`_encode_slice`), so each encoded chunk is one future on the worker that computed it. The raw partitions
stay held (the audit's references slice them there), and the chunk holders (``DaskRunner``) take each chunk on the
worker that has it (:class:`HeldChunk`, whose ``home`` is that worker): nothing passes through the driver. A lost
worker's chunks are recomputed by dask from the collection's graph when a survivor asks for them. An Array holds
rows along its first axis (1-D: scalar rows, 2-D: vector rows); a DataFrame numeric columns (or one column of
arrays); a Bag one row per element, as an RDD.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from ..em_pass.chunks import ChunkRunner
from ..em_pass.runner_protocols import ClientCluster
from .layout import ChunkPlace
from .opened_source import OpenedSource
from .recipes import ChunkRecipe, encode_rows, numeric_rows
from .spark_rows import PartitionChunk, partition_recipes

__all__ = ["DaskCollection", "HeldChunk"]


def _rows_of(part: Any) -> Any:
    """A computed partition as rows: an array as is, a pandas frame as numbers, a bag partition as rows."""
    if isinstance(part, np.ndarray):
        return part
    if hasattr(part, "to_numpy") and hasattr(part, "columns"):
        frame = part
        if len(frame.columns) == 1 and frame.dtypes.iloc[0] == np.dtype(object):  # one column of arrays
            return np.asarray([np.asarray(v) for v in frame.iloc[:, 0]])
        kinds = [dtype.kind for dtype in frame.dtypes]
        if any(k not in "biuf" for k in kinds):
            raise ValueError(f"a dask DataFrame for EM holds numeric columns, or one column of arrays; columns "
                             f"{[c for c, k in zip(frame.columns, kinds) if k not in 'biuf']} are not numeric: select "
                             "the numeric columns first (df[[...]])")
        values = frame.to_numpy()
        return values[:, 0] if values.shape[1] == 1 else values
    if hasattr(part, "to_numpy"):  # a pandas Series
        return part.to_numpy()
    return numeric_rows(list(part))


def _count_rows(part: Any) -> int:
    return len(part)


def _slice_rows(part: Any, lo: int, hi: int, rows: int, where: str) -> Any:
    """Rows ``[lo, hi)`` of a computed partition (checked to hold ``rows`` rows, as when it was counted)."""
    found = _rows_of(part)
    if len(found) != rows:
        raise ValueError(f"{where} held {rows} rows when counted and {len(found)} now: the collection is not the "
                         "same on every evaluation; persist it (collection.persist()) first")
    return np.array(found[lo:hi]) if isinstance(found, np.ndarray) else found[lo:hi]  # rows of fields stay rows


def _slices_of(part: Any, ranges: Sequence[tuple[int, int]], rows: int, where: str) -> list[Any]:
    """``_slice_rows`` for each range of one computed partition, in one task on the worker that holds it."""
    return [_slice_rows(part, lo, hi, rows, where) for lo, hi in ranges]


def _encode_slice(part: Any, recipe: PartitionChunk) -> Any:
    """One chunk of a computed partition, encoded on the worker that holds the partition."""
    rows = _rows_of(part)
    return encode_rows(recipe, rows[recipe.offset:recipe.stop_offset])


@attrs.frozen(kw_only=True)
class HeldChunk(ChunkRecipe):
    """A chunk already encoded in dask's memory (the future ``key``), on the worker ``home``."""

    key: Any
    home: str

    @property
    def where(self) -> str:
        """The chunk's future, in words."""
        return f"dask partition {self.part} (chunk future {self.key!r})"

    def build(self) -> Any:
        """The chunk from this worker's memory (the runner has dask move it here first: :func:`lend_to`)."""
        from distributed import get_worker

        worker = get_worker()
        if self.key in worker.data:
            return worker.data[self.key]
        raise RuntimeError(f"{self.where} is not in the memory of dask worker {worker.address}; the runner moves "
                           "a chunk to a worker (lend_to) before that worker holds or borrows it")


def _same(chunk: Any) -> Any:
    return chunk


def lend_to(client: Any, chunk: Any, address: str, keep: list[Any],
            settle: Callable[[Any, Any, str], bool]) -> Any:
    """``chunk`` for the worker ``address``: a :class:`HeldChunk` is put there by dask first, by a task pinned to
    ``address`` (no transfer when it is there already; recomputed from the collection's graph when its worker
    is lost; the task's future appended to ``keep``, which the caller holds while it is used). Its recorded
    ``home`` is not trusted: dask may since have dropped that replica. ``settle(copy, source, address)`` waits
    for the copy (the runner bounds it and gives up silent workers); None when it gave up ``address``
    itself. Any other chunk as it is."""
    if not isinstance(chunk, HeldChunk):
        return chunk
    import distributed

    source: Any = distributed.Future(chunk.key, client=client)
    copy = client.submit(_same, source, workers=[address], allow_other_workers=False, pure=False)
    if not settle(copy, source, address):
        copy.release()
        return None
    if copy.status != "finished":
        client.gather(copy)  # raises why the chunk could not be rebuilt
    keep.append(copy)
    return attrs.evolve(chunk, key=copy.key, home=address)


def _delayed_parts(collection: Any) -> list[Any]:
    """The collection's partitions as delayed objects, in order (an Array by row blocks)."""
    if hasattr(collection, "chunks") and hasattr(collection, "ndim"):  # a dask Array
        if collection.ndim not in (1, 2):
            raise ValueError(f"a dask Array for EM is 1-D (scalar rows) or 2-D (vector rows), got {collection.ndim}-D")
        if collection.ndim == 2 and len(collection.chunks[1]) > 1:
            collection = collection.rechunk({1: -1})  # whole rows in each block, still on the cluster
        return list(np.asarray(collection.to_delayed()).reshape(-1))
    return list(collection.to_delayed())


class DaskCollection:
    """A dask collection, to be read by the ``dask`` backend (``as_source`` wraps it)."""

    kind = "dask"

    def __init__(self, data: Any) -> None:
        self.data = data

    def open(self, runner: ChunkRunner) -> OpenedDaskCollection:
        """Compute the partitions on the runner's cluster and count their rows."""
        if not isinstance(runner, ClientCluster):  # the actors, not DaskTaskRunner
            raise ValueError("a dask collection is read by the dask backend over a distributed.Client; a client "
                             "that only submits and gathers cannot hold its chunks: pass a distributed.Client")
        client = runner.client
        parts = _delayed_parts(self.data)
        raw = client.compute(parts)
        counts = client.gather(client.map(_count_rows, raw, pure=False))
        return OpenedDaskCollection(client, raw, tuple(int(n) for n in counts), runner.wait_for_tasks)


class OpenedDaskCollection(OpenedSource):
    """Computed partitions on the cluster; chunks become futures next to them, then held by the actors."""

    kind = "dask"
    reads_chunks = True

    def __init__(self, client: Any, raw: list[Any], part_rows: tuple[int, ...],
                 wait_for_tasks: Callable[[Mapping[str, Any], str], None]) -> None:
        self.client = client
        self.wait_for_tasks = wait_for_tasks
        """The runner's wait for the audit's slicing tasks (``ClientCluster.wait_for_tasks``): its timeout and its
        straggler deadline, so a worker that falls silent between a pass and its read is given up, not waited
        for."""
        self.raw = raw
        """The computed partitions, held for the handle's life: the chunks are encoded from them and the audit's
        references slice them (dask recomputes a lost one from the collection's graph)."""
        self.part_rows = part_rows
        self.encoded: list[Any] = []
        """One future per chunk (held for the handle's life: dask recomputes a lost one from the graph)."""

    def describe_part(self, part: int) -> str:
        """The partition, in words."""
        return f"dask partition {part}"

    def recipes(self, places: Sequence[ChunkPlace], encoder: Any) -> list[Any]:
        """Encode every chunk next to its partition; a :class:`HeldChunk` per chunk, homed where it is."""
        import distributed

        slices = partition_recipes(places, encoder, "dask partition")
        self.encoded = self.client.map(_encode_slice, [self.raw[p.part] for p in places], slices, pure=False)
        distributed.wait(self.encoded)
        bad = [f for f in self.encoded if f.status != "finished"]
        if bad:
            self.client.gather(bad)  # raises the first error (a null, a NaN, a wrong column)
        homes = self.client.who_has(self.encoded)
        return [HeldChunk(chunk_id=r.chunk_id, start=r.start, stop=r.stop, part=r.part, offset=r.offset,
                          stop_offset=r.stop_offset, encoder=None, key=f.key, home=str((homes.get(f.key) or [""])[0]))
                for r, f in zip(slices, self.encoded)]

    def chunks_rows(self, places: Sequence[ChunkPlace]) -> list[Any]:
        """The rows of every chunk at ``places``: sliced by one task per partition on the worker that holds it
        (computed at ``open`` and kept; dask recomputes a lost one from the collection's graph), gathered here
        together; only the chunks' rows cross, and no partition is computed again."""
        if not self.raw:
            raise RuntimeError("this dask source holds no partitions (closed); reopen it")
        wanted: dict[int, list[int]] = {}
        for k, place in enumerate(places):
            wanted.setdefault(place.part, []).append(k)
        futures = {part: self.client.submit(_slices_of, self.raw[part],
                                            [(places[k].offset, places[k].stop_offset) for k in ks],
                                            self.part_rows[part], self.describe_part(part), pure=False)
                   for part, ks in wanted.items()}  # one task per partition, not per chunk
        try:
            self.wait_for_tasks({self.describe_part(part): future for part, future in futures.items()},
                                "the audit's rows")
            found = dict(zip(futures, self.client.gather(list(futures.values())), strict=True))
        finally:
            for future in futures.values():
                future.release()
        out: list[Any] = [None] * len(places)
        for part, ks in wanted.items():
            for k, rows in zip(ks, found[part], strict=True):
                out[k] = rows
        return out

    def chunk_rows(self, place: ChunkPlace) -> Any:
        """The chunk's rows, sliced on the worker that holds its partition: one chunk crosses, not the partition."""
        return self.chunks_rows([place])[0]

    def close(self) -> None:
        """Release the partitions and chunk futures."""
        for future in [*self.raw, *self.encoded]:
            try:
                future.release()
            except Exception:  # noqa: BLE001 - a closed client has released them already
                pass
        self.raw, self.encoded = [], []
