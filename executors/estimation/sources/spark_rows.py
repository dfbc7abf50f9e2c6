"""A pyspark RDD of rows (as mixle 0.8.2 takes) or a DataFrame, read by the ``spark`` backend where it lives.

Parts are the RDD's partitions, in order. Where the ``spark`` runner serves its passes from tasks kept alive
(``backends.spark_served``), those tasks read every partition's rows once, count them, encode the chunks and keep
both, and no job or cache is needed until the stage ends. Otherwise one Spark job reads every partition's rows once
into a cached RDD and counts them; a second maps them to their encoded chunks, which stay cached on the executors
with the rows (``SparkRunner.place_partitions``). The audit's references slice those rows (by the serving tasks,
else by a job). The driver only ever holds the
counts and the audited chunks' rows. An RDD element is one row, as in mixle (numbers, a vector, a tuple of
fields); numeric rows become one array, as an in-memory fit gets.
A DataFrame gives numeric columns (one row per record) or one vector / array column; plain integer and floating
columns are read through Arrow (``mapInArrow``: each batch one numpy block, no ``Row`` object per record, the same
array the ``Row`` path builds), which a Spark user's Parquet table reads several times faster; tasks kept alive read
those batches themselves (one barrier ``mapInArrow``, :func:`_arrow_stage`), a job through an RDD of the blocks.
Spark recomputes a lost partition from its lineage. The source must give the same rows on every evaluation (cache a
random or non-deterministic one first): a partition whose row count changed is refused.
"""

from __future__ import annotations

import inspect
import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import numpy as np

from ..em_pass.chunks import ChunkRunner
from ..em_pass.runner_protocols import PARTITION_ROWS, PlacesPartitions, StageJob, TaskBody
from .layout import ChunkPlace
from .opened_source import OpenedSource
from .recipes import ChunkRecipe, encode_rows, numeric_rows

__all__ = ["PartitionChunk", "SparkRows"]

_NUMERIC = {"ByteType", "ShortType", "IntegerType", "LongType", "FloatType", "DoubleType", "DecimalType",
            "BooleanType"}


@attrs.frozen(kw_only=True)
class PartitionChunk(ChunkRecipe):
    """A chunk that is rows ``[offset, stop_offset)`` of one partition of the engine's collection."""

    label: str = "partition"

    @property
    def where(self) -> str:
        """The partition, in words."""
        return f"{self.label} {self.part}"

    def rows(self) -> Any:
        """Not readable alone: the engine holding the partition builds the chunk (``encode_rows``)."""
        raise RuntimeError(f"{self.where} is built by the engine that holds it, not read on its own")


def partition_recipes(places: Sequence[ChunkPlace], encoder: Any, label: str) -> list[PartitionChunk]:
    """A :class:`PartitionChunk` per chunk place."""
    return [PartitionChunk(chunk_id=p.chunk_id, start=p.start, stop=p.stop, part=p.part, offset=p.offset,
                           stop_offset=p.stop_offset, encoder=encoder, label=label) for p in places]


def _row_reader(schema: Any) -> Callable[[list[Any]], Any]:
    """How a DataFrame partition's ``Row``s become rows: numeric columns, or one vector / array column."""
    fields = list(schema.fields)
    kinds = [type(f.dataType).__name__ for f in fields]
    if len(fields) == 1 and kinds[0] == "VectorUDT":
        return lambda rows: np.stack([r[0].toArray() for r in rows]) if rows else np.empty((0, 0))
    if len(fields) == 1 and kinds[0] == "ArrayType":
        return lambda rows: np.asarray([list(r[0]) for r in rows])
    bad = [f"{f.name} ({k})" for f, k in zip(fields, kinds) if k not in _NUMERIC]
    if bad or not fields:
        raise ValueError(f"a DataFrame for EM holds numeric columns, or one vector / array column; "
                         f"{', '.join(bad) or 'no columns'} cannot be rows: select the numeric columns first "
                         "(df.select(...))")
    if len(fields) == 1:
        return lambda rows: np.asarray([r[0] for r in rows])
    return lambda rows: np.asarray([tuple(r) for r in rows])


_ARROW_INTEGER = {"ByteType", "ShortType", "IntegerType", "LongType"}
_ARROW_FLOAT = {"FloatType", "DoubleType"}


def _batch_block(batch: Any, names: Sequence[str], dtype: Any) -> Any:
    """One Arrow batch of the numeric columns ``names`` as one numpy block of ``dtype`` (int64, or float64 when any
    column is floating: the dtype ``np.asarray`` gives the ``Row`` path's tuples); a null is refused, naming its
    column."""
    columns = []
    for name, column in zip(names, batch.columns):
        if column.null_count:
            raise ValueError(f"DataFrame column {name!r} holds {column.null_count} null(s) in a batch: EM "
                             "rows are numbers; drop or fill them first (df.na.drop() / df.na.fill(...))")
        columns.append(column.to_numpy(zero_copy_only=False).astype(dtype, copy=False))
    return columns[0] if len(columns) == 1 else np.column_stack(columns)


def _arrow_blocks(names: Sequence[str], dtype: Any) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """What ``mapInArrow`` runs on each partition: every non-empty Arrow batch as one pickled numpy block
    (:func:`_batch_block`), in order."""
    def blocks(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            if batch.num_rows:
                yield pa.RecordBatch.from_pydict({"block": [pickle.dumps(_batch_block(batch, names, dtype),
                                                                         protocol=5)]})

    return blocks


def _block_of(row: Any) -> Any:
    return pickle.loads(row[0])


def _stacked(blocks: list[Any]) -> Any:
    """A partition's numpy blocks as one array (its rows, in order)."""
    return np.concatenate(blocks) if blocks else np.empty((0,))


def _arrow_columns(frame: Any) -> tuple[list[str], Any] | None:
    """``frame``'s column names and the dtype of its rows (int64, or float64 when any column is floating), when every
    column is a plain integer or floating column and pyarrow is installed (its rows are read through Arrow); None
    otherwise (the ``Row`` path reads it)."""
    fields = list(frame.schema.fields)
    kinds = [type(f.dataType).__name__ for f in fields]
    if not fields or any(k not in _ARROW_INTEGER | _ARROW_FLOAT for k in kinds):
        return None
    try:
        import pyarrow  # noqa: F401 - mapInArrow needs it on the driver and the executors
    except ImportError:
        return None
    return [f.name for f in fields], np.float64 if any(k in _ARROW_FLOAT for k in kinds) else np.int64


def _arrow_rows(frame: Any, columns: tuple[list[str], Any]) -> Any:
    """``frame``'s rows as an RDD of numpy blocks (same partitions, in order), read through Arrow."""
    blocks = frame.mapInArrow(_arrow_blocks(*columns), "block binary")
    return blocks.rdd.map(_block_of, preservesPartitioning=True)


def _arrow_stage(frame: Any, columns: tuple[list[str], Any]) -> StageJob | None:
    """A serving stage that reads ``frame``'s Arrow batches in its tasks themselves (``mapInArrow`` in barrier mode):
    each task's one record its partition's rows, the same array :func:`_arrow_rows` stacks, without the round trip of
    pickled blocks through the JVM and back (half the reading time of a Parquet table here). None where this pyspark
    has no barrier ``mapInArrow`` (before 3.5): the stage is then a barrier over :func:`_arrow_rows`."""
    if "barrier" not in inspect.signature(frame.mapInArrow).parameters:
        return None
    names, dtype = columns

    def job(body: TaskBody) -> Any:
        def task(batches: Iterator[Any]) -> Iterator[Any]:
            rows = _stacked([_batch_block(b, names, dtype) for b in batches if b.num_rows])
            return body(iter([rows]))

        return frame.mapInArrow(task, "served long", barrier=True)

    return job


def _encoder_job(by_part: dict[int, list[PartitionChunk]],
                 part_rows: Sequence[int]) -> Callable[[int, Iterator[Any]], Iterator[Any]]:
    """The function each partition of the cached rows (``_raw_job``) runs once: its rows checked, cut and encoded;
    the rows themselves first, as the :data:`PARTITION_ROWS` record, cached with the chunks (the audit's reads)."""
    def encode(index: int, held: Iterator[Any]) -> Iterator[Any]:
        for rows in held:  # the partition's rows, read once
            _same_count(part_rows, index, rows)
            yield PARTITION_ROWS, rows
            for recipe in by_part.get(index, []):
                yield recipe.chunk_id, encode_rows(recipe, rows[recipe.offset:recipe.stop_offset])

    return encode


def _raw_job(read: Callable[[list[Any]], Any]) -> Callable[[int, Iterator[Any]], Iterator[Any]]:
    """The function each partition runs once, when the source is opened: its rows read and kept whole (cached: they
    are counted, the chunks encoded from them and the audit's references sliced from them)."""
    def raw(index: int, records: Iterator[Any]) -> Iterator[Any]:
        yield read(list(records))

    return raw


def _same_count(part_rows: Sequence[int], index: int, rows: Any) -> None:
    """Refuse a partition whose rows Spark computed again (a lost cache) and found a different number of."""
    if len(rows) != part_rows[index]:
        raise ValueError(f"RDD partition {index} held {part_rows[index]} rows when counted and {len(rows)} now: "
                         "the data is not the same on every evaluation; cache it (rdd.cache() / df.cache()) first")


def _slices_job(wanted: dict[int, list[tuple[int, int, int]]],
                part_rows: Sequence[int]) -> Callable[[int, Iterator[Any]], Iterator[Any]]:
    """The function each cached partition runs for one pass's references: ``(k, rows[lo:hi])`` for each audited
    chunk ``k`` it holds; the others nothing."""
    def slices(index: int, held: Iterator[Any]) -> Iterator[Any]:
        asks = wanted.get(index, [])
        for found in held:  # read to its end: a Python worker that left input unread is not reused (a cold start)
            if asks:
                _same_count(part_rows, index, found)
            for k, lo, hi in asks:
                yield k, (np.array(found[lo:hi]) if isinstance(found, np.ndarray) else found[lo:hi])

    return slices


def _as_is(records: Iterator[Any]) -> Iterator[Any]:
    return records


def _placed_rows(records: Iterator[Any]) -> Iterator[Any]:
    """A placed partition's rows: its :data:`PARTITION_ROWS` record (the chunks' records read past, to the end)."""
    return (record for key, record in records if key == PARTITION_ROWS)


def _encode_held(held: dict[int, Any], ask: tuple[int, list[PartitionChunk], Sequence[int]]) -> list[int]:
    """In the task holding partition ``ask[0]``'s rows (``SparkRunner.place_held``): its chunks encoded and kept with
    the rows, as ``_encoder_job`` encodes them for the cache; the chunk ids added."""
    index, recipes, part_rows = ask
    built = dict(_encoder_job({index: recipes}, part_rows)(index, iter([held[PARTITION_ROWS]])))
    built.pop(PARTITION_ROWS, None)
    held.update(built)
    return sorted(built)


def _held_slices(rows: Any, asks: list[tuple[int, int, int]]) -> list[tuple[int, Any]]:
    """``(k, rows[lo:hi])`` for each ask of one partition, run by the task that holds its rows (served reads)."""
    return [(k, np.array(rows[lo:hi]) if isinstance(rows, np.ndarray) else rows[lo:hi]) for k, lo, hi in asks]


class SparkRows:
    """An RDD of rows or a DataFrame, to be read by the ``spark`` backend (``as_source`` wraps it)."""

    kind = "spark"

    def __init__(self, data: Any) -> None:
        self.data = data
        self.is_frame = hasattr(data, "sparkSession") and hasattr(data, "schema")

    @property
    def spark_context(self) -> Any:
        """The SparkContext the data belongs to."""
        return self.data.sparkSession.sparkContext if self.is_frame else self.data.context

    def open(self, runner: ChunkRunner) -> OpenedSparkRows:
        """Read every partition's rows once and count them: in the runner's serving tasks, which keep them
        (``open_rows``), else in one Spark job into cached rows (the runner's deadline on it)."""
        if not isinstance(runner, PlacesPartitions):
            raise ValueError(f"a pyspark RDD / DataFrame is read by the spark backend's SparkRunner; "
                             f"{type(runner).__name__} cannot read it")
        columns = _arrow_columns(self.data) if self.is_frame else None
        read: Callable[[list[Any]], Any]
        if columns is not None:
            rdd, read = _arrow_rows(self.data, columns), _stacked
        else:
            rdd = self.data.rdd if self.is_frame else self.data
            read = _row_reader(self.data.schema) if self.is_frame else numeric_rows
        raw = rdd.mapPartitionsWithIndex(_raw_job(read))
        # tasks kept alive read and keep the rows (a DataFrame's Arrow batches read by those tasks), or None
        served = runner.open_rows(raw, _arrow_stage(self.data, columns) if columns is not None else None)
        if served is not None:
            return OpenedSparkRows(rdd, raw, tuple(int(n) for n in served), runner, served=True)
        raw = raw.cache()
        try:
            counts = runner.run_job(raw.map(len).collect, "reading and counting the source's rows")
        except BaseException:
            raw.unpersist()
            raise
        return OpenedSparkRows(rdd, raw, tuple(int(n) for n in counts), runner)


class OpenedSparkRows(OpenedSource):
    """A counted RDD: chunks are built by mapping its partitions (``SparkRunner.place_partitions``)."""

    kind = "spark"
    reads_chunks = True

    def __init__(self, rdd: Any, raw: Any, part_rows: tuple[int, ...], runner: PlacesPartitions,
                 served: bool = False) -> None:
        self.rdd = rdd
        self.served = served
        """Whether the runner's serving tasks read the rows (``open_rows``: then nothing is cached until a job needs
        it) rather than a job into a cache."""
        self.part_rows = part_rows
        self.run_job = runner.run_job
        """The runner's ``run_job``: this source's Spark jobs run under the runner's deadline."""
        self._runner = runner
        self._raw: Any = raw
        """The partitions' rows, read once at ``open`` and cached on the executors until the chunks are encoded from
        them (``place``), which keeps them cached with the chunks instead."""
        self._placed: Any = None
        """The encoded partitions (``place``): each holds its rows as its :data:`PARTITION_ROWS` record."""

    def describe_part(self, part: int) -> str:
        """The partition, in words."""
        return f"RDD partition {part}"

    def recipes(self, places: Sequence[ChunkPlace], encoder: Any) -> list[Any]:
        """A :class:`PartitionChunk` per chunk."""
        return list(partition_recipes(places, encoder, "RDD partition"))

    def chunk_rows(self, place: ChunkPlace) -> Any:
        """The chunk's rows: the one-chunk form of ``chunks_rows`` (only its row range comes here)."""
        return self.chunks_rows([place])[0]

    def chunks_rows(self, places: Sequence[ChunkPlace]) -> list[Any]:
        """The rows of every chunk at ``places``, only the chunks' row ranges sent here: sliced by the tasks serving
        the passes where they hold the rows (``read_held``), else by one Spark job on just their partitions, under
        the runner's deadline. Either slices the partitions' cached rows (read once, when the source was opened),
        not the runner's encoded chunks; a job reads every record it is sent (a PySpark worker that leaves input
        unread is not reused)."""
        if not places:
            return []
        wanted: dict[int, list[tuple[int, int, int]]] = {}
        for k, place in enumerate(places):
            wanted.setdefault(place.part, []).append((k, place.offset, place.stop_offset))
        rows = self._rows()
        served = self._runner.read_held(_held_slices, wanted)
        if served is not None:
            found = {k: sliced for pairs in served.values() for k, sliced in pairs}
        else:
            sliced_rdd = rows.mapPartitionsWithIndex(_slices_job(wanted, self.part_rows))
            found = dict(self.run_job(lambda: self.rdd.context.runJob(sliced_rdd, _as_is, partitions=sorted(wanted)),
                                      "reading the audited chunks' rows", sorted(wanted)))
        missing = [self.describe_part(p.part) for k, p in enumerate(places) if k not in found]
        if missing:
            raise RuntimeError(f"Spark returned no rows for {', '.join(missing)}")
        return [found[k] for k in range(len(places))]

    def close(self) -> None:
        """Drop the cached rows of the audit's reference (those cached with the chunks go with the runner's)."""
        if self._raw is not None:
            self._raw.unpersist()
            self._raw = None
        self._placed = None

    def place(self, runner: ChunkRunner, places: Sequence[ChunkPlace], encoder: Any) -> None:
        """Map every partition to its rows and its encoded chunks: by the serving tasks that read the rows at ``open``
        (``place_held``: they keep both), else by a job, cached on the executors. They are encoded from the rows read
        and counted at ``open`` (``_raw``; a partition Spark had to read again must have its count), which then stay
        with the chunks only: the audit's references slice them there (``chunks_rows``), with no second read of the
        source and no second copy of the rows."""
        assert isinstance(runner, PlacesPartitions)  # opened on it (``open`` refuses any other runner)
        by_part: dict[int, list[PartitionChunk]] = {}
        for recipe in partition_recipes(places, encoder, "RDD partition"):
            by_part.setdefault(recipe.part, []).append(recipe)
        encoded = self._rows().mapPartitionsWithIndex(_encoder_job(by_part, self.part_rows))
        parts = [p.part for p in places]
        asks = {part: (part, recipes, self.part_rows) for part, recipes in by_part.items()}
        if not (self.served and runner.place_held(_encode_held, asks, parts, lambda: encoded)):
            runner.place_partitions(encoded, parts)  # not served (any more): encoded by a job, cached
        self._placed = encoded
        self._raw.unpersist()  # the rows are cached with the chunks now; a lost partition is read again

    def _rows(self) -> Any:
        """The partitions' rows: those cached with the chunks once placed, else those cached at ``open``."""
        if self._raw is None:
            raise RuntimeError("this Spark source is closed: its cached rows are dropped; open it again")
        if self._placed is not None:
            return self._placed.mapPartitions(_placed_rows, preservesPartitioning=True)
        return self._raw
