"""A worker's chunks built from recipes (``files``): its own kept, any other built for one call.

A worker process that is sent every chunk's recipe (small: a file, a row range, the encoder) instead of
the rows builds a chunk the first time it computes it. It keeps the chunks of its *home* (the ones the
driver places on it; the driver says which when that changes) and builds any other chunk -- a lost
worker's, or one the SDC audit recomputes here -- for that call only, so a worker's memory stays its
share of the data.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..sources.recipes import materialize

__all__ = ["RecipeStore", "touch"]


class RecipeStore:
    """Chunk id -> encoded chunk, built from ``recipes`` (list index = chunk id) on first use."""

    def __init__(self, recipes: Sequence[Any]) -> None:
        self.recipes = list(recipes)
        self.home: frozenset[int] = frozenset()
        self.built: dict[int, Any] = {}

    def set_home(self, chunk_ids: Iterable[int]) -> None:
        """The chunks this worker keeps from now on; built chunks outside them are dropped."""
        self.home = frozenset(int(i) for i in chunk_ids)
        for i in [i for i in self.built if i not in self.home]:
            del self.built[i]

    def __getitem__(self, chunk_id: int) -> Any:
        chunk = self.built.get(chunk_id)
        if chunk is None:
            chunk = materialize(self.recipes[chunk_id])
            if chunk_id in self.home:
                self.built[chunk_id] = chunk
        return chunk


def touch(chunk: Any, payload: Any) -> None:
    """A chunk function that only makes sure the chunk is built (the runner's first read of its home)."""
    return None
