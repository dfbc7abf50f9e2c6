"""The planner's ``Placement`` applied by a handle: its shards' chunks go to the runner's workers.

``encoded_data(..., placement=plan(data, resources=...))`` cuts the data into the plan's chunks and
gives worker ``w`` the chunks of shard ``w`` (rows by the devices' throughput), on runners that can
aim chunks at workers (``assign_chunks``: ``mp`` and ``local``). Placement never changes the bits:
statistics are combined in chunk order wherever they were computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ....contracts.placement import Placement
from ..em_pass.chunks import ChunkRunner
from ..em_pass.runner_protocols import AssignsChunks

__all__ = ["check_placement"]


def check_placement(placement: Any, num_rows: int, bounds: Sequence[tuple[int, int]],
                    runner: ChunkRunner) -> Placement | None:
    """``placement`` checked against the data and the runner (None passes); a mismatch raises ``ValueError``."""
    if placement is None:
        return None
    if not isinstance(placement, Placement):
        raise TypeError(f"placement= takes the Placement of planner.plan(...), got {type(placement).__name__}")
    if placement.num_rows != num_rows:
        raise ValueError(f"the placement was planned for {placement.num_rows} rows but the data has {num_rows}; "
                         "plan again with plan(data, ...)")
    if placement.num_chunks != len(bounds):
        raise ValueError(f"the placement cuts the data into {placement.num_chunks} chunks but this handle has "
                         f"{len(bounds)}; drop num_chunks=/chunk_size= or plan with the same num_chunks")
    for s in placement.shards:
        rows = (bounds[s.first_chunk][0], bounds[s.last_chunk - 1][1]) if s.last_chunk > s.first_chunk else None
        if rows is not None and rows != (s.start, s.stop):
            raise ValueError(f"placement shard {s.device!r} says rows {s.start}..{s.stop} for chunks "
                             f"{s.first_chunk}..{s.last_chunk - 1}, which hold rows {rows[0]}..{rows[1]}")
    assigns = isinstance(runner, AssignsChunks)
    if not assigns:
        raise ValueError(f"the {runner.name!r} backend cannot send chunks to workers by a plan; use backend='mp' or "
                         "'local' with placement=, or drop placement=")
    if len(placement.shards) != runner.num_workers:
        raise ValueError(f"the placement has {len(placement.shards)} device shard(s) but the {runner.name} backend "
                         f"has {runner.num_workers} worker(s); pass num_workers={len(placement.shards)}")
    return placement
