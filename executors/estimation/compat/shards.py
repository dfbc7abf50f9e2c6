"""mixle-shaped shards of our plans and back: PlacementShard <-> RowShard, and ModelShard <- ComponentShard.

mixle 0.8.2 describes a placement as ``PlacementShard`` rows on ``DeviceSpec`` objects and a model split
as ``ModelShard`` components; our :class:`Placement` holds ``RowShard`` rows named by device and aligned to
whole chunks (what the ``mp`` and ``local`` handles consume through ``placement=``). These functions
translate: a plan read as mixle's shards, and edited mixle shards turned into a Placement a handle runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from ....contracts.placement import (
    ModelShard,
    ModelShardingPlan,
    Placement,
    PlacementShard,
    RowShard,
)
from ....contracts.resources import DeviceSpec, Resources
from ..em_pass.chunks import chunk_bounds

__all__ = ["ModelShard", "PlacementShard", "model_shards", "placement_from_shards", "placement_shards"]


def _device(resources: Resources, name: str) -> DeviceSpec:
    for device in resources.devices:
        if device.name == name:
            return device
    raise ValueError(f"the plan places work on {name!r}, which is not one of the resources "
                     f"{[d.name for d in resources.devices]}; pass the Resources the plan was made with")


def placement_shards(placement: Placement, resources: Resources) -> tuple[PlacementShard, ...]:
    """The placement as mixle's shards: encoded bytes = rows x bytes per row, the rest of the resident bytes
    (model copy and E-step working memory) as transient bytes, one sub-chunk per whole chunk."""
    out = []
    for shard in placement.shards:
        encoded = (shard.stop - shard.start) * placement.bytes_per_row
        out.append(PlacementShard(_device(resources, shard.device), shard.start, shard.stop,
                                  max(1, shard.last_chunk - shard.first_chunk), encoded,
                                  max(0, shard.resident_bytes - encoded)))
    return tuple(out)


def _chunk_at(starts: dict[int, int], row: int, num_rows: int, device: str) -> int:
    if row == num_rows:
        return len(starts)
    if row not in starts:
        below = max((s for s in starts if s < row), default=0)
        above = min((s for s in starts if s > row), default=num_rows)
        raise ValueError(f"shard {device!r} has a boundary at row {row}, inside a chunk; move it to row {below} or "
                         f"{above} (chunk boundaries do not depend on the devices, so every backend gives the same "
                         "bits)")
    return starts[row]


def placement_from_shards(shards: Sequence[PlacementShard], num_chunks: int | None = None, *,
                          bytes_per_row: int = 0, model_bytes: int = 0) -> Placement:
    """A Placement for ``encoded_data(..., placement=)`` from contiguous mixle shards, in row order.

    Shard boundaries must fall on the chunk boundaries of ``chunk_bounds(rows, num_chunks)`` (the chunks
    the handle cuts, given the same ``num_chunks``); a shard that would not fit its device is noted.
    """
    ordered = sorted(shards, key=lambda s: (s.start, s.stop))
    if not ordered or any(not isinstance(s, PlacementShard) for s in ordered):
        raise TypeError("placement_from_shards takes a non-empty sequence of PlacementShard")
    cursor = 0
    for s in ordered:
        if s.start != cursor:
            raise ValueError(f"the shards leave a {'gap' if s.start > cursor else 'overlap'} at row {cursor}; "
                             "shards must cover rows 0..n contiguously")
        cursor = s.stop
    bounds = chunk_bounds(cursor, num_chunks=num_chunks) if num_chunks else chunk_bounds(cursor)
    starts = {a: i for i, (a, _) in enumerate(bounds)}
    rows, notes, fits = [], [], True
    for s in ordered:
        first = _chunk_at(starts, s.start, cursor, s.device.name)
        last = _chunk_at(starts, s.stop, cursor, s.device.name)
        if s.device.memory_bytes is not None and s.total_bytes > s.device.memory_bytes:
            fits = False
            notes.append(f"{s.device.name}: needs {s.total_bytes} bytes resident, has {s.device.memory_bytes}")
        rows.append(RowShard(s.device.name, s.start, s.stop, first, last, s.total_bytes))
    return Placement(cursor, len(bounds), bytes_per_row, model_bytes, tuple(rows), fits, tuple(notes))


def model_shards(plan: ModelShardingPlan, resources: Resources, *,
                 statistic_bytes_per_component: int = 0) -> tuple[ModelShard, ...]:
    """The component plan as mixle's model shards (components with no rows of the plan are left out)."""
    if isinstance(statistic_bytes_per_component, bool) or statistic_bytes_per_component < 0:
        raise ValueError(f"statistic_bytes_per_component must be an int >= 0, got {statistic_bytes_per_component!r}")
    return tuple(
        ModelShard(_device(resources, s.device), s.start, s.stop, s.resident_bytes,
                   (s.stop - s.start) * int(statistic_bytes_per_component))
        for s in plan.shards if s.stop > s.start)
