"""The reference audit on SPMD handles (``mpi``, ``torchrun``): every rank draws, judges and raises the same.

Each rank runs the same program, and an audit's replays are collectives every rank must enter together.
So the ranks agree, per pass, on the fresh entropy the audited chunks are drawn with (the root's, all-gathered
once every group has committed: ``EMAudit.agree``) and, once, on
whether the reference runs at all (the root holds rows, or every rank reads its own chunks again from its
source: ``files(...)`` from the file, ``rank_local`` from the rows the rank passed); per pass each rank
recomputes the reference of the audited chunks it owns (under ``root_only`` the root recomputes them all,
the only rank with rows), the references are all-gathered, and every rank then compares the same committed
digests with the same references, enters the same replays and raises the same error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..em_pass.estep import rows_reference, source_reference
from ..em_pass.runner_protocols import RankCollective

if TYPE_CHECKING:
    from ..sources import ChunkPlace, OpenedSource
    from .sdc_audit import EMAudit

__all__ = ["attach_spmd_reference"]


def attach_spmd_reference(audit: EMAudit, runner: RankCollective, rows: Any, bounds: Sequence[tuple[int, int]],
                          source: OpenedSource | None, places: Sequence[ChunkPlace] | None) -> None:
    """Agree on each pass's draw entropy and turn the reference on, on every rank (a collective: all ranks call
    it). ``rows`` are the rows this rank keeps for the reference (None: none), ``bounds`` the chunks' row
    ranges, ``source`` and ``places`` where a source's chunks are read again."""
    audit.agree = lambda entropy: runner.all_gather(entropy)[runner.root]
    from_source = source_reference(source, places) if rows is None else None
    found = runner.all_gather((rows is not None, from_source is not None))
    if all(readable for _, readable in found):  # a source every rank reads its own chunks of again
        audit.reference = from_source
        audit.computes, audit.gather = _owned_by(runner, everywhere=True), runner.all_gather
        return
    if not found[runner.root][0]:  # no rows at the root and a source not every rank can read: no reference
        return
    everywhere = all(has_rows for has_rows, _ in found)
    audit.reference = rows_reference(rows, bounds) if rows is not None else _no_rows
    audit.computes, audit.gather = _owned_by(runner, everywhere), runner.all_gather


def _owned_by(runner: RankCollective, everywhere: bool) -> Callable[[int], bool]:
    """Which audited chunks this rank recomputes: its own (every rank can), else the root all of them."""
    def computes(chunk: int) -> bool:
        return runner.chunk_owners()[chunk] == runner.rank if everywhere else runner.is_root

    return computes


def _no_rows(chunks: Sequence[int], encoder: Any, estimator: Any, model: Any) -> dict[int, Any]:
    """A rank without rows recomputes no reference (``computes`` never names it one)."""
    if chunks:
        raise RuntimeError(f"this rank holds no rows to recompute chunks {list(chunks)} from; the root recomputes them")
    return {}
