"""The reference audit on SPMD handles (``mpi``, ``torchrun``): every rank draws, judges and raises the same.

Each rank runs the same program, and an audit's replays are collectives every rank must enter together.
So the ranks agree, once, on the secret the audited chunks are drawn with (the root's, all-gathered) and on
whether the reference runs at all (the root holds rows, or every rank reads its own chunks again from its
source: ``files(...)`` from the file, ``rank_local`` from the rows the rank passed); per pass each rank
recomputes the reference of the audited chunks it owns (under ``root_only`` the root recomputes them all,
the only rank with rows), the references are all-gathered, and every rank then compares the same committed
digests with the same references, enters the same replays and raises the same error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .sdc_audit import rows_reference, source_reference

__all__ = ["attach_spmd_reference"]


def attach_spmd_reference(handle: Any) -> None:
    """Agree on the audit's secret and turn the reference on, on every rank (a collective: all ranks call it)."""
    audit, runner = handle._audit, handle.runner
    audit._secret = runner.all_gather(audit._secret)[runner.root]
    from_source = source_reference(handle) if handle._audit_rows is None else None
    found = runner.all_gather((handle._audit_rows is not None, from_source is not None))
    if all(readable for _, readable in found):  # a source every rank reads its own chunks of again
        audit.reference = from_source
        audit.computes, audit.gather = _owned_by(runner, everywhere=True), runner.all_gather
        return
    if not found[runner.root][0]:  # no rows at the root and a source not every rank can read: no reference
        return
    everywhere = all(rows for rows, _ in found)
    audit.reference = rows_reference(handle) if handle._audit_rows is not None else _no_rows
    audit.computes, audit.gather = _owned_by(runner, everywhere), runner.all_gather


def _owned_by(runner: Any, everywhere: bool) -> Callable[[int], bool]:
    """Which audited chunks this rank recomputes: its own (every rank can), else the root all of them."""
    def computes(chunk: int) -> bool:
        return runner.chunk_owners()[chunk] == runner.rank if everywhere else runner.is_root

    return computes


def _no_rows(chunk: int, estimator: Any, model: Any) -> Any:
    """A rank without rows recomputes no reference (``computes`` never names it one)."""
    raise RuntimeError(f"this rank holds no rows to recompute chunk {chunk} from; the root recomputes it")
