"""Planner: placement by throughput, memory counted per device, model sharding decisions."""

from __future__ import annotations

import numpy as np
import pytest

from mixle_parallel.contracts import DeviceSpec, Placement, Resources, from_json, to_json
from mixle_parallel.executors.estimation import (
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    UnrealizedModelPlacementError,
    auto_parallel_estimator,
    model_sharding_plan,
    plan,
)


def _mixture(k):
    return MixtureDistribution([GaussianDistribution(i, 1.0) for i in range(k)], np.full(k, 1.0 / k))


def test_one_million_rows_k8_on_two_cpus_is_placed_by_rows_and_decided_as_mixle_does():
    est = MixtureEstimator([GaussianEstimator()] * 8)
    resources = Resources.local(2, memory_bytes=4 * 2**30)
    # mixle 0.8.2's rule (issue 26): 8 components >= 2 x 2 devices, so the decision cuts the model
    with pytest.raises(UnrealizedModelPlacementError):
        auto_parallel_estimator(est, _mixture(8), resources, n_data=1_000_000)
    chosen, decision = auto_parallel_estimator(est, _mixture(3), resources, n_data=1_000_000)
    assert chosen is est and not decision.is_model_parallel
    p = plan(np.zeros(1_000_000), model=_mixture(8), estimator=est, resources=resources)
    assert p.fits and [s.stop - s.start for s in p.shards] == [500_000, 500_000]
    assert from_json(to_json(p), Placement) == p


def test_rows_follow_throughput_and_memory_counts_everything_resident():
    est = GaussianEstimator()
    fast = Resources((DeviceSpec("a", throughput=3.0), DeviceSpec("b", throughput=1.0)))
    p = plan(np.zeros(100_000), estimator=est, resources=fast, num_chunks=8)
    assert [(s.first_chunk, s.last_chunk) for s in p.shards] == [(0, 6), (6, 8)]
    # 80 kB of data per device would fit a 100 kB cap shard by shard, but not with the model and
    # working memory resident as well: the cap counts everything on the device.
    capped = Resources((DeviceSpec("a", memory_bytes=400_000), DeviceSpec("b", memory_bytes=410_000)))
    q = plan(np.zeros(100_000), model=_mixture(8), estimator=MixtureEstimator([est] * 8),
             resources=capped, num_chunks=2)
    assert not q.fits and any("needs" in n for n in q.notes)


def test_a_model_too_big_for_a_device_raises_with_the_plan():
    small = Resources((DeviceSpec("a", memory_bytes=100), DeviceSpec("b", memory_bytes=100)))
    with pytest.raises(UnrealizedModelPlacementError) as info:
        auto_parallel_estimator(MixtureEstimator([GaussianEstimator()] * 8), _mixture(8), small)
    decision = info.value.plan  # mixle's decision object (issue 26)
    assert decision.is_model_parallel and [(c.start, c.stop) for c in decision.cuts] == [(0, 4), (4, 8)]
    replicated = model_sharding_plan(_mixture(8), Resources.local(2))
    assert not replicated.requires_split and all(s.stop == 8 for s in replicated.shards)
