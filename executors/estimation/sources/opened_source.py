"""The base of a source opened on a runner: its parts' row counts, its chunks' recipes, where they go."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from ..em_pass.chunks import ChunkRunner, EncodedChunk
from .layout import ChunkPlace
from .recipes import ChunkRecipe, encode_rows

__all__ = ["OpenedSource"]


@attrs.frozen(kw_only=True)
class _FetchedChunk(ChunkRecipe):
    """A chunk whose rows were fetched to this process (``OpenedSource.read_chunk``); ``described`` names its part."""

    described: str

    @property
    def where(self) -> str:
        """The part, in words (for errors)."""
        return self.described


class OpenedSource:
    """A source ready on one runner: ``part_rows`` (rows per part, in order) and its chunk recipes.

    Subclasses give ``recipes`` (one per chunk place), may place chunks their own way (``place``), say which
    worker must hold which chunks (``owners``: None lets the runner choose) and free what they hold
    (``close``). Those that can fetch one chunk's rows into this process through the engine's plain data
    API (``reads_chunks``, ``chunk_rows``) give the SDC audit its reference outside the backend."""

    kind = "source"
    part_rows: tuple[int, ...] = ()
    reads_chunks = False
    """Whether ``chunk_rows`` can fetch one chunk's rows into this process (the audit's reference reads so)."""

    def describe_part(self, part: int) -> str:
        """Part ``part``, in words."""
        return f"part {part}"

    def recipes(self, places: Sequence[ChunkPlace], encoder: Any) -> list[Any]:
        """One recipe per chunk place, built where the chunk is held."""
        raise NotImplementedError

    def place(self, runner: ChunkRunner, places: Sequence[ChunkPlace], encoder: Any) -> None:
        """Put the chunks on ``runner``'s workers (default: the runner scatters the recipes)."""
        runner.scatter(self.recipes(places, encoder))

    def owners(self, places: Sequence[ChunkPlace], num_workers: int) -> list[list[int]] | None:
        """The chunk ids each worker must hold, or None (any worker may build any chunk)."""
        return None

    def prepare_reads(self) -> None:
        """Get ready for the audit's reads (``chunks_rows``) while the fit runs; called once the handle's audit
        reads from this source (default: nothing to prepare)."""

    def chunk_rows(self, place: ChunkPlace) -> Any:
        """The rows of the one chunk at ``place``, fetched into this process by the engine's plain data API (not
        through the backend's runner, E-step or transport)."""
        raise NotImplementedError(f"a {self.kind} source cannot fetch one chunk's rows into this process")

    def chunks_rows(self, places: Sequence[ChunkPlace]) -> list[Any]:
        """The rows of each chunk at ``places`` (in that order), fetched into this process; a source that can
        fetch them in one request of its engine overrides this (default: one ``chunk_rows`` each)."""
        return [self.chunk_rows(place) for place in places]

    def read_chunks(self, places: Sequence[ChunkPlace], encoder: Any) -> list[EncodedChunk]:
        """The chunks at ``places`` built here, their rows fetched together (``chunks_rows``), each checked and
        encoded with ``encoder``: what the SDC audit's reference E-steps for one pass."""
        return [encode_rows(self._fetched(place, encoder), rows)
                for place, rows in zip(places, self.chunks_rows(places), strict=True)]

    def _fetched(self, place: ChunkPlace, encoder: Any) -> ChunkRecipe:
        return _FetchedChunk(chunk_id=place.chunk_id, start=place.start, stop=place.stop, part=place.part,
                             offset=place.offset, stop_offset=place.stop_offset, encoder=encoder,
                             described=self.describe_part(place.part))

    def read_chunk(self, place: ChunkPlace, encoder: Any) -> EncodedChunk:
        """The chunk at ``place`` built here: its rows fetched (``chunk_rows``), checked and encoded with ``encoder``;
        what the SDC audit's reference E-steps, holding one chunk at a time."""
        return encode_rows(self._fetched(place, encoder), self.chunk_rows(place))

    def close(self) -> None:
        """Free what the source holds on the engine (nothing by default)."""
