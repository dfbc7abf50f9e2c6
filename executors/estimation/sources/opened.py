"""A source opened on a runner: its parts' row counts, and how its chunks reach the workers.

:func:`as_source` recognizes what ``data=`` holds (``files(...)``, ``rank_local(...)``, a pyspark RDD or
DataFrame, a dask Array / DataFrame / Bag, a ``ray.data.Dataset``) without importing any engine;
:func:`check_source` refuses, before any worker starts, a source the backend cannot take, naming the
backends that take it; :func:`open_source` asks the runner's engine for the row counts (the driver
gets numbers, never rows) and returns an :class:`OpenedSource`, which the handle asks for the chunks'
recipes and to place them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..em_pass.chunks import ChunkRunner, EncodedChunk
from .files import FileSource, build_chunks, file_recipes
from .layout import ChunkPlace
from .opened_source import OpenedSource

__all__ = ["SOURCE_BACKENDS", "OpenedSource", "as_source", "check_source", "is_source", "open_source",
           "source_kind"]

_FILE_ENGINES = ("local", "mp", "dask", "ray", "spark", "mpi", "torchrun")

SOURCE_BACKENDS: dict[str, tuple[str, ...]] = {
    "files": _FILE_ENGINES,
    "spark": ("spark",),
    "dask": ("dask",),
    "ray": ("ray",),
    "rank_local": ("mpi", "torchrun"),
}
"""The backends that take each kind of source (by their canonical names)."""

_DESCRIBED = {
    "files": "files(...)",
    "spark": "a pyspark RDD / DataFrame",
    "dask": "a dask collection",
    "ray": "a ray.data.Dataset",
    "rank_local": "rank_local(rows)",
}


def source_kind(data: Any) -> str | None:
    """The kind of source ``data`` is (a key of :data:`SOURCE_BACKENDS`), or None for rows in memory."""
    kind = getattr(data, "kind", None)
    if isinstance(data, FileSource) or (kind == "rank_local" and hasattr(data, "rows")):
        return str(kind)
    module = type(data).__module__ or ""
    if module.startswith("pyspark.") and (hasattr(data, "mapPartitionsWithIndex") or hasattr(data, "sparkSession")):
        return "spark"
    if module.startswith("dask.") and hasattr(data, "__dask_graph__") and hasattr(data, "to_delayed"):
        return "dask"
    if module.startswith("ray.data") and hasattr(data, "materialize"):
        return "ray"
    return None


def is_source(data: Any) -> bool:
    """Whether ``data`` is a source read where it lives rather than rows in this process."""
    return source_kind(data) is not None


def as_source(data: Any) -> Any:
    """The source object of ``data`` (an engine's collection wrapped), or None for rows in memory."""
    kind = source_kind(data)
    if kind in (None, "files", "rank_local"):
        return data if kind is not None else None
    if kind == "spark":
        from .spark_rows import SparkRows

        return SparkRows(data)
    if kind == "dask":
        from .dask_collections import DaskCollection

        return DaskCollection(data)
    from .ray_dataset import RayDataset

    return RayDataset(data)


def check_source(data: Any, backend: str) -> bool:
    """Refuse a source ``backend`` cannot take (``ValueError`` naming the backends that do); True for a source
    it takes, False for rows in memory."""
    kind = source_kind(data)
    if kind is None:
        return False
    takers = SOURCE_BACKENDS[kind]
    if backend not in takers:
        hint = ("pass backend='spark'/'dask'/'ray' as the data's engine, or collect the rows first"
                if kind in ("spark", "dask", "ray") else f"pass backend={takers[0]!r}" if len(takers) == 1
                else "choose one of them")
        raise ValueError(f"data is {_DESCRIBED[kind]}, which backend {backend!r} cannot read where it lives; the "
                         f"backends that take it: {', '.join(takers)} ({hint})")
    return True


class OpenedFiles(OpenedSource):
    """``files(...)``: parts are the files; any worker can read any chunk."""

    kind = "files"
    reads_chunks = True

    def __init__(self, source: FileSource) -> None:
        self.source = source
        self.part_rows = tuple(p.rows for p in source.parts)

    def describe_part(self, part: int) -> str:
        """The file, in words."""
        return f"file {self.source.parts[part].path}"

    def recipes(self, places: Sequence[ChunkPlace], encoder: Any) -> list[Any]:
        """A :class:`~.files.FileChunk` per chunk."""
        return list(file_recipes(self.source, places, encoder))

    def chunk_rows(self, place: ChunkPlace) -> Any:
        """The chunk's rows, read here from its file (its row range only)."""
        return file_recipes(self.source, [place], None)[0].rows()

    def read_chunk(self, place: ChunkPlace, encoder: Any) -> EncodedChunk:
        """The chunk built here from its file, as a worker builds it (:class:`~.files.FileChunk`)."""
        return file_recipes(self.source, [place], encoder)[0].build()

    def read_chunks(self, places: Sequence[ChunkPlace], encoder: Any) -> list[EncodedChunk]:
        """The chunks at ``places`` built here from their files, as workers build them (each file opened once)."""
        return build_chunks(file_recipes(self.source, list(places), encoder))


def open_source(source: Any, runner: ChunkRunner) -> OpenedSource:
    """``source`` opened on ``runner``: the engine counts the rows of each part where they are."""
    if isinstance(source, FileSource):
        return OpenedFiles(source)
    opened = source.open(runner)
    if not isinstance(opened, OpenedSource):  # pragma: no cover - every source here returns one
        raise TypeError(f"{type(source).__name__}.open returned {type(opened).__name__}, not an OpenedSource")
    if sum(opened.part_rows) == 0:
        opened.close()
        raise ValueError(f"data ({_DESCRIBED[opened.kind]}) has no rows; pass at least one row to fit")
    return opened
