"""The base of a source opened on a runner: its parts' row counts, its chunks' recipes, where they go."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .layout import ChunkPlace

__all__ = ["OpenedSource"]


class OpenedSource:
    """A source ready on one runner: ``part_rows`` (rows per part, in order) and its chunk recipes.

    Subclasses give ``recipes`` (one per chunk place), may place chunks their own way (``place``), say which
    worker must hold which chunks (``owners``: None lets the runner choose) and free what they hold
    (``close``)."""

    kind = "source"
    part_rows: tuple[int, ...] = ()

    def describe_part(self, part: int) -> str:
        """Part ``part``, in words."""
        return f"part {part}"

    def recipes(self, places: Sequence[ChunkPlace], encoder: Any) -> list[Any]:
        """One recipe per chunk place, built where the chunk is held."""
        raise NotImplementedError

    def place(self, runner: Any, places: Sequence[ChunkPlace], encoder: Any) -> None:
        """Put the chunks on ``runner``'s workers (default: the runner scatters the recipes)."""
        runner.scatter(self.recipes(places, encoder))

    def owners(self, places: Sequence[ChunkPlace], num_workers: int) -> list[list[int]] | None:
        """The chunk ids each worker must hold, or None (any worker may build any chunk)."""
        return None

    def close(self) -> None:
        """Free what the source holds on the engine (nothing by default)."""
