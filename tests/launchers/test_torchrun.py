"""torchrun: 2 ranks started by `torchrun --standalone --nproc-per-node 2`, each attested from its environment."""

from __future__ import annotations

from typing import Any

import pytest

from ._checks import check_bound_ranks

pytestmark = pytest.mark.slow


def test_torchrun_ranks_are_bound_to_plan_coordinates(torchrun_records: list[dict[str, Any]], tiny_ddp: Any) -> None:
    check_bound_ranks(torchrun_records, tiny_ddp.PLAN, "torchrun")
    for record in torchrun_records:
        # Resources.from_torchrun: one slot per global rank
        assert record["resources"] == ["rank:0", "rank:1"]
        assert record["local_rank"] == record["rank"]
        # the group TorchrunLauncher.worker created is destroyed when the block exits
        assert record["process_group_destroyed"] is True


def test_torchrun_rank_outside_the_plan_fails_before_the_process_group(tmp_path: Any) -> None:
    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import TorchrunLauncher

    from .conftest import JOBS, child_env

    # 2 processes started, but the script binds a world-4 plan: every rank stops at its attestation
    with pytest.raises(RuntimeError, match=r"torchrun exited with status") as info:
        TorchrunLauncher(ParallelPlan(dp_replicate=2)).run(JOBS, "world4", env=child_env(), timeout_s=600)
    assert "Launch exactly plan.world_size=4" in str(info.value)
    assert "a world-4 plan was bound" not in str(info.value)
