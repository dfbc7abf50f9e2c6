"""DataParallelMode: the one place a plan's gradient synchronization is decided."""

from __future__ import annotations

import pytest

from mixle_parallel.contracts import ParallelAxis, ParallelPlan
from mixle_parallel.executors.torch.dp_mode import DataParallelMode

M = DataParallelMode


@pytest.mark.parametrize(
    ("plan", "mode"),
    [
        (ParallelPlan(), M.NONE),
        (ParallelPlan(tp=2), M.NONE),
        (ParallelPlan(dp_replicate=2), M.DDP),
        (ParallelPlan(dp_shard=2), M.FSDP),
        (ParallelPlan(cp=2), M.FSDP),
        (ParallelPlan(dp_shard=2, tp=2), M.FSDP),
        (ParallelPlan(dp_replicate=2, dp_shard=2), M.HSDP),
        (ParallelPlan(dp_replicate=2, tp=2), M.HSDP),
    ],
)
def test_mode_for_plan(plan: ParallelPlan, mode: DataParallelMode) -> None:
    assert DataParallelMode.for_plan(plan) is mode


def test_mode_properties_and_mesh_axes() -> None:
    assert [m for m in M if m.uses_fsdp] == [M.FSDP, M.HSDP]
    assert [m for m in M if m.uses_ddp] == [M.DDP]
    assert [m for m in M if m.replicated_parameters] == [M.NONE, M.DDP]
    assert M.NONE.mesh_axes() == ()
    assert M.DDP.mesh_axes() == (ParallelAxis.DP_REPLICATE,)
    assert M.FSDP.mesh_axes() == (ParallelAxis.DP_SHARD, ParallelAxis.CP)
    assert M.HSDP.mesh_axes() == (ParallelAxis.DP_REPLICATE, ParallelAxis.DP_SHARD)
    # HSDP over replicas only (beside TP) needs a size-1 dp_shard mesh dimension; real HSDP does not
    assert M.HSDP.unit_shard_dim(ParallelPlan(dp_replicate=2, tp=2))
    assert not M.HSDP.unit_shard_dim(ParallelPlan(dp_replicate=2, dp_shard=2))
    assert not M.DDP.unit_shard_dim(ParallelPlan(dp_replicate=2))
