"""mixle's PlacementShard / ModelShard: our plans read as mixle's shards, and edited shards run as a Placement."""

from __future__ import annotations

import numpy as np
import pytest

from mixle_parallel.contracts import (
    ContractError,
    DeviceCapacityError,
    DeviceSpec,
    ModelShard,
    PlacementShard,
    Resources,
    from_json,
    to_json,
)
from mixle_parallel.executors.estimation import (
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    encoded_data,
    model_sharding_plan,
    model_shards,
    placement_from_shards,
    placement_shards,
    plan,
)


def test_a_plan_reads_as_mixle_shards_and_back(gmm_1d: np.ndarray) -> None:
    res = Resources((DeviceSpec("cpu:0", throughput=1.0), DeviceSpec("cpu:1", throughput=3.0)))
    model = MixtureDistribution([GaussianDistribution(0.0, 1.0)] * 2, [0.5, 0.5])
    placement = plan(gmm_1d, model=model, resources=res, num_chunks=8)
    shards = placement_shards(placement, res)
    assert [s.device for s in shards] == list(res.devices)
    assert sum(s.size for s in shards) == len(gmm_1d) and shards[1].size == 3 * shards[0].size
    for s, row in zip(shards, placement.shards):
        assert s.encoded_bytes == s.size * placement.bytes_per_row and s.total_bytes == row.resident_bytes
    again = placement_from_shards(shards, 8, bytes_per_row=placement.bytes_per_row,
                                  model_bytes=placement.model_bytes)
    assert again == placement
    assert from_json(to_json(shards[0]), PlacementShard) == shards[0]


def test_edited_shards_drive_an_mp_handle_with_the_same_bits(gmm_1d: np.ndarray) -> None:
    res = Resources.local(2)
    est = GaussianEstimator()
    # a hand-edited mixle-style split on the chunk grid of 6: one chunk on cpu:0, five on cpu:1
    edited = placement_from_shards([PlacementShard(res.devices[0], 0, 1000),
                                    PlacementShard(res.devices[1], 1000, 6000)], 6)
    assert [(r.first_chunk, r.last_chunk) for r in edited.shards] == [(0, 1), (1, 6)]
    start = GaussianDistribution(0.1, 2.0)
    with encoded_data(gmm_1d, estimator=est, backend="mp", num_workers=2, placement=edited,
                      admission="unverified", audit=False) as h:
        placed = h.estep(est, start).stats
        assert h.runner.chunk_owners() == [0] + [1] * 5
    with encoded_data(gmm_1d, estimator=est, backend="local", num_chunks=6, admission="unverified",
                      audit=False) as h:
        assert h.estep(est, start).stats == placed  # placement never changes the bits


def test_shards_off_the_chunk_grid_or_not_contiguous_are_refused() -> None:
    dev = DeviceSpec("cpu:0")
    with pytest.raises(ValueError, match="row 1001, inside a chunk; move it to row 1000 or 2000"):
        placement_from_shards([PlacementShard(dev, 0, 1001), PlacementShard(DeviceSpec("cpu:1"), 1001, 6000)], 6)
    with pytest.raises(ValueError, match="gap at row 10"):
        placement_from_shards([PlacementShard(dev, 0, 10), PlacementShard(DeviceSpec("cpu:1"), 12, 20)])
    small = DeviceSpec("cpu:0", memory_bytes=10)
    tight = placement_from_shards([PlacementShard(small, 0, 4, encoded_bytes=32)], 1)
    assert not tight.fits and "needs 32 bytes" in tight.notes[0]


def test_model_shards_follow_the_component_plan() -> None:
    res = Resources((DeviceSpec("cpu:0", memory_bytes=10_000), DeviceSpec("cpu:1", memory_bytes=10_000)))
    model = MixtureDistribution([GaussianDistribution(0.0, 1.0)] * 4, np.full(4, 0.25))
    shards = model_shards(model_sharding_plan(model, res), res, statistic_bytes_per_component=24)
    assert [(s.device.name, s.component_start, s.num_components) for s in shards] == [("cpu:0", 0, 4), ("cpu:1", 0, 4)]
    assert all(s.total_bytes == s.parameter_bytes + 4 * 24 for s in shards)
    with pytest.raises(MemoryError, match="needs 20 bytes but the device holds 10"):
        ModelShard(DeviceSpec("cpu:0", memory_bytes=10), 0, 2, 20)
    with pytest.raises(ValueError, match="must be above component_start"):
        ModelShard(DeviceSpec("cpu:0"), 3, 3)
    document = to_json(ModelShard(DeviceSpec("cpu:0", memory_bytes=100), 0, 2, 20))
    with pytest.raises(ContractError):  # a capacity breach in a document is a contract error, not a crash
        from_json(document.replace('"parameter_bytes": 20', '"parameter_bytes": 200'), ModelShard)
    assert issubclass(DeviceCapacityError, MemoryError) and issubclass(DeviceCapacityError, ValueError)
