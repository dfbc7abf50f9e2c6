"""Chunk recipes: what a worker builds an encoded chunk from, so rows never pass through the driver.

A runner is handed, instead of an :class:`~..chunks.EncodedChunk`, a small picklable
:class:`ChunkRecipe` (the chunk's id and row range, where its rows are, the encoder), and the worker
that is to hold the chunk calls :func:`materialize` on it: it reads its rows (a file's row range, a
block of the engine's own store) and encodes them there. Recovery and the SDC audit's recomputation
on another worker send the recipe again, never the rows. Rows are checked where they are read: a
non-finite value in rows an encoder needs as numbers raises ``ValueError`` naming the part and row.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from ..em_pass.chunks import EncodedChunk
from ..em_pass.data_checks import needs_numbers

__all__ = ["ChunkRecipe", "check_finite", "is_recipe", "materialize", "numeric_rows"]


@attrs.frozen(kw_only=True)
class ChunkRecipe:
    """A chunk to be built on a worker: ``chunk_id``, its global rows ``[start, stop)``, its part and the row
    range ``[offset, stop_offset)`` in it, and the ``encoder``. Subclasses say where the rows are (``rows``)."""

    chunk_id: int
    start: int
    stop: int
    part: int
    offset: int
    stop_offset: int
    encoder: Any

    @property
    def where(self) -> str:
        """The part, in words (for errors)."""
        return f"part {self.part}"

    def rows(self) -> Any:
        """The chunk's rows, read where this runs."""
        raise NotImplementedError(f"{type(self).__name__} does not say where its rows are")

    def build(self) -> EncodedChunk:
        """Read the rows and encode them: the chunk, built where this runs."""
        return encode_rows(self, self.rows())


def encode_rows(recipe: ChunkRecipe, rows: Any) -> EncodedChunk:
    """``recipe``'s chunk from its ``rows`` (checked, then encoded)."""
    if needs_numbers(recipe.encoder):
        check_finite(rows, recipe.where, recipe.offset)
    return EncodedChunk(recipe.chunk_id, recipe.start, recipe.stop, recipe.encoder.encode(rows))


def is_recipe(chunk: Any) -> bool:
    """Whether ``chunk`` is a recipe (to be built where it is held) rather than an encoded chunk."""
    return isinstance(chunk, ChunkRecipe)


def materialize(chunk: Any) -> Any:
    """The encoded chunk: ``chunk`` itself, or the chunk its recipe builds here. Runners call this on the
    worker that holds (or borrows) a chunk."""
    return chunk.build() if isinstance(chunk, ChunkRecipe) else chunk


def numeric_rows(rows: list[Any]) -> Any:
    """A partition's rows as one numeric array when they are numbers (the array an in-memory fit gets),
    else the list as given (rows of mixed fields stay rows, as mixle 0.8.2 encodes them)."""
    if not rows:
        return rows
    try:
        arr = np.asarray(rows)
    except (TypeError, ValueError):
        return rows
    return arr if arr.dtype.kind in "biuf" else rows


def check_finite(rows: Any, where: str, first_row: int) -> None:
    """Raise ``ValueError`` naming ``where`` and the row (counted in the part) of the first non-finite value."""
    if not isinstance(rows, np.ndarray) or rows.dtype.kind not in "fc" or rows.size == 0:
        return
    flat = rows.reshape(rows.shape[0], -1)
    bad = ~np.isfinite(flat)
    if bad.any():
        row, column = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(f"{where}, row {first_row + row}, column {column} is {flat[row, column]}: EM needs finite "
                         "values; drop or impute the non-finite rows first")
