"""``rank_local(rows)``: under ``mpiexec`` / ``torchrun``, each rank passes only its own rows.

The parts are the ranks' rows, in rank order: the ranks exchange their row counts (numbers only), every
rank cuts the same layout from them, and each rank encodes and holds the chunks of its own rows. No row
leaves its rank; the model bits are those of any engine fitting the same parts in the same order (the
rows of rank 0, then rank 1, ...), for instance ``files`` of one file per rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..em_pass.chunks import ChunkRunner
from ..em_pass.runner_protocols import RankGather
from .layout import ChunkPlace
from .opened_source import OpenedSource
from .recipes import encode_rows, numeric_rows
from .spark_rows import partition_recipes

__all__ = ["RankLocalRows", "rank_local"]


class RankLocalRows:
    """This rank's own rows (see :func:`rank_local`)."""

    kind = "rank_local"

    def __init__(self, rows: Any) -> None:
        try:
            len(rows)
        except TypeError:
            raise TypeError(f"rank_local() takes this rank's rows (a sized sequence or array), got "
                            f"{type(rows).__name__}") from None
        self.rows = rows

    def __repr__(self) -> str:
        return f"rank_local({len(self.rows)} rows)"

    def open(self, runner: ChunkRunner) -> OpenedRankLocal:
        """Exchange the ranks' row counts (a collective: every rank calls it)."""
        if not isinstance(runner, RankGather):
            raise ValueError("rank_local(rows) is read by the SPMD backends (mpi, torchrun), each rank holding its "
                             f"own rows; the {runner.name} runner has no ranks")
        counts = tuple(int(n) for n in runner.all_gather(len(self.rows)))
        return OpenedRankLocal(self.rows, int(runner.rank), counts)


def rank_local(rows: Any) -> RankLocalRows:
    """This rank's own rows, to pass as ``data=`` on every rank of an ``mpi`` / ``torchrun`` fit.

    Each rank passes only its rows (any count, zero included); nothing is gathered: the ranks share their
    row counts, cut the same chunks, and each encodes and holds the chunks of its own rows.
    """
    return RankLocalRows(rows)


class OpenedRankLocal(OpenedSource):
    """The ranks' row counts known: rank ``r`` holds exactly the chunks of part ``r``."""

    kind = "rank_local"
    reads_chunks = True

    def __init__(self, rows: Any, rank: int, counts: tuple[int, ...]) -> None:
        self.rows = rows
        self.rank = rank
        self.part_rows = counts

    def describe_part(self, part: int) -> str:
        """The rank, in words."""
        return f"rank {part}'s rows"

    def recipes(self, places: Sequence[ChunkPlace], encoder: Any) -> list[Any]:
        """This rank's chunks encoded here (from its own rows), None for the other ranks' chunks."""
        rows = self.rows if not isinstance(self.rows, list) else numeric_rows(self.rows)
        out: list[Any] = []
        for recipe in partition_recipes(places, encoder, "rank"):
            mine = recipe.part == self.rank
            out.append(encode_rows(recipe, rows[recipe.offset:recipe.stop_offset]) if mine else None)
        return out

    def chunk_rows(self, place: ChunkPlace) -> Any:
        """The chunk's rows from this rank's own rows as passed (not the encoded chunks the runner holds); only
        this rank's chunks (part ``rank``) are here."""
        if place.part != self.rank:
            raise RuntimeError(f"chunk {place.chunk_id} is rank {place.part}'s; rank {self.rank} holds only its own "
                               "rows")
        rows = self.rows if not isinstance(self.rows, list) else numeric_rows(self.rows)
        return rows[place.offset:place.stop_offset]

    def chunks_rows(self, places: Sequence[ChunkPlace]) -> list[Any]:
        """The rows of every chunk at ``places`` from this rank's own rows (converted once); all must be its own."""
        others = [p.chunk_id for p in places if p.part != self.rank]
        if others:
            raise RuntimeError(f"chunks {others} are other ranks'; rank {self.rank} holds only its own rows")
        rows = self.rows if not isinstance(self.rows, list) else numeric_rows(self.rows)
        return [rows[p.offset:p.stop_offset] for p in places]

    def owners(self, places: Sequence[ChunkPlace], num_workers: int) -> list[list[int]] | None:
        """Rank ``r`` holds the chunks of part ``r``."""
        blocks: list[list[int]] = [[] for _ in range(num_workers)]
        for p in places:
            blocks[p.part].append(p.chunk_id)
        return blocks
