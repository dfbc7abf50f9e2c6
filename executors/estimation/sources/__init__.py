"""Sources: EM data read where it lives, never passed through the driver.

``data=`` of ``fit`` / ``optimize`` / ``encoded_data`` may be, besides rows in memory:

* ``files(paths_or_glob, columns=None)`` -- Parquet / ``.npy`` files, on every multi-worker engine (and
  ``local``), each worker reading its own chunks' files or row groups;
* a pyspark RDD of rows or a DataFrame (``spark``); a dask Array / DataFrame / Bag (``dask``); a
  ``ray.data.Dataset`` (``ray``): chunks built by the engine next to its partitions;
* ``rank_local(rows)`` under ``mpiexec`` / ``torchrun`` (``mpi``, ``torchrun``): each rank's own rows.

A source is an ordered list of parts with row counts; chunk identity is (part, row offset)
(:mod:`.layout`), so one logical source gives the same model bits on every engine and worker count.
The driver holds the model, the initialization sample and per-chunk metadata (recipes) only.
"""

from __future__ import annotations

from .files import FileSource, files
from .layout import ChunkPlace, allocate_chunks, source_layout, source_places
from .opened import SOURCE_BACKENDS, OpenedSource, as_source, check_source, is_source, open_source, source_kind
from .rank_local import RankLocalRows, rank_local
from .recipes import ChunkRecipe, is_recipe, materialize

__all__ = [
    "SOURCE_BACKENDS",
    "ChunkPlace",
    "ChunkRecipe",
    "FileSource",
    "OpenedSource",
    "RankLocalRows",
    "allocate_chunks",
    "as_source",
    "check_source",
    "files",
    "is_recipe",
    "is_source",
    "materialize",
    "open_source",
    "rank_local",
    "source_kind",
    "source_layout",
    "source_places",
]
