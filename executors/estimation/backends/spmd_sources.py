"""Sources on the SPMD engines (``mpi``, ``torchrun``): every rank reads or holds only its own chunks.

Every rank runs the same program and passes the same ``files(...)`` (each rank reads the files of its own
chunks) or its own rows as ``rank_local(rows)`` (rank ``r`` holds the chunks of part ``r``; the ranks share
row counts only). Nothing is gathered to any rank; the chunks and the combine order are those of any
engine fitting the same parts, so the bits are too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..em_pass.chunks import resolve_encoder
from ..sources import is_source, materialize

if TYPE_CHECKING:
    from .mpi import MPIEncodedData

__all__ = ["scatter_source", "source_row_placeholder"]


def source_row_placeholder(data: Any, root_only: bool, backend: str) -> int | None:
    """None for rows in memory (the caller counts them); 0 for a source (the handle counts its parts). A source
    with ``root_only=True`` is refused: its rows are read by every rank, never sent from the root."""
    if not is_source(data):
        return None
    if root_only:
        raise ValueError(f"root_only=True sends the root's rows to the ranks; a source (files(...), rank_local(...)) "
                         f"is read by every {backend} rank itself: pass root_only=False")
    return 0


def scatter_source(handle: MPIEncodedData, estimator: Any, model: Any) -> None:
    """Build this rank's chunks of ``handle``'s source here (its own files' rows, or its own rows) and hand the
    runner this rank's block; a source that says which rank holds which chunk (``rank_local``) sets the blocks."""
    runner, source, places = handle.runner, handle.source, handle.places
    assert source is not None and places is not None  # called for a handle over a source only
    if handle._encoder is None:
        handle._encoder = resolve_encoder(estimator, model)
    recipes = source.recipes(places, handle._encoder)
    owners = source.owners(places, runner.size)
    if owners is not None:
        runner.blocks = owners
    mine = set(runner.owned_chunk_ids(len(recipes)))
    runner.scatter([materialize(r) if i in mine else None for i, r in enumerate(recipes)])
